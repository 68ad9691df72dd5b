package worker_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/recordtype"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/worker"
)

// A range-partitioned sink: 10,000 records/s in all, keys cut into
// lexicographic ranges of 2,000 ops/s each, a range hot for a second
// splitting at the median of its recent keys. One worker leases the whole
// 10,000 records/s and writes USGS-shaped records under the sink key
// {time}/{id}, whose time only grows.
const (
	hotCapacity       = 10_000
	hotPartitionLimit = 2_000
)

// quakes returns n USGS-shaped records, oldest first: an event every
// 4.637 s from 2025-05-01, IDs of one network's sequence.
func quakes(n int) []string {
	base := time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC)
	out := make([]string, n)
	for i := range out {
		at := base.Add(time.Duration(i) * 4637 * time.Millisecond)
		out[i] = fmt.Sprintf(`{"time":"%s","id":"nc%08d","mag":%d.%d,"net":"nc"}`,
			at.Format("2006-01-02T15:04:05.000Z"), 75000000+i, i%7, i%10)
	}
	return out
}

// hotRun drains n quakes keyed by strategy into the range-partitioned
// sink with one worker and returns the world and the run's accepted rate
// over its last quarter, in records/s.
func hotRun(t *testing.T, strategy string, n int) (*world, float64) {
	t.Helper()
	w := newWorld(t, sinksim.Config{Capacity: hotCapacity, PartitionLimit: hotPartitionLimit, SplitAfter: time.Second})
	pool := w.pool(lease.Pool{Name: "quakes", Capacity: hotCapacity, Partitions: 20})
	sk, err := recordtype.NewSinkKey("{time}/{id}", strategy)
	require.NoError(t, err)
	w.queue.add(quakes(n)...)
	w.drain(5*time.Minute, w.start("a", worker.Config{Pool: pool, IDField: "id", Processor: sk.Processor()}))

	require.EqualValues(t, n, w.stored(), "every record once")
	require.Empty(t, w.queue.reasons(), "nothing dead-lettered")
	first, last := w.span()
	var tail int64
	from := first + (last-first)*3/4
	w.mu.Lock()
	for _, a := range w.accepts {
		if a.at >= from {
			tail += a.units
		}
	}
	w.mu.Unlock()
	tot := w.workers[0].Counters().Totals()
	st := w.sim.Snapshot(false)
	t.Logf("%s: %d records in %s (utilization %.3f), last quarter %.0f records/s; %d attempts, %d throttled; "+
		"busiest second %d; %d ranges at the sink; %d hot ranges found, %d cuts",
		strategy, n, (last - first).Round(time.Millisecond), float64(n)/hotCapacity/(last-first).Seconds(),
		float64(tail)/(last-from).Seconds(), tot.Attempts, tot.Throttled, w.busiest(time.Second, 0),
		len(st.Partitions), tot.HotRanges, tot.RangeCuts)
	t.Log("records per second:", w.series(time.Second))
	return w, float64(tail) / (last - from).Seconds()
}

// Spread keys: once the sink has split its ranges they take the whole
// capacity, and a 429 from a range that is still hot slows only the
// records headed there, so the worker runs at ≥ 0.9 of the capacity once
// the ranges have split (the last quarter of the run), and no second at
// the sink holds more than the capacity.
func TestSpreadKeysFillTheSplitRanges(t *testing.T) {
	t.Parallel()
	for _, strategy := range []string{"hash-prefix:4", "shard:16"} {
		t.Run(strategy, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				w, tail := hotRun(t, strategy, 100_000)
				require.GreaterOrEqual(t, tail, 0.9*hotCapacity, "the last quarter's rate")
				require.LessOrEqual(t, w.busiest(time.Second, 0), int64(hotCapacity), "the sink's sliding second")
			})
		})
	}
}

// Sequential keys: every new record goes to the range holding the newest
// key, however often it splits, so the worker runs at that one range's
// rate (≥ 0.9 of its 2,000 ops/s once found) with ≤ 1 % of its sends
// refused, holding back a bounded number of records instead of hammering
// the range or cutting its rate in a sawtooth.
func TestSequentialKeysHoldOneRangesLimit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, tail := hotRun(t, "none", 40_000)
		tot := w.workers[0].Counters().Totals()
		require.GreaterOrEqual(t, tail, 0.9*hotPartitionLimit, "one range's rate")
		require.LessOrEqual(t, tot.Throttled, tot.Attempts/100, "≤ 1 % of the sends refused")
		require.LessOrEqual(t, w.busiest(time.Second, 0), int64(hotCapacity), "the sink's sliding second")
	})
}
