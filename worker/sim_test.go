package worker_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/sinkwire"
	"github.com/sluicehq/sluice/worker"
)

// The tests of this package run whole workers — built by worker.New, with
// their real lease managers, pacers and pipelines — inside a
// testing/synctest bubble: Redis is miniredis on in-memory connections
// (net.Pipe), and the sink is the sink emulator behind sluice's HTTP client,
// served in-process; so every timer, TTL and sliding window runs on virtual
// time.
// Only the queue is a fake (records from memory instead of Kafka). The
// emulator and the requests' transit times are the oracle: the sink side of
// the rate promise is judged where the sink accepts each record, exactly,
// whatever the load on the machine running the test.

// world is one bubble's services: a Redis, a throttled sink, and a shared
// queue the workers drain.
type world struct {
	t     *testing.T
	mr    *miniredis.Miniredis
	redis redis.UniversalClient
	sim   *sinksim.Sim
	serve http.Handler // the sink emulator behind the requests' transit
	queue *memQueue

	mu      sync.Mutex
	accepts []accept // every record the sink charged, in the order accepted
	sends   []accept // the same, at the instants they were sent
	transit func(n int) (in, out time.Duration)
	reqs    int
	workers []*worker.Worker
	began   time.Time // when the world began: accepts are offsets from it
}

// accept is a charge at the sink: when, how many units.
type accept struct {
	at    time.Duration // since the world began
	units int64
}

// bubblePoolSize is the Redis connections a world's client may open.
const bubblePoolSize = 512

// newWorld starts a world; call it inside a bubble. The sink emulator
// admits at capacity units/s in its strict window mode unless cfg says
// otherwise; requests take transit(n) to reach it and as long back for the
// n-th request (default 1 ms each way).
func newWorld(t *testing.T, cfg sinksim.Config) *world {
	t.Helper()
	w := &world{t: t, queue: &memQueue{}, began: time.Now()}
	w.transit = func(int) (time.Duration, time.Duration) { return time.Millisecond, time.Millisecond }
	if cfg.Mode == "" {
		cfg.Mode = sinksim.ModeWindow
	}
	var err error
	w.sim, err = sinksim.New(cfg)
	require.NoError(t, err)
	sim := w.sim.Handler()
	w.serve = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/records" {
			sim.ServeHTTP(rw, r)
			return
		}
		sent := time.Since(w.began)
		w.mu.Lock()
		w.reqs++
		in, out := w.transit(w.reqs)
		w.mu.Unlock()
		time.Sleep(in)
		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, r) // admitted here, at one instant
		w.note(sent, time.Since(w.began), rec.Body.Bytes())
		time.Sleep(out)
		for k, v := range rec.Header() {
			rw.Header()[k] = v
		}
		rw.WriteHeader(rec.Code)
		_, _ = rw.Write(rec.Body.Bytes())
	})
	w.mr = miniredis.NewMiniRedis()
	w.mr.ClockTTL(true)
	w.redis = redis.NewClient(&redis.Options{
		Dialer: func(context.Context, string, string) (net.Conn, error) { return w.mr.Dial() },
		// No DNS lookup of the (unused) address inside the bubble.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		// More connections than the workers ever use at once (an acquire
		// tries many partitions together): go-redis waits for a connection
		// with a timer from a pool shared by the whole process, which a
		// bubble must never take from another (a fatal error).
		PoolSize: bubblePoolSize,
	})
	t.Cleanup(func() {
		_ = w.redis.Close()
		w.mr.Close()
	})
	return w
}

// note records the units the sink charged in one answer, sent at sent and
// admitted at at.
func (w *world) note(sent, at time.Duration, body []byte) {
	var res sinkwire.Response
	if json.Unmarshal(body, &res) != nil {
		return
	}
	var units int64
	for _, r := range res.Results {
		if r.Status == sinkwire.StatusStored || r.Status == sinkwire.StatusDuplicate {
			units += max(r.Charge, 1)
		}
	}
	if units > 0 {
		w.mu.Lock()
		w.accepts = append(w.accepts, accept{at, units})
		i, _ := slices.BinarySearchFunc(w.sends, sent, func(a accept, t time.Duration) int { return cmp.Compare(a.at, t+1) })
		w.sends = slices.Insert(w.sends, i, accept{sent, units})
		w.mu.Unlock()
	}
}

// busiest returns the most units the sink accepted in any sliding window
// of width that starts at or after from.
func (w *world) busiest(width, from time.Duration) int64 {
	return w.busiestBetween(width, from, time.Duration(math.MaxInt64))
}

// busiestBetween returns the most units the sink accepted in any sliding
// window of width that lies within [from, to).
func (w *world) busiestBetween(width, from, to time.Duration) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return busiestOf(w.accepts, width, from, to)
}

// busiestSent returns the most units sent (of those the sink charged) in
// any sliding window of width that starts at or after from: the pacing as
// the workers did it, before the requests' transit moved it.
func (w *world) busiestSent(width, from time.Duration) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return busiestOf(w.sends, width, from, time.Duration(math.MaxInt64))
}

// busiestOf returns the most units of events (in time order) in any
// sliding window of width within [from, to).
func busiestOf(events []accept, width, from, to time.Duration) int64 {
	var most int64
	for i, a := range events {
		if a.at < from || a.at+width > to {
			continue
		}
		var sum int64
		for _, b := range events[i:] {
			if b.at-a.at >= width {
				break
			}
			sum += b.units
		}
		most = max(most, sum)
	}
	return most
}

// series returns the units the sink accepted in each consecutive step.
func (w *world) series(step time.Duration) []int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []int64
	for _, a := range w.accepts {
		i := int(a.at / step)
		for len(out) <= i {
			out = append(out, 0)
		}
		out[i] += a.units
	}
	return out
}

// lastAccept returns when the sink accepted its latest record.
func (w *world) lastAccept() time.Duration {
	_, last := w.span()
	return last
}

// span returns the first and last acceptance.
func (w *world) span() (first, last time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.accepts) == 0 {
		return 0, 0
	}
	return w.accepts[0].at, w.accepts[len(w.accepts)-1].at
}

// pool stores a pool definition and returns it.
func (w *world) pool(p lease.Pool) lease.Pool {
	w.t.Helper()
	p, err := lease.EnsurePool(w.t.Context(), w.redis, "", p)
	require.NoError(w.t, err)
	return p
}

// sink returns a client of the world's sink emulator.
func (w *world) sink() *sink.HTTPSink { return w.sinkVia(w.serve) }

// sinkVia returns a client whose requests h serves.
func (w *world) sinkVia(h http.Handler) *sink.HTTPSink {
	w.t.Helper()
	s, err := sink.NewHTTP(sink.HTTPConfig{URL: "http://sink.test", Client: &http.Client{Transport: inProcess{h}}})
	require.NoError(w.t, err)
	return s
}

// stalledSink returns a client of the world's sink whose record requests
// sent within [at, at+stall) of every period reach the sink only at the
// stall's end: a worker whose process was descheduled, or whose path
// queued its requests, while its peers' requests go through.
func (w *world) stalledSink(period, at, stall time.Duration) *sink.HTTPSink {
	w.t.Helper()
	return w.sinkVia(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if in := time.Since(w.began) % period; r.URL.Path == "/v1/records" && in >= at && in < at+stall {
			time.Sleep(at + stall - in)
		}
		w.serve.ServeHTTP(rw, r)
	}))
}

// start builds a worker with cfg (its Redis and dead letters filled in,
// and its Source the world's queue and its Sink a client of the world's
// sink unless cfg has them) and runs it,
// with its attachments beside it, until the returned stop is called.
func (w *world) start(id string, cfg worker.Config, attach ...func(*worker.Worker) ingest.Runner) (stop func() error) {
	w.t.Helper()
	cfg.WorkerID = id
	if cfg.Source == nil {
		cfg.Source = w.queue
	}
	cfg.Redis = []redis.UniversalClient{w.redis}
	if cfg.Sink == nil {
		cfg.Sink = w.sink()
	}
	cfg.DeadLetters = w.queue
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	wk, err := worker.New(cfg)
	require.NoError(w.t, err)
	for _, a := range attach {
		wk.Attach(a(wk))
	}
	w.mu.Lock()
	w.workers = append(w.workers, wk)
	w.mu.Unlock()
	ctx, cancel := context.WithCancel(context.WithoutCancel(w.t.Context()))
	done := make(chan error, 1)
	go func() { done <- wk.Run(ctx) }()
	return func() error { cancel(); return <-done }
}

// drain runs the workers until every record of the queue is finished (or
// limit passes) and stops them.
func (w *world) drain(limit time.Duration, stops ...func() error) {
	w.t.Helper()
	deadline := time.Now().Add(limit)
	for !w.queue.finished() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for _, stop := range stops {
		require.NoError(w.t, stop())
	}
	require.True(w.t, w.queue.finished(), "not drained within %s: %d of %d done", limit, w.queue.doneCount(), w.queue.len())
}

// memQueue is a queue all the workers share (a consumer group that hands
// out records as they ask), and their dead-letter topic.
type memQueue struct {
	mu      sync.Mutex
	recs    []ingest.Record
	added   []time.Time // when each record was added
	next    int
	done    map[int64]int
	doneAt  map[int64]time.Time // when each record was first done
	letters []ingest.DeadLetter
	wake    chan struct{}
}

var (
	_ ingest.Source      = (*memQueue)(nil)
	_ ingest.Lagger      = (*memQueue)(nil)
	_ ingest.DeadLetters = (*memQueue)(nil)
)

// add appends records with these values.
func (q *memQueue) add(values ...string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.done == nil {
		q.done, q.doneAt = map[int64]int{}, map[int64]time.Time{}
	}
	now := time.Now()
	for _, v := range values {
		q.recs = append(q.recs, ingest.Record{Value: []byte(v), Pos: ingest.Position{Topic: "t", Offset: int64(len(q.recs))}})
		q.added = append(q.added, now)
	}
	if q.wake != nil {
		close(q.wake)
		q.wake = nil
	}
}

func (q *memQueue) Fetch(ctx context.Context) (ingest.Record, error) {
	for {
		q.mu.Lock()
		if q.next < len(q.recs) {
			r := q.recs[q.next]
			q.next++
			q.mu.Unlock()
			return r, nil
		}
		if q.wake == nil {
			q.wake = make(chan struct{})
		}
		wake := q.wake
		q.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ingest.Record{}, ctx.Err()
		}
	}
}

func (q *memQueue) Done(r ingest.Record) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.done[r.Pos.Offset]++; q.done[r.Pos.Offset] == 1 {
		q.doneAt[r.Pos.Offset] = time.Now()
	}
}

// latencies returns, for every record added in [from, to), how long after
// it was added it was done, in the order added; a record not done yet
// counts as waiting until now.
func (q *memQueue) latencies(from, to time.Time) []time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []time.Duration
	for i, at := range q.added {
		if at.Before(from) || !at.Before(to) {
			continue
		}
		done, ok := q.doneAt[int64(i)]
		if !ok {
			done = time.Now()
		}
		out = append(out, done.Sub(at))
	}
	return out
}

func (q *memQueue) Lag() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int64(len(q.recs) - q.next)
}

func (q *memQueue) DeadLetter(_ context.Context, letters ...ingest.DeadLetter) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.letters = append(q.letters, letters...)
	return nil
}

func (q *memQueue) finished() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.done) == len(q.recs)
}

func (q *memQueue) doneCount() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.done)
}

func (q *memQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.recs)
}

// inProcess serves requests with a handler in the same goroutine, with no
// connection: an HTTP client for a testing/synctest bubble.
type inProcess struct{ h http.Handler }

func (p inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	p.h.ServeHTTP(rec, r)
	res := rec.Result()
	res.Request = r
	return res, nil
}

// records returns n USGS-shaped records with IDs prefix-0…, padded with
// pad bytes.
func records(prefix string, n int, pad func(i int) int) []string {
	out := make([]string, n)
	for i := range out {
		var b bytes.Buffer
		fmt.Fprintf(&b, `{"id":"%s-%d","mag":%d.%d`, prefix, i, i%7, i%10)
		if pad != nil {
			fmt.Fprintf(&b, `,"pad":"%s"`, bytes.Repeat([]byte("x"), pad(i)))
		}
		b.WriteByte('}')
		out[i] = b.String()
	}
	return out
}

// stored returns how many distinct records the sink stored.
func (w *world) stored() int64 { return w.sim.Stats().Accepted }

// ids returns the dead letters' reasons.
func (q *memQueue) reasons() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for _, l := range q.letters {
		out = append(out, l.Reason)
	}
	return slices.Clip(out)
}
