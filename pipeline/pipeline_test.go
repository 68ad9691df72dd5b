package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/pipeline"
	"github.com/sluicehq/sluice/sink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every test runs in a testing/synctest bubble: time is virtual, so rates,
// windows and pauses are exact and no test waits on the wall clock.

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

// accept is one record the fake sink stored: when, and in which request.
type accept struct {
	at    time.Duration
	units int64
}

// fakeSink answers by a rule, after latency, and remembers what it stored
// and when (virtual time since start), what each request held, and the
// idempotency key it would carry.
type fakeSink struct {
	start   time.Time
	latency func(request int) time.Duration // before the answer; nil: none
	answer  func(id string, attempt int) ingest.Result
	fail    func(now time.Duration) error // a failure of the whole request; nil: none

	mu       sync.Mutex
	requests int
	sentAt   []time.Duration // when each request arrived, since start
	stored   map[string]int
	attempts map[string]int
	accepted []accept
	batches  [][]string // record IDs of each request, in order
}

func newFakeSink() *fakeSink {
	return &fakeSink{start: time.Now(), stored: map[string]int{}, attempts: map[string]int{}}
}

func (s *fakeSink) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	s.mu.Lock()
	s.requests++
	n := s.requests
	s.sentAt = append(s.sentAt, time.Since(s.start))
	ids := make([]string, len(batch))
	for i, r := range batch {
		ids[i] = r.ID
	}
	s.batches = append(s.batches, ids)
	s.mu.Unlock()
	if s.latency != nil {
		// Accepted halfway, answered at the end.
		half := s.latency(n) / 2
		select {
		case <-time.After(half):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		defer func() { time.Sleep(half) }()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Since(s.start)
	if s.fail != nil {
		if err := s.fail(now); err != nil {
			return nil, err
		}
	}
	out := make([]ingest.Result, len(batch))
	var units int64
	for i, r := range batch {
		s.attempts[r.ID]++
		res := ingest.Result{Outcome: ingest.Delivered}
		if s.answer != nil {
			res = s.answer(r.ID, s.attempts[r.ID])
		}
		if res.Outcome == ingest.Delivered {
			if s.stored[r.ID] > 0 {
				res.Outcome = ingest.Duplicate
			}
			s.stored[r.ID]++
			units += r.Cost
		}
		out[i] = res
	}
	if units > 0 {
		s.accepted = append(s.accepted, accept{now, units})
	}
	return out, nil
}

func (s *fakeSink) storedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.stored)
}

// maxIn is the most units the sink accepted in any half-open window of
// width w that starts at or after from.
func (s *fakeSink) maxIn(w, from time.Duration) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	win := ingest.NewWindow(w)
	for _, a := range s.accepted {
		if a.at >= from {
			win.Add(a.at, a.units)
		}
	}
	return win.Max()
}

// fakeDLQ stores dead letters, or fails while down says so.
type fakeDLQ struct {
	mu      sync.Mutex
	down    func() bool
	reasons map[string]string
	writes  int
}

func (d *fakeDLQ) DeadLetter(_ context.Context, letters ...ingest.DeadLetter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes++
	if d.down != nil && d.down() {
		return errors.New("kafka: dead-letter topic unreachable")
	}
	for _, l := range letters {
		d.reasons[l.Record.ID] = l.Reason
	}
	return nil
}

func (d *fakeDLQ) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.reasons)
}

// fixedRate is a capacity of rate units/s leased forever.
type fixedRate struct {
	rate   float64
	mu     sync.Mutex
	demand []float64
}

func (c *fixedRate) Rate(time.Time) float64            { return c.rate }
func (c *fixedRate) Credit(from, to time.Time) float64 { return to.Sub(from).Seconds() * c.rate }
func (c *fixedRate) SetDemand(d float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.demand = append(c.demand, d)
}

type rig struct {
	src   *fakeSource
	sink  *fakeSink
	dlq   *fakeDLQ
	capa  *fixedRate
	pacer *pacing.Pacer
	p     *pipeline.Pipeline
	log   *strings.Builder
}

// newRig builds a pipeline over the fakes with the real pacer at rate
// units/s and the real retry policy (3 attempts); call it inside a bubble.
func newRig(t *testing.T, cfg pipeline.Config, rate float64, values ...string) *rig {
	t.Helper()
	r := &rig{
		src:  newFakeSource(values...),
		sink: newFakeSink(),
		dlq:  &fakeDLQ{reasons: map[string]string{}},
		capa: &fixedRate{rate: rate},
		log:  new(strings.Builder),
	}
	var err error
	r.pacer, err = pacing.New(pacing.Config{}, r.capa)
	require.NoError(t, err)
	cfg.Logger = slog.New(slog.NewTextHandler(syncWriter{w: r.log}, nil))
	r.p, err = pipeline.New(cfg, pipeline.Ports{
		Source: r.src, DeadLetters: r.dlq, Sink: r.sink, Retry: sink.Policy{MaxAttempts: 3}, Pacer: r.pacer, Capacity: r.capa,
	})
	require.NoError(t, err)
	return r
}

// newPipelineFor builds a pipeline like r's over sink s instead of r.sink.
func newPipelineFor(t *testing.T, r *rig, s ingest.Sink) *pipeline.Pipeline {
	t.Helper()
	p, err := pipeline.New(pipeline.Config{IDField: "id", Logger: slog.New(slog.NewTextHandler(syncWriter{w: r.log}, nil))}, pipeline.Ports{
		Source: r.src, DeadLetters: r.dlq, Sink: s, Retry: sink.Policy{MaxAttempts: 3}, Pacer: r.pacer, Capacity: r.capa,
	})
	require.NoError(t, err)
	return p
}

// syncWriter serializes writes to a strings.Builder.
type syncWriter struct{ w io.Writer }

var logMu sync.Mutex

func (s syncWriter) Write(p []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	return s.w.Write(p)
}

func (r *rig) logs() string {
	logMu.Lock()
	defer logMu.Unlock()
	return r.log.String()
}

// run runs the pipeline until every record is finished (or limit passes)
// and returns how long it took and Run's error.
func (r *rig) run(t *testing.T, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.p.Run(ctx) }()
	for r.src.doneCount() < len(r.src.recs) && time.Since(start) < limit {
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	cancel()
	return took, <-done
}

func records(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"id":"r%d","n":%d}`, i, i)
	}
	return out
}

// At 1,000 records/s with 2–6 ms answers, 5,000 records are stored once
// each in about 5 s, no second at the sink holds more than 1,000, and
// after the first second no 200 ms holds more than 1.1 slices: the budget
// of a slice flows over it.
func TestPipelineDeliversEveryRecordOnceWithinTheRate(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id"}, 1000, records(5000)...)
		r.sink.latency = func(n int) time.Duration { return time.Duration(2+n%5) * time.Millisecond }
		took, err := r.run(t, time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 5000)
		for id, n := range r.sink.stored {
			require.Equal(t, 1, n, id)
		}
		t.Logf("took %s; busiest second %d, busiest 200 ms after the first second %d", took, r.sink.maxIn(time.Second, 0), r.sink.maxIn(200*time.Millisecond, time.Second))
		require.LessOrEqual(t, r.sink.maxIn(time.Second, 0), int64(1000))
		require.LessOrEqual(t, r.sink.maxIn(200*time.Millisecond, time.Second), int64(220))
		require.Less(t, took, 5300*time.Millisecond, "utilization ≥ 0.94 including the first and last slice")
		tot := r.p.Counters().Totals()
		require.Equal(t, int64(5000), tot.Delivered)
		require.Zero(t, tot.Duplicates)
		require.LessOrEqual(t, tot.MaxSent1s, int64(1000), "send side")
		require.Equal(t, 6*time.Millisecond, tot.LatencyMax)
	})
}

// The first answers come 30 ms late (cold connections): the pacer keeps
// each send in its account until its answer, so the sink's second holds.
func TestPipelineHoldsTheSinkSecondWhenFirstAnswersAreSlow(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id"}, 1000, records(3000)...)
		r.sink.latency = func(n int) time.Duration {
			if n <= 20 {
				return 32 * time.Millisecond
			}
			return 2 * time.Millisecond
		}
		_, err := r.run(t, time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 3000)
		require.LessOrEqual(t, r.sink.maxIn(time.Second, 0), int64(1000))
	})
}

// Failures of the whole request pause the sink: nothing is dead-lettered
// and no record's attempts are used up, however long it lasts; a WARN
// says so once and an INFO when it is over; the probes are few.
func TestPipelinePausesOnSinkWideFailures(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		until     time.Duration
		fail      error
		throttled bool // every record answered 429 with Retry-After 3600, not 503
	}{
		{name: "401 for 10 s", until: 10 * time.Second, fail: &ingest.SinkError{Err: errors.New("sink: HTTP 401: invalid token")}},
		{name: "503 for 20 s", until: 20 * time.Second, fail: &ingest.SinkError{Err: errors.New("sink: HTTP 503: down")}},
		{name: "429 with Retry-After 3600 for 60 s", until: 60 * time.Second,
			fail: &ingest.SinkError{Throttled: true, RetryAfter: time.Hour, Err: errors.New("sink: HTTP 429")}},
		{name: "an answer it cannot read for 10 s", until: 10 * time.Second, fail: fmt.Errorf("%w: 0 results for 10 records", sink.ErrProtocol)},
		{name: "every record retryable for 10 s", until: 10 * time.Second},
		// Outages of an hour, in each shape: nothing is dead-lettered,
		// every record is stored once, probes come at most every 30 s.
		{name: "503 for an hour", until: time.Hour, fail: &ingest.SinkError{Err: errors.New("sink: HTTP 503: down")}},
		{name: "every record retryable for an hour", until: time.Hour},
		{name: "every record throttled with Retry-After 3600 for an hour", until: time.Hour, throttled: true},
		{name: "an answer it cannot read for an hour", until: time.Hour, fail: fmt.Errorf("%w: 0 results for 10 records", sink.ErrProtocol)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t, pipeline.Config{IDField: "id"}, 1000, records(300)...)
				r.sink.fail = func(now time.Duration) error {
					if now < tt.until && tt.fail != nil {
						return tt.fail
					}
					return nil
				}
				if tt.fail == nil {
					r.sink.answer = func(string, int) ingest.Result {
						switch {
						case time.Since(r.sink.start) >= tt.until:
						case tt.throttled:
							return ingest.Result{Outcome: ingest.Retryable, Throttled: true, RetryAfter: time.Hour, Reason: "HTTP 429"}
						default:
							return ingest.Result{Outcome: ingest.Retryable, Reason: "HTTP 503"}
						}
						return ingest.Result{Outcome: ingest.Delivered}
					}
				}
				// Readiness, sampled every second: not ready once the pause
				// has lasted ReadyAfter (30 s), ready again once it ends.
				var notReady []string
				stop := make(chan struct{})
				sampled := make(chan struct{})
				go func() {
					defer close(sampled)
					for {
						select {
						case <-stop:
							return
						case <-time.After(time.Second):
						}
						if err := r.p.Ready(); err != nil {
							notReady = append(notReady, err.Error())
						}
					}
				}()
				took, err := r.run(t, tt.until+5*time.Minute)
				close(stop)
				<-sampled
				require.NoError(t, err)
				require.NoError(t, r.p.Ready(), "ready again after recovery")
				if tt.until > ingest.DefaultReadyAfter {
					require.NotEmpty(t, notReady, "not ready while paused longer than ReadyAfter")
					require.Contains(t, notReady[0], "the sink is paused")
					// Not ready from ReadyAfter into the pause until the
					// first probe after the outage succeeds, which comes
					// within a probe interval (5 s) after it; the samples
					// fall a second apart.
					paused := (tt.until - ingest.DefaultReadyAfter).Seconds()
					require.GreaterOrEqual(t, float64(len(notReady)), paused-1)
					require.LessOrEqual(t, float64(len(notReady)), paused+5+1)
				} else {
					require.Empty(t, notReady, "a pause shorter than ReadyAfter leaves the worker ready")
				}
				require.Zero(t, r.dlq.len(), "nothing dead-lettered")
				require.Len(t, r.sink.stored, 300, "every record once after recovery")
				for id, n := range r.sink.stored {
					require.Equal(t, 1, n, id)
				}
				require.Less(t, took, tt.until+35*time.Second, "resumed within a capped pause")
				r.sink.mu.Lock()
				var during int // requests while the sink failed
				for _, at := range r.sink.sentAt {
					if at < tt.until {
						during++
					}
				}
				r.sink.mu.Unlock()
				require.Less(t, during, 10+int(tt.until/(5*time.Second)), "probes every 5 s at most, not a hammering: %d requests", during)
				// A throttle of the whole sink cuts the pacer's ceiling once
				// for the pause, not once for each probe it refused (0.7 ^ 120
				// after an hour: the load would climb back from nothing).
				require.LessOrEqual(t, r.pacer.Stats().Cuts, int64(1), "the throttle ceiling cut once a pause")
				logs := r.logs()
				require.Equal(t, 1, strings.Count(logs, "sink paused"), logs)
				require.Equal(t, 1, strings.Count(logs, "sink resumed"), logs)
				tot := r.p.Counters().Totals()
				require.Zero(t, tot.DeadLettered)
				require.Positive(t, tot.FailedWrites)
			})
		})
	}
}

// A batch that failed as a whole is sent again as it was, so its
// idempotency key (derived from its records' IDs) does not change.
func TestPipelineRetriesAFailedBatchWhole(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id", MaxBatch: 10}, 1000, records(200)...)
		failed := 0
		r.sink.fail = func(now time.Duration) error {
			if failed < 3 {
				failed++
				return errors.New("connection reset by peer")
			}
			return nil
		}
		_, err := r.run(t, time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 200)
		r.sink.mu.Lock()
		defer r.sink.mu.Unlock()
		first := r.sink.batches[0]
		retried := slices.IndexFunc(r.sink.batches[1:], func(b []string) bool { return slices.Contains(b, first[0]) })
		require.GreaterOrEqual(t, retried, 0)
		require.Equal(t, first, r.sink.batches[1+retried], "the same records, in the same order: the same key")
	})
}

// A record waiting to be retried alone and a batch kept whole after a
// failure of its request are both due when the probe that ends the pause
// is taken: the probe is one of them, and the other is sent after it, not
// forgotten (its records would never be finished, and the queue would never
// commit past them).
func TestPipelineProbeLeavesOtherDueRetriesQueued(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id", MaxBatch: 10}, 1000, records(300)...)
		r.sink.answer = func(id string, attempt int) ingest.Result {
			if id == "r145" && attempt == 1 {
				return ingest.Result{Outcome: ingest.Retryable, Throttled: true, Reason: "HTTP 429"}
			}
			return ingest.Result{Outcome: ingest.Delivered}
		}
		// r145 is throttled in the 15th request (160 ms) and comes due
		// 80–120 ms later, after the second slice opened; the 30th request
		// (310 ms) fails as a whole and asks for 150 ms, and the rest of
		// its slice waits for the pause to end.
		r.sink.fail = func(time.Duration) error {
			if r.sink.requests == 30 {
				return &ingest.SinkError{RetryAfter: 150 * time.Millisecond, Err: errors.New("sink: HTTP 503: busy")}
			}
			return nil
		}
		_, err := r.run(t, time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 300, "every record stored")
		require.Equal(t, 300, r.src.doneCount(), "every record finished")
	})
}

// Per-record results: a throttled record never uses up attempts; a record
// answered retryable among delivered ones gives up after the policy's
// attempts; a refused one is dead-lettered at once; their neighbours are
// delivered; retries are charged to the budget. (At 50 records/s the
// records flow for two seconds, so the retried record's attempts share
// requests with others the sink stores.)
func TestPipelineRoutesPerRecordResults(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		values := records(100)
		values[3] = `not json`
		values[7] = `{"n":7}` // no id
		r := newRig(t, pipeline.Config{IDField: "id"}, 50, values...)
		r.sink.answer = func(id string, attempt int) ingest.Result {
			switch {
			case id == "r1":
				return ingest.Result{Outcome: ingest.Retryable, Reason: "HTTP 503"}
			case id == "r2":
				return ingest.Result{Outcome: ingest.Permanent, Reason: "HTTP 400: bad field"}
			case id == "r4" && attempt <= 6:
				return ingest.Result{Outcome: ingest.Retryable, Throttled: true, RetryAfter: 50 * time.Millisecond, Reason: "HTTP 429"}
			}
			return ingest.Result{Outcome: ingest.Delivered}
		}
		_, err := r.run(t, 5*time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 96, "every neighbour delivered")
		require.Equal(t, 1, r.sink.stored["r4"], "throttled six times, then stored: throttling never dead-letters")
		require.GreaterOrEqual(t, r.sink.attempts["r1"], 3)
		require.Equal(t, "record t/0@1 (id r1): gave up after 3 attempts: HTTP 503", r.dlq.reasons["r1"])
		require.Equal(t, "record t/0@2 (id r2): HTTP 400: bad field", r.dlq.reasons["r2"])
		require.Contains(t, r.dlq.reasons[ingest.ContentID([]byte(values[3]))], "t/0@3: value is not a JSON object")
		require.Contains(t, r.dlq.reasons[ingest.ContentID([]byte(values[7]))], `t/0@7: ingest: no record ID: field "id" is missing`)
		tot := r.p.Counters().Totals()
		require.Equal(t, int64(4), tot.DeadLettered)
		require.Equal(t, int64(2), tot.Invalid)
		require.Equal(t, int64(6), tot.Throttled)
		require.Equal(t, tot.Attempts, tot.UnitsSent, "every attempt is charged")
	})
}

// The dead-letter topic unreachable: good records are still delivered,
// the fetcher pauses once many wait, Ready reports it after ReadyAfter,
// and the dead letters are stored once it is back.
func TestPipelineDeliversGoodRecordsWhileTheDeadLetterTopicIsDown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		values := records(400)
		for i := 0; i < len(values); i += 10 {
			values[i] = fmt.Sprintf(`{"n":%d}`, i) // no id: dead-lettered
		}
		r := newRig(t, pipeline.Config{IDField: "id", ReadyAfter: 5 * time.Second}, 1000, values...)
		var down sync.Mutex
		up := false
		r.dlq.down = func() bool { down.Lock(); defer down.Unlock(); return !up }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.p.Run(ctx) }()

		time.Sleep(3 * time.Second)
		require.Equal(t, 360, r.sink.storedCount(), "every good record delivered")
		require.NoError(t, r.p.Ready(), "not yet past ReadyAfter")
		time.Sleep(3 * time.Second)
		require.ErrorContains(t, r.p.Ready(), "the dead-letter topic is unreachable")

		down.Lock()
		up = true
		down.Unlock()
		time.Sleep(6 * time.Second)
		require.Equal(t, 40, r.dlq.len())
		require.NoError(t, r.p.Ready())
		require.Equal(t, 400, r.src.doneCount())
		cancel()
		require.NoError(t, <-done)
	})
}

// With StallTimeout, a sink that never comes back makes Run return a
// *StalledError naming it; nothing is dead-lettered or marked done.
func TestPipelineGivesUpOnASinkThatStaysDown(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id", StallTimeout: time.Minute}, 1000, records(50)...)
		r.sink.fail = func(time.Duration) error { return errors.New("dial tcp 127.0.0.1:1: connect: connection refused") }
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		err := r.p.Run(ctx)
		var se *pipeline.StalledError
		require.ErrorAs(t, err, &se)
		require.ErrorIs(t, err, pipeline.ErrStalled)
		require.ErrorContains(t, err, "the sink is paused")
		require.ErrorContains(t, err, "connection refused")
		require.InDelta(t, time.Minute.Seconds(), time.Since(start).Seconds(), 2)
		require.Zero(t, r.dlq.len())
		require.Zero(t, r.src.doneCount(), "left for a rerun")
	})
}

// The pipeline puts RequestTimeout on every write: a sink that hangs is
// cancelled then, and the write counts as a failure of the whole request.
func TestPipelineCancelsAWriteAtTheRequestTimeout(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id", RequestTimeout: 300 * time.Millisecond}, 1000, records(10)...)
		r.sink.latency = func(n int) time.Duration {
			if n == 1 {
				return time.Hour
			}
			return 0
		}
		_, err := r.run(t, time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 10)
		require.Contains(t, r.logs(), "no answer within the request timeout (300ms)")
		require.Zero(t, r.dlq.len())
	})
}

// A record costing more than one second of the whole pool can never be
// written within it: dead-lettered, its neighbour delivered.
func TestPipelineDeadLettersRecordsCostlierThanThePool(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		values := []string{`{"id":"small"}`, `{"id":"huge","pad":"` + strings.Repeat("x", 60) + `"}`}
		r := newRig(t, pipeline.Config{IDField: "id", Pricing: ingest.Pricing{Unit: ingest.UnitBytes}, MaxRecordCost: 40}, 40, values...)
		_, err := r.run(t, time.Minute)
		require.NoError(t, err)
		require.Equal(t, 1, r.sink.stored["small"])
		require.Contains(t, r.dlq.reasons["huge"], "more than one second of the whole pool (40)")
	})
}

// owningSource disowns records of odd offsets, as if their partition had
// been reassigned.
type owningSource struct{ *fakeSource }

func (s owningSource) Owns(r ingest.Record) bool { return r.Pos.Offset%2 == 0 }

func TestPipelineDropsRecordsItNoLongerOwns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id"}, 1000)
		src := owningSource{newFakeSource(records(40)...)}
		p, err := pipeline.New(pipeline.Config{IDField: "id"}, pipeline.Ports{
			Source: src, DeadLetters: r.dlq, Sink: r.sink, Retry: sink.Policy{}, Pacer: r.pacer, Capacity: r.capa,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(2 * time.Second)
		cancel()
		require.NoError(t, <-done)
		require.Len(t, r.sink.stored, 20, "only owned records are written")
		src.mu.Lock()
		defer src.mu.Unlock()
		require.Len(t, src.done, 20)
		for off := range src.done {
			require.Zero(t, off%2, "a disowned record was marked done")
		}
	})
}

// What the sink charges beyond the estimate is charged to the pacer, and
// the estimate learns the sink's ratio.
func TestPipelineChargesWhatTheSinkReports(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id", Pricing: ingest.Pricing{Unit: ingest.UnitCost, PerRecord: 10}}, 1000, records(2000)...)
		r.sink.answer = func(string, int) ingest.Result { return ingest.Result{Outcome: ingest.Delivered, Charge: 15} }
		_, err := r.run(t, time.Minute)
		require.NoError(t, err)
		tot := r.p.Counters().Totals()
		require.Positive(t, tot.UnitsCorrected)
		require.LessOrEqual(t, tot.UnitsSent, int64(2000*15), "never more than the sink charged")
		require.Greater(t, tot.UnitsDelivered, int64(2000*10)*5/4, "later records are estimated at the sink's 15 units")
	})
}

// A backlog larger than the budget asks for more capacity; a stopped
// pipeline wants nothing.
func TestPipelineAnnouncesBacklogThenIdles(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id"}, 100, records(200)...)
		_, err := r.run(t, time.Minute)
		require.NoError(t, err)
		r.capa.mu.Lock()
		defer r.capa.mu.Unlock()
		require.Contains(t, r.capa.demand, ingest.Inf)
		require.Equal(t, 0.0, r.capa.demand[len(r.capa.demand)-1])
	})
}

// A request throttled as a whole reaches the pacer as feedback: the
// worker's rate is cut. A record throttled alone, among accepted ones,
// does not: it slows only its key range.
func TestPipelineReportsThrottlingToThePacer(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id", MaxBatch: 10}, 1000, records(300)...)
		r.sink.answer = func(id string, attempt int) ingest.Result {
			if attempt == 1 && (id == "r3" || id == "r250") {
				return ingest.Result{Outcome: ingest.Retryable, Throttled: true, Reason: "HTTP 429"}
			}
			return ingest.Result{Outcome: ingest.Delivered}
		}
		r.sink.fail = func(time.Duration) error {
			if r.sink.requests == 5 || r.sink.requests == 40 {
				return &ingest.SinkError{Throttled: true, Err: errors.New("sink: HTTP 429")}
			}
			return nil
		}
		_, err := r.run(t, time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 300)
		require.EqualValues(t, 2, r.pacer.Stats().Cuts, "one cut per request throttled as a whole")
		tot := r.p.Counters().Totals()
		require.EqualValues(t, 2, tot.HotRanges+tot.RangeCuts, "each record throttled alone found or slowed its key range")
		require.Equal(t, 4, r.sink.attempts["r3"]+r.sink.attempts["r250"], "each retried once")
	})
}

// rangeSink admits records into key ranges the way a range-partitioned
// store does: keys are cut at bounds into ranges with a limit of
// operations in any sliding second each (0: none); a record its range
// refuses is answered throttled alone, its neighbours are stored.
type rangeSink struct {
	*fakeSink
	bounds []string // ascending; range i holds keys in [bounds[i-1], bounds[i])
	limits []int64  // per range; len(bounds)+1
	wins   []ingest.Window

	lastStored []time.Duration // per range: when it stored its latest record
}

func newRangeSink(bounds []string, limits []int64) *rangeSink {
	s := &rangeSink{fakeSink: newFakeSink(), bounds: bounds, limits: limits}
	for range limits {
		s.wins = append(s.wins, ingest.NewWindow(time.Second))
	}
	s.lastStored = make([]time.Duration, len(limits))
	s.answer = s.admit
	return s
}

// admit is called with s.mu held, in request order, at one instant.
func (s *rangeSink) admit(id string, _ int) ingest.Result {
	i := sort.SearchStrings(s.bounds, id)
	if i < len(s.bounds) && s.bounds[i] == id {
		i++
	}
	at := time.Since(s.start)
	if s.limits[i] > 0 {
		s.wins[i].Expire(at)
		if s.wins[i].WaitFor(at, 0, 1, s.limits[i]) > 0 {
			return ingest.Result{Outcome: ingest.Retryable, Throttled: true, Reason: "HTTP 429: the key's range is at its limit"}
		}
	}
	s.wins[i].Add(at, 1)
	s.lastStored[i] = at
	return ingest.Result{Outcome: ingest.Delivered}
}

// storedLast is when range i stored its latest record.
func (s *rangeSink) storedLast(i int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastStored[i]
}

// busiest is the most records range i admitted in any sliding second.
func (s *rangeSink) busiest(i int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wins[i].Max()
}

// One record in ten goes to a key range that takes 50 records/s while the
// worker leases 1,000: the sink throttles that range alone, the pipeline
// learns it from the answers and holds that range's records to its rate,
// and the rest of every slice's budget goes to the other keys, which are
// all stored about as soon as the leased rate allows. The pacer is never
// cut, and the sink's refusals stay few.
func TestPipelineSlowsOnlyTheThrottledKeyRange(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		values := make([]string, 3000)
		for i := range values {
			key := fmt.Sprintf("cold/%05d", i)
			if i%10 == 7 {
				key = fmt.Sprintf("hot/%05d", i)
			}
			values[i] = fmt.Sprintf(`{"id":%q}`, key)
		}
		r := newRig(t, pipeline.Config{IDField: "id"}, 1000, values...)
		rs := newRangeSink([]string{"hot/", "hot0"}, []int64{0, 50, 0})
		rs.start = r.sink.start
		r.p = newPipelineFor(t, r, rs)
		took, err := r.run(t, time.Minute)
		require.NoError(t, err)
		tot := r.p.Counters().Totals()
		t.Logf("took %s; cold keys stored by %s; %d attempts, %d throttled; hot range's busiest second %d; pacer cuts %d; hot ranges %d, cuts %d",
			took, rs.storedLast(0), tot.Attempts, tot.Throttled, rs.busiest(1), r.pacer.Stats().Cuts, tot.HotRanges, tot.RangeCuts)
		require.Len(t, rs.stored, 3000, "every record stored")
		require.Equal(t, 3000, r.src.doneCount(), "every record finished")
		require.Greater(t, took, 6*time.Second, "300 hot records at 50/s")
		require.Less(t, rs.storedLast(0), 3100*time.Millisecond, "2,700 cold records at about the leased 1,000/s")
		require.Zero(t, r.pacer.Stats().Cuts, "the worker's rate is not cut")
		require.Less(t, tot.Throttled, int64(30), "the hot range is paced, not hammered")
	})
}

// Every key falls in one range of 300 records/s (sequential keys): the
// worker runs at that range's rate, refused rarely, and holds back a
// bounded number of records rather than fetching the whole backlog.
func TestPipelineRunsAtTheRateOfTheOnlyHotRange(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id"}, 1000, records(4500)...)
		rs := newRangeSink(nil, []int64{300})
		rs.start = r.sink.start
		r.p = newPipelineFor(t, r, rs)
		stop := make(chan struct{})
		sampled := make(chan int)
		go func() {
			most := 0
			for {
				select {
				case <-stop:
					sampled <- most
					return
				case <-time.After(50 * time.Millisecond):
				}
				r.src.mu.Lock()
				most = max(most, r.src.next-len(r.src.done))
				r.src.mu.Unlock()
			}
		}()
		took, err := r.run(t, 2*time.Minute)
		close(stop)
		inFlight := <-sampled
		require.NoError(t, err)
		tot := r.p.Counters().Totals()
		t.Logf("took %s; %d attempts, %d throttled; busiest second %d; most records in flight %d", took, tot.Attempts, tot.Throttled, rs.busiest(0), inFlight)
		require.Len(t, rs.stored, 4500)
		require.Greater(t, took, 14*time.Second, "never above the range's 300/s")
		require.Less(t, took, 16500*time.Millisecond, "at ≥ 0.9 of the range's rate")
		require.LessOrEqual(t, tot.Throttled, tot.Attempts/100, "≤ 1 % of the sends refused")
		require.Less(t, inFlight, 1500, "held records are bounded by the slices' budget, not the backlog")
	})
}

// On shutdown, writes in flight may finish within the grace period; past
// it they are cancelled and their records are left for redelivery.
func TestPipelineShutdownCancelsWritesAfterTheGrace(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id", Grace: 2 * time.Second, RequestTimeout: time.Minute}, 1000, records(5)...)
		r.sink.latency = func(int) time.Duration { return time.Hour }
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.p.Run(ctx) }()
		time.Sleep(time.Second)
		cancel()
		stopped := time.Now()
		require.NoError(t, <-done)
		require.Equal(t, 2*time.Second, time.Since(stopped))
		require.Zero(t, r.src.doneCount())
		require.Contains(t, r.logs(), "grace period over")
	})
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := pipeline.New(pipeline.Config{}, pipeline.Ports{})
	require.ErrorContains(t, err, "needs a source")
	r := &fixedRate{rate: 1}
	pacer, err := pacing.New(pacing.Config{}, r)
	require.NoError(t, err)
	ports := pipeline.Ports{Source: newFakeSource(), DeadLetters: &fakeDLQ{}, Sink: newFakeSink(), Retry: sink.Policy{}, Pacer: pacer, Capacity: r}
	_, err = pipeline.New(pipeline.Config{MaxBatch: -1}, ports)
	require.ErrorContains(t, err, "must not be negative")
}
