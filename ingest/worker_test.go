package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/ingest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSource serves a fixed list of records, then blocks.
type fakeSource struct {
	mu   sync.Mutex
	recs []ingest.Record
	next int
	done map[int64]int // offset → Done calls
}

func newFakeSource(values ...string) *fakeSource {
	s := &fakeSource{done: map[int64]int{}}
	for i, v := range values {
		s.recs = append(s.recs, ingest.Record{Value: []byte(v), Pos: ingest.Position{Topic: "t", Offset: int64(i)}})
	}
	return s
}

func (s *fakeSource) Fetch(ctx context.Context) (ingest.Record, error) {
	s.mu.Lock()
	if s.next < len(s.recs) {
		r := s.recs[s.next]
		s.next++
		s.mu.Unlock()
		return r, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return ingest.Record{}, ctx.Err()
}

func (s *fakeSource) Done(r ingest.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done[r.Pos.Offset]++
}

func (s *fakeSource) doneCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.done)
}

// fakeSink answers by a rule per record ID and remembers what it stored.
type fakeSink struct {
	mu       sync.Mutex
	down     int // the first down writes fail as a whole
	stored   map[string]int
	attempts map[string]int
	answer   func(id string, attempt int) ingest.Result
}

func (s *fakeSink) Write(_ context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down > 0 {
		s.down--
		return nil, errors.New("connection refused")
	}
	out := make([]ingest.Result, len(batch))
	for i, r := range batch {
		s.attempts[r.ID]++
		res := ingest.Result{Outcome: ingest.Delivered}
		if s.answer != nil {
			res = s.answer(r.ID, s.attempts[r.ID])
		}
		if res.Outcome == ingest.Delivered {
			s.stored[r.ID]++
		}
		out[i] = res
	}
	return out, nil
}

type fakeDLQ struct {
	mu      sync.Mutex
	reasons map[string]string
}

func (d *fakeDLQ) DeadLetter(_ context.Context, r ingest.Record, reason string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reasons[r.ID] = reason
	return nil
}

// fakePacer grants a fixed budget every millisecond and records spends.
type fakePacer struct {
	budget int64
	mu     sync.Mutex
	spent  []int64
}

func (p *fakePacer) Next(ctx context.Context, want int64) (int64, error) {
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(time.Millisecond):
	}
	return max(p.budget, want), nil
}

func (p *fakePacer) Spend(u int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.spent = append(p.spent, u)
}

type fakeCapacity struct {
	mu     sync.Mutex
	demand []float64
}

func (c *fakeCapacity) Rate(time.Time) float64            { return 1000 }
func (c *fakeCapacity) Credit(from, to time.Time) float64 { return to.Sub(from).Seconds() * 1000 }
func (c *fakeCapacity) SetDemand(d float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.demand = append(c.demand, d)
}

type fixedRetry struct{ attempts int }

func (r fixedRetry) Backoff(attempt int, retryAfter time.Duration) (time.Duration, bool) {
	return max(retryAfter, time.Millisecond), attempt < r.attempts
}

type rig struct {
	src  *fakeSource
	sink *fakeSink
	dlq  *fakeDLQ
	pace *fakePacer
	capa *fakeCapacity
	w    *ingest.Worker
}

func newRig(t *testing.T, cfg ingest.WorkerConfig, budget int64, values ...string) *rig {
	t.Helper()
	r := &rig{
		src:  newFakeSource(values...),
		sink: &fakeSink{stored: map[string]int{}, attempts: map[string]int{}},
		dlq:  &fakeDLQ{reasons: map[string]string{}},
		pace: &fakePacer{budget: budget},
		capa: &fakeCapacity{},
	}
	w, err := ingest.NewWorker(cfg, ingest.Ports{
		Source: r.src, DeadLetters: r.dlq, Sink: r.sink, Retry: fixedRetry{attempts: 3}, Pacer: r.pace, Capacity: r.capa,
	})
	require.NoError(t, err)
	r.w = w
	return r
}

// run runs the worker until every record is finished.
func (r *rig) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.w.Run(ctx) }()
	require.Eventually(t, func() bool { return r.src.doneCount() == len(r.src.recs) }, 10*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

func records(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"id":"r%d","n":%d}`, i, i)
	}
	return out
}

func TestWorkerDeliversEveryRecordOnceWithinBudget(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.WorkerConfig{IDField: "id", MaxBatch: 7}, 25, records(500)...)
	r.run(t)
	require.Len(t, r.sink.stored, 500)
	for id, n := range r.sink.stored {
		require.Equal(t, 1, n, id)
	}
	r.pace.mu.Lock()
	defer r.pace.mu.Unlock()
	var total int64
	for _, s := range r.pace.spent {
		require.LessOrEqual(t, s, int64(25), "a slice spent more than its budget")
		total += s
	}
	require.Equal(t, int64(500), total)
	tot := r.w.Counters().Totals()
	require.Equal(t, int64(500), tot.Delivered)
	require.Equal(t, int64(0), tot.DeadLettered)
	require.Equal(t, int64(500), tot.UnitsDelivered)
}

func TestWorkerRetriesAndChargesEveryAttempt(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.WorkerConfig{IDField: "id"}, 50, records(100)...)
	// Every third record is throttled on its first attempt.
	r.sink.answer = func(id string, attempt int) ingest.Result {
		var n int
		fmt.Sscanf(id, "r%d", &n)
		if n%3 == 0 && attempt == 1 {
			return ingest.Result{Outcome: ingest.Retryable, Throttled: true, RetryAfter: 2 * time.Millisecond}
		}
		return ingest.Result{Outcome: ingest.Delivered}
	}
	r.run(t)
	require.Len(t, r.sink.stored, 100)
	tot := r.w.Counters().Totals()
	require.Equal(t, int64(34), tot.Throttled)
	require.Equal(t, int64(134), tot.Attempts)
	require.Equal(t, int64(134), tot.UnitsSent, "retries are charged to the budget")
}

func TestWorkerDeadLettersBadRecordsAndDeliversNeighbours(t *testing.T) {
	t.Parallel()
	values := records(10)
	values[3] = `not json`
	values[6] = `{"id":"poison"}`
	r := newRig(t, ingest.WorkerConfig{IDField: "id"}, 100, values...)
	r.sink.answer = func(id string, _ int) ingest.Result {
		if id == "poison" {
			return ingest.Result{Outcome: ingest.Permanent, Reason: "HTTP 400: bad field"}
		}
		return ingest.Result{Outcome: ingest.Delivered}
	}
	r.run(t)
	require.Len(t, r.sink.stored, 8)
	require.Len(t, r.dlq.reasons, 2)
	require.Equal(t, "HTTP 400: bad field", r.dlq.reasons["poison"])
	for id, reason := range r.dlq.reasons {
		if id != "poison" {
			require.Contains(t, reason, "t/0@3: value is not a JSON object")
		}
	}
	require.Equal(t, int64(2), r.w.Counters().Totals().DeadLettered)
}

func TestWorkerGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.WorkerConfig{IDField: "id"}, 100, records(3)...)
	r.sink.answer = func(id string, _ int) ingest.Result {
		if id == "r1" {
			return ingest.Result{Outcome: ingest.Retryable, Reason: "HTTP 503"}
		}
		return ingest.Result{Outcome: ingest.Delivered}
	}
	r.run(t)
	require.Equal(t, 3, r.sink.attempts["r1"])
	require.Equal(t, "gave up after 3 attempts: HTTP 503", r.dlq.reasons["r1"])
}

func TestWorkerDeadLettersRecordsCostlierThanThePool(t *testing.T) {
	t.Parallel()
	values := []string{`{"id":"small"}`, `{"id":"huge","pad":"` + string(make([]byte, 0)) + `xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`}
	r := newRig(t, ingest.WorkerConfig{IDField: "id", Pricing: ingest.Pricing{Unit: ingest.UnitBytes}, MaxRecordCost: 40}, 1000, values...)
	r.run(t)
	require.Equal(t, 1, r.sink.stored["small"])
	require.Contains(t, r.dlq.reasons["huge"], "more than one second of the whole pool (40)")
}

func TestWorkerAnnouncesBacklogThenIdles(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.WorkerConfig{IDField: "id"}, 10, records(200)...)
	r.run(t)
	r.capa.mu.Lock()
	defer r.capa.mu.Unlock()
	require.Contains(t, r.capa.demand, ingest.Inf, "a backlog larger than the budget asks for more capacity")
	require.Equal(t, 0.0, r.capa.demand[len(r.capa.demand)-1], "a stopped worker wants nothing")
}

func TestWorkerRetriesAnUnreachableSinkWithoutDeadLettering(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.WorkerConfig{IDField: "id"}, 100, records(20)...)
	r.sink.down = 10 // more failed writes than the retry policy's 3 attempts
	r.run(t)
	require.Len(t, r.sink.stored, 20)
	require.Empty(t, r.dlq.reasons)
}

// owningSource disowns records of odd offsets, as if their partition had
// been reassigned.
type owningSource struct{ *fakeSource }

func (s owningSource) Owns(r ingest.Record) bool { return r.Pos.Offset%2 == 0 }

func TestWorkerDropsRecordsItNoLongerOwns(t *testing.T) {
	t.Parallel()
	src := owningSource{newFakeSource(records(40)...)}
	sink := &fakeSink{stored: map[string]int{}, attempts: map[string]int{}}
	w, err := ingest.NewWorker(ingest.WorkerConfig{IDField: "id"}, ingest.Ports{
		Source: src, DeadLetters: &fakeDLQ{reasons: map[string]string{}}, Sink: sink,
		Retry: fixedRetry{attempts: 3}, Pacer: &fakePacer{budget: 7}, Capacity: &fakeCapacity{},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	require.Eventually(t, func() bool { return src.doneCount() == 20 }, 10*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.Len(t, sink.stored, 20, "only owned records are written")
	src.mu.Lock()
	defer src.mu.Unlock()
	for off := range src.done {
		require.Zero(t, off%2, "a disowned record was marked done")
	}
}

func TestWorkerChargesWhatTheSinkReportsBeyondTheEstimate(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.WorkerConfig{IDField: "id", Pricing: ingest.Pricing{Unit: ingest.UnitCost, PerRecord: 10}}, 100, records(50)...)
	r.sink.answer = func(string, int) ingest.Result { return ingest.Result{Outcome: ingest.Delivered, Charge: 12} }
	r.run(t)
	// Writes answer after their slice, so each correction reaches the
	// pacer with a later slice; the last ones may still be owed when the
	// worker stops (the process is ending then). Records priced after the
	// first answers are estimated at the learned 12 units and need none.
	tot := r.w.Counters().Totals()
	require.Positive(t, tot.UnitsCorrected)
	r.pace.mu.Lock()
	defer r.pace.mu.Unlock()
	var total int64
	for _, s := range r.pace.spent {
		total += s
	}
	require.Equal(t, tot.UnitsSent, total, "estimates plus corrections, each unit once")
	require.GreaterOrEqual(t, total, int64(50*10))
	require.LessOrEqual(t, total, int64(50*12), "never more than the sink charged")
}

func TestWorkerLearnsTheSinksChargeRatio(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.WorkerConfig{IDField: "id", Pricing: ingest.Pricing{Unit: ingest.UnitCost, PerRecord: 10}}, 25, records(200)...)
	r.sink.answer = func(string, int) ingest.Result { return ingest.Result{Outcome: ingest.Delivered, Charge: 15} }
	r.run(t)
	r.pace.mu.Lock()
	defer r.pace.mu.Unlock()
	last := r.pace.spent[len(r.pace.spent)-1]
	require.Zero(t, last%15, "the last slices send records estimated at the sink's 15 units, got a spend of %d", last)
}

// throttlePacer is a fakePacer that takes throttle feedback.
type throttlePacer struct {
	fakePacer
	throttles sync.WaitGroup
}

func (p *throttlePacer) Throttled() { p.throttles.Done() }

func TestWorkerReportsThrottledWritesToThePacer(t *testing.T) {
	t.Parallel()
	r := newRig(t, ingest.WorkerConfig{IDField: "id", MaxBatch: 10}, 10, records(30)...)
	pacer := &throttlePacer{fakePacer: fakePacer{budget: 10}}
	pacer.throttles.Add(2)
	r.sink.answer = func(id string, attempt int) ingest.Result {
		if attempt == 1 && (id == "r3" || id == "r4" || id == "r25") {
			return ingest.Result{Outcome: ingest.Retryable, Throttled: true}
		}
		return ingest.Result{Outcome: ingest.Delivered}
	}
	w, err := ingest.NewWorker(ingest.WorkerConfig{IDField: "id", MaxBatch: 10}, ingest.Ports{
		Source: r.src, DeadLetters: r.dlq, Sink: r.sink, Retry: fixedRetry{attempts: 3}, Pacer: pacer, Capacity: r.capa,
	})
	require.NoError(t, err)
	r.w = w
	r.run(t)
	pacer.throttles.Wait() // one report per throttled write (r3 and r4 share one), or Done panics below zero
	require.Len(t, r.sink.stored, 30)
}
