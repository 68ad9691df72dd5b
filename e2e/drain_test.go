//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sinkwire"
)

// Case 1: the USGS file bulk-loaded while three worker processes drain it,
// at 2,000 records/s (a 4.7 s load), SLUICE_E2E_RUNS times (default 10),
// each run into a new sink emulator with its own processes: 20 capacity
// partitions, which split 7, 7 and 6, so that two workers run dry about
// 0.2 s before the third and their capacity must reach it. Every run:
// every record once, no 429, no sliding second over 1.01 × the capacity;
// the sliding 200 ms and the utilization are judged as rateRuns says.
func TestBulkLoadDrainedByThreeWorkers(t *testing.T) {
	const capacity = 2000
	repeatRuns(t, capacity, func(t *testing.T) (sinkwire.Stats, float64) {
		summary := filepath.Join(t.TempDir(), "summary.json")
		e, st, utilization := drainUSGS(t, capacity, 20, 3, "--summary-json", summary)
		require.EqualValues(t, usgsRecords, readSummaryFile(t, summary).RecordsProduced, "the load produced the whole file")
		e.report(st)
		require.EqualValues(t, usgsRecords, st.Accepted, "every record at the sink")
		require.Zero(t, st.Duplicates, "every record exactly once")
		require.Zero(t, st.Throttled)
		return st, utilization
	})
}

// rateRuns judges the runs of a rate case at the sink. Every run: no
// sliding second over 1.01 × capacity (the promise), the busiest sliding
// 200 ms from a second after the first accept at most 1.1 slices of the
// pool, and a utilization (the ideal time over the span from the first
// accept to the last, the load's edges included) of at least 0.95. The
// log splits each run's lost time into its head, middle and tail
// (lostTime) and counts the runs at utilization ≥ 0.98, the edges target
// (docs/performance.md), with their median. That target is measured here,
// not tested: a stall of the shared machine while the broker stores the
// file costs runs their edges, a case's median run included. It is held
// on virtual time by worker.TestSinkSideSecondHoldsWithSeveralWorkers.
type rateRuns struct {
	capacity                      float64
	seconds, slices, utilizations []float64
	edges                         []float64 // head + tail, in seconds
}

// Targets of every run of rateRuns, and the utilization counted in the
// log as the edges target.
const (
	targetSlices, targetUtilization = 1.1, 0.95
	edgesUtilization                = 0.98
)

// repeatRuns runs one run of a rate case at capacity records/s
// SLUICE_E2E_RUNS times (default 10), each a subtest, so that the
// processes a run started stop before the next starts (kept to the
// case's end, a tenth run shared the machine with 18 idle ones); it adds
// each run's sink statistics and utilization and then logs them all.
func repeatRuns(t *testing.T, capacity float64, run func(t *testing.T) (sinkwire.Stats, float64)) {
	t.Helper()
	runs := rateRuns{capacity: capacity}
	for i := range e2eRuns(t, 10) {
		t.Run(fmt.Sprintf("run %d", i+1), func(t *testing.T) {
			st, utilization := run(t)
			runs.add(t, st, utilization)
		})
	}
	runs.log(t)
}

// add logs and notes one run's sink statistics and its utilization, and
// fails the run when it breaks the promise or a target.
func (r *rateRuns) add(t *testing.T, st sinkwire.Stats, utilization float64) {
	t.Helper()
	inSlices := float64(st.MaxUnits200msSteady) / (r.capacity * 0.2)
	head, middle, tail := lostTime(st, r.capacity)
	t.Logf("busiest second %d, busiest sliding 200 ms after the first second %d (%.3f slices), utilization %.3f (lost to the head %.0f ms, the middle %.0f ms, the tail %.0f ms); per 200 ms %v",
		st.MaxUnits1s, st.MaxUnits200msSteady, inSlices, utilization, 1e3*head, 1e3*middle, 1e3*tail, st.UnitsPer200ms)
	r.seconds = append(r.seconds, float64(st.MaxUnits1s)/r.capacity)
	r.slices = append(r.slices, inSlices)
	r.utilizations = append(r.utilizations, utilization)
	r.edges = append(r.edges, head+tail)
	require.LessOrEqual(t, float64(st.MaxUnits1s), 1.01*r.capacity, "a sliding second over capacity at the sink")
	require.LessOrEqual(t, inSlices, targetSlices, "a sliding 200 ms over %.2f slices at the sink", targetSlices)
	require.GreaterOrEqual(t, utilization, targetUtilization)
}

// log logs every run's figures, their median utilization and how many
// runs met the edges target.
func (r *rateRuns) log(t *testing.T) {
	t.Helper()
	edged := 0
	for _, u := range r.utilizations {
		if u >= edgesUtilization {
			edged++
		}
	}
	median := medianOf(r.utilizations)
	t.Logf("%d runs: busiest second ÷ capacity %.3f, busiest sliding 200 ms ÷ slice %.3f, utilization %.3f (median %.3f), head + tail %.3f s; %d at utilization ≥ %.2f",
		len(r.slices), r.seconds, r.slices, r.utilizations, median, r.edges, edged, edgesUtilization)
}

// medianOf is the median of xs, the mean of the middle two for an even
// count; 0 for none.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

// lostTime splits a run's time at the sink beyond its ideal (its units
// at capacity units/s), in seconds: the head is from the first charge to
// the first 200 ms bucket after it that holds at least 0.9 slices, the
// tail from the end of the last such bucket to the last charge, each
// less its units' ideal time, and the middle the rest. A series with no
// such bucket is all middle.
func lostTime(st sinkwire.Stats, capacity float64) (head, middle, tail float64) {
	const bucket = 200 * time.Millisecond
	u := st.UnitsPer200ms
	total := st.LastChargeAt.Sub(st.FirstChargeAt).Seconds() - float64(st.UnitsCharged)/capacity
	first := int(st.FirstChargeAt.Sub(st.SeriesStart) / bucket)
	if first < 0 || first >= len(u) {
		return 0, total, 0
	}
	steady := func(i int) bool { return float64(u[i]) >= 0.9*capacity*bucket.Seconds() }
	h, k := first+1, len(u)-2
	for h < len(u) && !steady(h) {
		h++
	}
	for k > first && !steady(k) {
		k--
	}
	if h > k {
		return 0, total, 0
	}
	sum := func(xs []int64) (n int64) {
		for _, x := range xs {
			n += x
		}
		return n
	}
	at := func(i int) time.Time { return st.SeriesStart.Add(time.Duration(i) * bucket) }
	head = at(h).Sub(st.FirstChargeAt).Seconds() - float64(sum(u[first:h]))/capacity
	tail = st.LastChargeAt.Sub(at(k+1)).Seconds() - float64(sum(u[k+1:]))/capacity
	return head, total - head - tail, tail
}

// e2eRuns is how many times a rate case runs: SLUICE_E2E_RUNS, or def.
func e2eRuns(t *testing.T, def int) int {
	t.Helper()
	runs, err := strconv.Atoi(cmp.Or(os.Getenv("SLUICE_E2E_RUNS"), strconv.Itoa(def)))
	require.NoError(t, err, "SLUICE_E2E_RUNS")
	return runs
}

// drainUSGS starts workers worker processes on a new env of capacity
// records/s in partitions partitions, produces the USGS file with
// `bulk-load --workers 0` and the extra flags, and returns the env, the
// sink's stats once it has accepted every record, and the utilization at
// the sink: the ideal time over the span from its first accept to its
// last. The env's processes stop when t ends.
func drainUSGS(t *testing.T, capacity, partitions, workers int, extra ...string) (*env, sinkwire.Stats, float64) {
	t.Helper()
	e := newEnv(t, capacity, partitions, 15*time.Second)
	for i := range workers {
		e.worker(fmt.Sprintf("w%d", i+1))
	}
	e.awaitGroup(workers)
	began := time.Now()
	code, out := e.run(3*time.Minute, append(append(append([]string{"bulk-load", "--workers", "0"}, e.common()...), extra...), usgs)...)
	require.Equal(t, 0, code, out)
	st := e.awaitAccepted(usgsRecords, time.Minute)
	// Where a run's time went: production is not what is judged, but a
	// slow one starves the workers' first slices.
	_, produced, _ := strings.Cut(out, "produced ")
	produced, _, _ = strings.Cut(produced, "\n")
	t.Logf("bulk-load began %.3f s before the first accept; produced %s", st.FirstChargeAt.Sub(began).Seconds(), strings.TrimSpace(produced))
	return e, st, float64(usgsRecords) / float64(capacity) / st.LastChargeAt.Sub(st.FirstChargeAt).Seconds()
}

// Case 6: records produced by an independent client (kcat) are ingested like
// sluice's own: the worker derives each ID from the id field.
func TestRecordsFromKcatAreIngested(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	require.NoError(t, err, "kcat is needed: apt-get install kcat (make e2e installs it)")
	e := newEnv(t, 1000, 10, 15*time.Second)
	e.worker("w1")
	e.awaitGroup(1)

	const n = 500
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, "k%d\t{\"id\":\"kcat-%d\",\"mag\":%d.5}\n", i, i, i%7)
	}
	cmd := exec.Command(kcat, "-P", "-b", brokers, "-t", e.name, "-K", "\t")
	cmd.Stdin = strings.NewReader(lines.String())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))

	st := e.awaitAccepted(n, 30*time.Second)
	e.report(st)
	require.EqualValues(t, n, st.Accepted)
	require.Zero(t, st.Duplicates)
}

// Case 7: a record the sink refuses (400) lands in <topic>.dlq with its
// reason; its neighbours are delivered.
func TestPoisonRecordIsDeadLettered(t *testing.T) {
	e := newEnv(t, 1000, 10, 15*time.Second, "--required-fields", "time")
	e.worker("w1")
	e.awaitGroup(1)

	path := filepath.Join(t.TempDir(), "poison.ndjson")
	var lines strings.Builder
	for i := range 100 {
		if i == 50 {
			lines.WriteString(`{"id":"poison-50","mag":"4.2"}` + "\n") // no time: the sink answers 400
			continue
		}
		fmt.Fprintf(&lines, `{"id":"ok-%d","time":"2025-06-05T09:16:0%d.000Z"}`+"\n", i, i%10)
	}
	require.NoError(t, writeFile(path, lines.String()))
	code, out := e.run(time.Minute, "produce", "--brokers", brokers, "--topic", e.name, "--id-field", "id", path)
	require.Equal(t, 0, code, out)

	st := e.awaitAccepted(99, 30*time.Second)
	e.report(st)
	require.EqualValues(t, 99, st.Accepted, "the neighbours are delivered")
	require.EqualValues(t, 1, st.Rejected)

	msg := readOne(t, e.name+".dlq")
	headers := map[string]string{}
	for _, h := range msg.Headers {
		headers[h.Key] = string(h.Value)
	}
	t.Logf("dead letter: value %s, headers %v", msg.Value, headers)
	require.JSONEq(t, `{"id":"poison-50","mag":"4.2"}`, string(msg.Value))
	require.Equal(t, "poison-50", headers[queue.HeaderID])
	require.Contains(t, headers[queue.HeaderReason], "time")
	require.Contains(t, headers[queue.HeaderSource], e.name+"/")
}

// readOne reads the first message of a single-partition topic.
func readOne(t *testing.T, topic string) kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{brokers}, Topic: topic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	msg, err := r.ReadMessage(ctx)
	require.NoError(t, err, "no dead letter in %s", topic)
	return msg
}

// The rate promise judged where the user judges it, with default flags:
// two and three worker processes drain the USGS file (produced by
// `bulk-load --workers 0`) from real Kafka under real Redis leases into a
// sink emulator of 2,000 records/s (a 4.7 s load), SLUICE_E2E_RUNS times
// each (default 10), every record once in every run; the sliding second,
// the sliding 200 ms and the utilization are judged as rateRuns says.
func TestSinkSideSecondHoldsWithDefaults(t *testing.T) {
	const capacity = 2000
	for _, workers := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d workers", workers), func(t *testing.T) {
			repeatRuns(t, capacity, func(t *testing.T) (sinkwire.Stats, float64) {
				// 20 capacity partitions for two workers, 24 for three: a pool
				// that divides evenly among the workers, as docs/production.md advises.
				_, st, utilization := drainUSGS(t, capacity, map[int]int{2: 20, 3: 24}[workers], workers)
				require.EqualValues(t, usgsRecords, st.Accepted)
				require.Zero(t, st.Duplicates)
				return st, utilization
			})
		})
	}
}

// Costly records hold the pool's second: records of 500 RU into a pool of
// 1,000 RU/s (two fit in a second) drained by four worker processes under
// real Redis leases, the emulator charging 500 RU a record whatever the
// workers claim. A worker sends such a record only once it holds the
// leased credit for it, so no sliding second at the sink holds a third
// record (1,500 RU), however many workers each hold less than one record's
// cost. Utilization stays ≥ 0.93: the ideal is 19 s, and a worker whose
// backlog empties hands the next worker in line the credit its account
// left (pacing.Pacer.HandOver), so a hand-over of the turn (three or four
// in a load) costs about the tenth of a second the next worker takes to
// lock the partitions: 19.03-19.62 s measured (0.969-0.998), where each
// hand-over cost up to a second before (20.0-21.2 s, 0.895-0.949), and the
// floor leaves about 1.4 s for stalls of the machine.
func TestCostlyRecordsHoldThePoolSecond(t *testing.T) {
	const capacity, cost, n, workers = 1000, 500, 40, 4
	e := newEnv(t, capacity, 10, 15*time.Second, "--unit", "cost", "--charge", strconv.Itoa(cost))
	for i := range workers {
		e.worker(fmt.Sprintf("w%d", i+1), "--unit", "cost", "--cost", strconv.Itoa(cost))
	}
	e.awaitGroup(workers)
	e.produce(n) // the first 40 USGS rows

	st := e.awaitAccepted(n, 2*time.Minute)
	e.report(st) // no sliding second over 1.01 × capacity: a third record would be 1.5 ×
	require.EqualValues(t, n, st.Accepted, "every record at the sink")
	require.Zero(t, st.Duplicates)
	require.Zero(t, st.Throttled)
	require.EqualValues(t, n*cost, st.UnitsAccepted, "the emulator charged every record its cost")
	// The shortest span from the first charge to the last that keeps every
	// sliding second within capacity: the first second's worth may land
	// at once, the rest at the capacity (19 s for 40 records).
	ideal := float64(n*cost-capacity) / capacity
	elapsed := st.LastChargeAt.Sub(st.FirstChargeAt).Seconds()
	utilization := ideal / elapsed
	t.Logf("busiest second %d of %d RU, utilization: ideal %.2f s / elapsed %.2f s = %.3f", st.MaxUnits1s, capacity, ideal, elapsed, utilization)
	require.GreaterOrEqual(t, utilization, 0.93)
}
