package worker_test

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/worker"
)

// Live traffic and a backfill on one sink, as whole workers: a live worker
// in the high class drains a queue fed at a steady rate (like upstream
// producers), a bulk worker in the low class drains a deep backlog, both
// leasing from one pool of 2,000 records/s in 200 partitions of 10.

const (
	classCapacity   = 2000
	classPartitions = 200
)

// feeder appends records to a queue at rate records/s, every 10 ms (or in
// bursts, every period), until stopped; the rate may change while it runs.
type feeder struct {
	q     *memQueue
	rate  atomic.Int64
	added atomic.Int64
	stop  chan struct{}
	done  chan struct{}
}

func feed(q *memQueue, rate int64) *feeder { return feedEvery(q, rate, 10*time.Millisecond) }

func feedEvery(q *memQueue, rate int64, period time.Duration) *feeder {
	f := &feeder{q: q, stop: make(chan struct{}), done: make(chan struct{})}
	every := max(int(period/(10*time.Millisecond)), 1)
	f.rate.Store(rate)
	go func() {
		defer close(f.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		var owed float64
		for step := 0; ; step++ {
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
			owed += float64(f.rate.Load()) / 100
			if step%every != every-1 {
				continue
			}
			n := int(owed)
			owed -= float64(n)
			if n > 0 {
				q.add(records(fmt.Sprintf("live%d", step), n, nil)...)
				f.added.Add(int64(n))
			}
		}
	}()
	return f
}

func (f *feeder) halt() {
	close(f.stop)
	<-f.done
}

// delivered returns the records the worker's pipeline delivered so far.
func delivered(wk *worker.Worker) int64 { return wk.Counters().Totals().Delivered }

// served returns the share of the latencies within limit, and their 99th
// percentile.
func served(latencies []time.Duration, limit time.Duration) (share float64, p99 time.Duration) {
	if len(latencies) == 0 {
		return 0, 0
	}
	sorted := slices.Clone(latencies)
	slices.Sort(sorted)
	n, _ := slices.BinarySearch(sorted, limit+1)
	return float64(n) / float64(len(sorted)), sorted[int(0.99*float64(len(sorted)-1))]
}

// A live worker at 70 % of the pool and a backfill with a backlog: over
// 15 s of steady state the live worker delivers ≥ 0.99 of what arrives
// within a second of its arrival, the backfill gets ≥ 0.95 of the
// remaining 30 %, and no sliding second at the sink holds more than the
// pool. Live records that arrive in bursts, four a second (a producer
// that posts in batches, a fetch that waits for its records), cost the
// backfill more: the arrival rate read over 2 s holds 8 or 9 bursts, and
// partitions move as it wavers. The backfill gets ≥ 0.75 (0.91-0.93 in 6
// runs), short of the steady case's 0.95. A caught-up live worker asks
// for its arrival rate between the bursts; when it asked for nothing
// there, it gave the pool back at every pause and took all of it at every
// burst, and the backfill got 0.008.
func TestLiveTrafficFirstBesideABackfill(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		period      time.Duration // live records arrive every period
		minBackfill float64
	}{
		{"steady", 10 * time.Millisecond, 0.95},
		{"in bursts every 250 ms", 250 * time.Millisecond, 0.75},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			liveTrafficFirst(t, tc.period, tc.minBackfill)
		})
	}
}

func liveTrafficFirst(t *testing.T, period time.Duration, minBackfill float64) {
	synctest.Test(t, func(t *testing.T) {
		w, liveQ, bulkW, live, bulk := liveBesideBackfill(t, "shared")
		const liveRate = classCapacity * 7 / 10
		f := feedEvery(liveQ, liveRate, period)

		time.Sleep(5 * time.Second) // settle
		from, bulkFrom := time.Now(), delivered(bulkW)
		time.Sleep(15 * time.Second)
		to, bulkTo := time.Now(), delivered(bulkW)
		time.Sleep(time.Second) // the window's last arrivals get their second
		f.halt()
		require.NoError(t, live())
		require.NoError(t, bulk())

		share, p99 := served(liveQ.latencies(from, to), time.Second)
		span := to.Sub(from).Seconds()
		bulkShare := float64(bulkTo-bulkFrom) / span / (classCapacity - liveRate)
		most := w.busiest(time.Second, 0)
		t.Logf("over %.0f s: live records delivered within 1 s of arrival %.4f (p99 %v); backfill %.0f records/s = %.4f of the remaining %d; busiest second %d of %d",
			span, share, p99.Round(time.Millisecond), float64(bulkTo-bulkFrom)/span, bulkShare, classCapacity-liveRate, most, classCapacity)
		t.Log("units per second:", w.series(time.Second))
		require.GreaterOrEqual(t, share, 0.99, "the high class is served first")
		require.GreaterOrEqual(t, bulkShare, minBackfill, "the low class gets what the high one leaves")
		require.Zero(t, w.sim.Stats().Throttled, "the strict sink throttled")
		require.LessOrEqual(t, most, int64(classCapacity), "the sink's sliding second")
		require.Empty(t, liveQ.reasons())
	})
}

// Live demand steps from 30 % to 90 % of the pool while a backfill drains
// a backlog: the backfill's leased rate is down to its new share (the
// remaining 10 %) within 1 s of the step, the live worker delivers what
// arrives after it settles within a second of arrival, and no sliding
// second at the sink holds more than the pool, the hand-over included.
// When live demand falls back to 30 %, the backfill leases 65 % of the
// pool again (all but the live share, rounded to partitions, and the
// pacer's allowance) within 1 s.
func TestBackfillYieldsToALiveStep(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		w, liveQ, bulkW, live, bulk := liveBesideBackfill(t, "step")
		f := feed(liveQ, classCapacity*3/10)

		time.Sleep(6 * time.Second)
		before := bulkW.Rate(time.Now())
		f.rate.Store(classCapacity * 9 / 10)
		step := time.Now()
		var down time.Duration
		for down == 0 {
			if bulkW.Rate(time.Now()) <= classCapacity/10 {
				down = time.Since(step)
			}
			require.Less(t, time.Since(step), 5*time.Second, "the backfill did not yield")
			time.Sleep(time.Millisecond)
		}
		stepAt := step.Sub(w.began)
		time.Sleep(4 * time.Second)
		from := time.Now()
		time.Sleep(6 * time.Second)
		to := time.Now()
		time.Sleep(time.Second)
		// Live traffic falls back to 30 %: the backfill has its share again.
		f.rate.Store(classCapacity * 3 / 10)
		fall := time.Now()
		var back time.Duration
		for back == 0 {
			if bulkW.Rate(time.Now()) >= classCapacity*65/100 {
				back = time.Since(fall)
			}
			require.Less(t, time.Since(fall), 5*time.Second, "the backfill did not get its share back")
			time.Sleep(time.Millisecond)
		}
		f.halt()
		require.NoError(t, live())
		require.NoError(t, bulk())

		_, stepP99 := served(liveQ.latencies(step, step.Add(2*time.Second)), time.Second)
		share, p99 := served(liveQ.latencies(from, to), time.Second)
		most := w.busiest(time.Second, 0)
		around := w.busiestBetween(time.Second, stepAt-2*time.Second, stepAt+3*time.Second)
		t.Logf("backfill leased %.0f records/s before the step, down to ≤ %d %v after it; live p99 latency %v in the 2 s after the step; "+
			"after it settled, live records delivered within 1 s %.4f (p99 %v); busiest second %d overall, %d around the step; "+
			"back to ≥ %d records/s %v after live traffic fell to 30 %%",
			before, classCapacity/10, down, stepP99.Round(time.Millisecond), share, p99.Round(time.Millisecond), most, around, classCapacity*65/100, back)
		t.Log("units per 200 ms:", w.series(200*time.Millisecond))
		require.LessOrEqual(t, down, time.Second, "the low class is down to its new share within 1 s")
		require.LessOrEqual(t, back, time.Second, "and has the capacity back within 1 s of a fall")
		require.GreaterOrEqual(t, share, 0.99, "the high class is served")
		require.Zero(t, w.sim.Stats().Throttled, "the strict sink throttled")
		require.LessOrEqual(t, most, int64(classCapacity), "the sink's sliding second, the hand-over included")
	})
}

// A live worker whose requests stall now and then (its process
// descheduled for 250 ms in every 1.3 s, its requests reaching the sink
// at the stall's end) shares the pool with a backfill, its bursts every
// 250 ms moving partitions between them: a worker that gives partitions
// back unlocks them only once the sends it made before it stopped
// counting them have been answered, so its stalled requests never land
// beside its peer's sends on the same capacity; and one that gives them
// back at once keeps its later sends within its new rate. The strict
// sink throttles nothing and no sliding second holds more than the pool.
// Without either rule, 9 of 12 runs drew 4–12 throttled records; with the
// wait for the answers alone, 2 of 12 drew 8 and 55.
func TestHandOverAwaitsAStalledWorkersAnswers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		stalled := func(w *world) *sink.HTTPSink {
			return w.stalledSink(1300*time.Millisecond, 500*time.Millisecond, 250*time.Millisecond)
		}
		w, liveQ, bulkW, live, bulk := liveBesideBackfill(t, "stalled", stalled)
		f := feedEvery(liveQ, classCapacity*7/10, 250*time.Millisecond)
		time.Sleep(30 * time.Second)
		f.halt()
		require.NoError(t, live())
		require.NoError(t, bulk())

		most := w.busiest(time.Second, 0)
		t.Logf("backfill delivered %d records in 30 s; busiest second %d of %d; throttled %d",
			delivered(bulkW), most, classCapacity, w.sim.Stats().Throttled)
		require.Zero(t, w.sim.Stats().Throttled, "the strict sink throttled")
		require.LessOrEqual(t, most, int64(classCapacity), "the sink's sliding second")
		require.Empty(t, liveQ.reasons())
	})
}

// liveBesideBackfill starts, in a new world, a low-class worker with a
// backlog of 40,000 records (bulkW, stopped by bulk) and a high-class
// worker draining liveQ (stopped by live), on one pool of classCapacity
// named name. The live worker sends through liveSink's client of the
// world's sink when it is given.
func liveBesideBackfill(t *testing.T, name string, liveSink ...func(*world) *sink.HTTPSink) (w *world, liveQ *memQueue, bulkW *worker.Worker, live, bulk func() error) {
	t.Helper()
	w = newWorld(t, sinksim.Config{Capacity: classCapacity})
	pool := w.pool(lease.Pool{Name: name, Capacity: classCapacity, Partitions: classPartitions})
	liveQ, bulkQ := &memQueue{}, &memQueue{}
	bulkQ.add(records("bulk", 40_000, nil)...)
	bulk = w.start("bulk", worker.Config{Pool: pool, IDField: "id", Source: bulkQ, Priority: lease.PriorityLow})
	liveCfg := worker.Config{Pool: pool, IDField: "id", Source: liveQ, Priority: lease.PriorityHigh}
	for _, s := range liveSink {
		liveCfg.Sink = s(w)
	}
	live = w.start("live", liveCfg)
	return w, liveQ, w.workers[0], live, bulk
}
