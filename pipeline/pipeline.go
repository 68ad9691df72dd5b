package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/ingest"
)

// Config configures a Pipeline. Zero fields take the documented
// default.
type Config struct {
	// Pricing prices each record in the pool's unit. Defaults to 1 per
	// record.
	Pricing ingest.Pricing
	// IDField names the JSON field holding a record's ID (its idempotency
	// key). Empty: a content hash (see RecordID). A record without the
	// field, or with it empty, is dead-lettered.
	IDField string
	// MaxBatch is the most records in one sink request. Defaults to
	// DefaultMaxBatch (100).
	MaxBatch int
	// Concurrency is the most sink requests in flight at once. Defaults to
	// DefaultConcurrency (16).
	Concurrency int
	// MaxInFlightBytes bounds memory: the most bytes of records fetched
	// but not yet finished (queued, being written, waiting to be retried
	// or dead-lettered), each counted as its key, value and ID plus
	// ingest.RecordOverhead. The fetcher stops while the bound is reached, so one
	// record may take it past by its own size. Defaults to
	// DefaultMaxInFlightBytes (64 MiB). Short of it, the pipeline keeps
	// only about two slices' budget or half a second of its leased rate
	// fetched ahead (at least one record, to sense a backlog), and holds
	// back at most two slices' budget of records for hot key ranges, so
	// records are dequeued only when there is capacity to write them and a
	// group rebalance strands few of them. It bounds what is in flight at
	// any instant, not what a slice may send: a slice whose budget is not
	// used up when it has sent what was fetched goes on taking records as
	// they are fetched until its budget or its time is used.
	MaxInFlightBytes int64
	// MaxInFlight, when > 0, also bounds the records fetched but not yet
	// finished by their number. Default 0: no bound of its own; the byte
	// bound holds at most MaxInFlightBytes ÷ ingest.RecordOverhead records.
	MaxInFlight int
	// MaxRecordCost is one second of the whole pool's capacity, in units. A
	// record costing more can never be written without exceeding the pool,
	// so it is dead-lettered. 0: no limit.
	MaxRecordCost int64
	// Slice is the pacer's slice: a slice's sends are spread evenly over
	// it. Defaults to DefaultSlice (200 ms).
	Slice time.Duration
	// RequestTimeout is the deadline the pipeline puts on every sink write.
	// Defaults to DefaultRequestTimeout (2 s). The lease margin must cover
	// it (see lease.Config.RequestTimeout), and a sink's own timeouts must
	// fit inside it.
	RequestTimeout time.Duration
	// MaxRetryAfter caps how long a sink's Retry-After holds a throttled
	// record's key range; the retry policy caps the pauses of the sink by
	// the same value. Defaults to ingest.DefaultMaxRetryAfter (30 s).
	MaxRetryAfter time.Duration
	// Grace is how long in-flight writes and dead letters may go on after
	// ctx is done before they are cancelled (their records are then
	// redelivered). Defaults to DefaultGrace (10 s).
	Grace time.Duration
	// ReadyAfter is how long a failure may last before Ready reports it:
	// the sink paused, the dead-letter topic or the queue unreachable.
	// Defaults to DefaultReadyAfter (30 s).
	ReadyAfter time.Duration
	// StallTimeout makes Run return a *StalledError when one of those
	// failures has lasted this long. 0 (the default): Run waits for the
	// failure to pass, however long.
	StallTimeout time.Duration
	// LeaseAhead makes the pipeline announce a backlog from the start,
	// before it has fetched anything, so its leases are taken and its
	// first slice is full when the first record arrives. For bulk loads,
	// whose backlog is known before it is produced; from the first fetch
	// on, demand follows the records as usual. Default false.
	LeaseAhead bool
	// Start, when not nil, holds the first fetch until it is closed.
	Start <-chan struct{}
	// Logger receives the pipeline's logs. Default: slog.Default().
	Logger *slog.Logger
	// Counters receives the running totals; several pipelines may share
	// one. Default: a Counters of the pipeline's own.
	Counters *ingest.Counters
	// ObserveWrite, when set, is called after every sink write attempt with
	// the batch size in records and how long the attempt took (metrics).
	ObserveWrite func(records int, took time.Duration)
	// Processor applies the record type's rules (validation, enrichment,
	// sink key) to each fetched record after its ID is set and before it is
	// priced. Default: none.
	Processor ingest.Processor
}

// withDefaults fills the zero fields of c and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.MaxBatch < 0 || c.Concurrency < 0 || c.MaxInFlight < 0 || c.MaxInFlightBytes < 0 || c.MaxRecordCost < 0 ||
		c.Slice < 0 || c.RequestTimeout < 0 || c.MaxRetryAfter < 0 || c.Grace < 0 || c.ReadyAfter < 0 || c.StallTimeout < 0 {
		return c, errors.New("ingest: pipeline limits and durations must not be negative")
	}
	c.MaxBatch = cmp.Or(c.MaxBatch, ingest.DefaultMaxBatch)
	c.Concurrency = cmp.Or(c.Concurrency, ingest.DefaultConcurrency)
	c.MaxInFlightBytes = cmp.Or(c.MaxInFlightBytes, ingest.DefaultMaxInFlightBytes)
	c.Slice = cmp.Or(c.Slice, ingest.DefaultSlice)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, ingest.DefaultRequestTimeout)
	c.Grace = cmp.Or(c.Grace, ingest.DefaultGrace)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, ingest.DefaultMaxRetryAfter)
	c.ReadyAfter = cmp.Or(c.ReadyAfter, ingest.DefaultReadyAfter)
	c.Pricing.Unit = cmp.Or(c.Pricing.Unit, ingest.UnitRecords)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Counters == nil {
		c.Counters = new(ingest.Counters)
	}
	return c, nil
}

// fetchedCap is the most records in flight: MaxInFlight when set, else
// what the byte bound can hold.
func (c Config) fetchedCap() int {
	if c.MaxInFlight > 0 {
		return c.MaxInFlight
	}
	return int(max(c.MaxInFlightBytes/ingest.RecordOverhead, 1)) + 1
}

// Ports are the adapters a Pipeline drives. Every field is required.
type Ports struct {
	Source      ingest.Source
	DeadLetters ingest.DeadLetters
	Sink        ingest.Sink
	Retry       ingest.RetryPolicy
	Pacer       ingest.Pacer
	Capacity    ingest.Capacity
}

// Pipeline is the worker pipeline of one process: queue → pacer → sink,
// with commit hand-off and dead-lettering. Create it with New and
// start it with Run.
type Pipeline struct {
	cfg Config
	p   Ports
	log *slog.Logger
	c   *ingest.Counters

	inFlight inFlight      // records fetched and not finished
	requests chan struct{} // one per sink request in flight
	fetched  chan *item    // fetched records waiting for budget
	prefetch atomic.Int64  // records to keep in fetched
	demand   demand
	wake     chan struct{} // pokes the fetcher every slice
	filled   chan struct{} // the fetcher reached the prefetch target

	mu       sync.Mutex
	retries  batchHeap // batches and records waiting out a backoff
	suspects []suspect // records of answers with every record Retryable, waiting for evidence

	breaker      breaker
	ranges       keyRanges // throttle feedback per key range
	letters      letterQueue
	fetchFailing atomic.Int64 // unix ns since Fetch has been failing; 0 when it is not

	owner   ingest.Owner // the source, when it can lose records
	dropped int64        // records dropped because the source lost them (slice loop only)
	spacing spacing      // the last send's instant and step (slice loop only)
	owed    atomic.Int64
	charges chargeRatio

	fetchErrLog, letterErrLog, letterLog rate.Sometimes
}

// item is a record in flight.
type item struct {
	rec       ingest.Record
	bytes     int64  // what it counts against MaxInFlightBytes, fixed when fetched
	base      int64  // the record's price by the rule, before the learned charge ratio
	attempts  int    // attempts the sink answered Retryable, not throttled
	throttles int    // attempts the sink answered throttled
	invalid   string // reason to dead-letter without writing, if set
}

// New checks cfg and ports and returns a Pipeline.
func New(cfg Config, p Ports) (*Pipeline, error) {
	if p.Source == nil || p.DeadLetters == nil || p.Sink == nil || p.Retry == nil || p.Pacer == nil || p.Capacity == nil {
		return nil, errors.New("ingest: a pipeline needs a source, dead letters, sink, retry policy, pacer and capacity")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	pl := &Pipeline{
		cfg:          cfg,
		p:            p,
		log:          cfg.Logger,
		c:            cfg.Counters,
		requests:     make(chan struct{}, cfg.Concurrency),
		fetched:      make(chan *item, cfg.fetchedCap()),
		wake:         make(chan struct{}, 1),
		filled:       make(chan struct{}, 1),
		letterErrLog: rate.Sometimes{Interval: 5 * time.Second},
		fetchErrLog:  rate.Sometimes{Interval: 5 * time.Second},
		letterLog:    rate.Sometimes{First: 10, Interval: 5 * time.Second},
	}
	pl.inFlight.init(cfg.MaxInFlightBytes, int64(cfg.MaxInFlight))
	pl.breaker.init(p.Retry, cfg.Logger)
	pl.ranges.init(cfg.Slice, time.Now(), cfg.Counters, cfg.Logger)
	pl.letters.init()
	return pl, nil
}

// Counters returns the pipeline's running totals.
func (p *Pipeline) Counters() *ingest.Counters { return p.c }

// SinkPaused reports whether the pipeline has paused its sink after a
// failure of a whole request, and since when.
func (p *Pipeline) SinkPaused() (paused bool, since time.Time) { return p.breaker.paused() }

// SinkError returns the latest failure of a whole write (or of the sink's
// warm-up), "" before any: why a paused sink is paused.
func (p *Pipeline) SinkError() string { return p.breaker.lastErr() }

// SinkPausedTotal returns how long the sink has been paused in all, the
// current pause included.
func (p *Pipeline) SinkPausedTotal() time.Duration { return p.breaker.pausedTotal(time.Now()) }

// Waiting is what a pipeline holds that is not done yet, in records, by
// where it waits: what a load that stopped advancing is diagnosed by.
type Waiting struct {
	Fetched  int // fetched from the source, not taken into a slice yet
	Retrying int // waiting for another attempt: a backoff, the end of a sink's pause, or evidence about an answer that refused every record
	Held     int // held back by a hot key range, for its rate
	Requests int // write requests sent and not answered yet
}

// Waiting returns what the pipeline holds at the moment, by where it
// waits. Safe for concurrent use with Run.
func (p *Pipeline) Waiting() Waiting {
	return Waiting{Fetched: len(p.fetched), Retrying: p.retrying(), Held: int(p.ranges.heldRecords()), Requests: len(p.requests)}
}

// retrying counts the records waiting for another attempt: the retries
// and the suspects.
func (p *Pipeline) retrying() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.suspects)
	for _, u := range p.retries {
		n += len(u.items)
	}
	return n
}

// Run drains the source until ctx is done. Then it stops fetching, lets
// in-flight writes and dead letters finish within the grace period
// (cancelling the rest), announces zero demand and returns nil. Records
// not finished by then are not marked Done and so are redelivered by the
// queue.
//
// With Config.StallTimeout set, Run stops the same way and returns
// a *StalledError when the pipeline cannot make progress for that long:
// the sink stays paused, or the dead-letter topic or the queue stays
// unreachable.
func (p *Pipeline) Run(ctx context.Context) error {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	writeCtx, cancelWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWrites()

	p.demand.leaseAhead, p.demand.slice = p.cfg.LeaseAhead, p.cfg.Slice
	p.owner, _ = p.p.Source.(ingest.Owner)
	if l, ok := p.p.Source.(ingest.Lagger); ok {
		p.demand.lag = l.Lag
	}
	p.p.Capacity.SetDemand(p.demand.estimate(time.Now(), false, 0, -1, -1, 0, 0, true))

	closing := make(chan struct{})
	var fetching, writing, background sync.WaitGroup
	background.Go(func() { p.deadLetters(writeCtx, closing) })
	background.Go(func() { p.watch(ctx, stop) })
	raw := make(chan *item, rawQueue)
	fetching.Go(func() { p.fetch(ctx, raw) })
	fetching.Go(func() { p.prepareAll(raw) })
	p.warm(ctx)
	p.slices(ctx, writeCtx, &writing)
	fetching.Wait()

	drained := make(chan struct{})
	go func() {
		writing.Wait()
		close(closing)
		background.Wait()
		close(drained)
	}()
	timer := time.NewTimer(p.cfg.Grace)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
		p.log.Warn("grace period over, cancelling writes", "grace", p.cfg.Grace)
		cancelWrites()
		<-drained
	}
	p.p.Capacity.SetDemand(0)
	if se := (*StalledError)(nil); errors.As(context.Cause(ctx), &se) {
		return se
	}
	return nil
}

// warm opens the sink's connections before the first slice, so its first
// requests are not slowed by handshakes. A sink that does not answer is
// paused, as if its first write had failed.
func (p *Pipeline) warm(ctx context.Context) {
	w, ok := p.p.Sink.(ingest.Warmer)
	if !ok {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	defer cancel()
	if err := w.Warm(wctx, p.cfg.Concurrency); err != nil && ctx.Err() == nil {
		p.breaker.failure(time.Now(), err)
	}
}

// Ready returns nil while the pipeline can make progress, and an error
// naming the failure once one has lasted Config.ReadyAfter: the
// sink paused, the dead-letter topic unreachable, the queue unreachable.
func (p *Pipeline) Ready() error {
	if f := p.failing(time.Now()); f.age >= p.cfg.ReadyAfter {
		return f.err()
	}
	return nil
}

// chargeRatio learns the ratio of the sink's reported charges to the
// records' prices by the rule, as an exponentially weighted average over
// records (weight 1/50 each, so it settles within a few slices), kept
// within [0.1, 10]. The zero value is ready and answers 1.
type chargeRatio struct {
	mu    sync.Mutex
	ratio float64 // 0: nothing observed yet
}

func (c *chargeRatio) observe(estimate, charge int64) {
	r := min(max(float64(charge)/float64(max(estimate, 1)), 0.1), 10)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ratio == 0 {
		c.ratio = r
		return
	}
	c.ratio += (r - c.ratio) / 50
}

func (c *chargeRatio) factor() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ratio == 0 {
		return 1
	}
	return c.ratio
}

// finish marks it Done and frees its slot.
func (p *Pipeline) finish(it *item, now time.Time) {
	p.p.Source.Done(it.rec)
	p.c.NoteDone(now)
	p.inFlight.release(it.bytes)
}

// drop lets go of a record the source no longer owns: it is not sent and
// not Done, so its new owner gets it.
func (p *Pipeline) drop(it *item) {
	p.dropped++
	if p.dropped == 1 || p.dropped%1000 == 0 {
		p.log.Info("records of a reassigned partition dropped unsent", "source", it.rec.Pos.String(), "dropped", p.dropped)
	}
	p.inFlight.release(it.bytes)
}

// describe names a record for logs and dead-letter reasons.
func describe(rec ingest.Record) string {
	if rec.ID == "" {
		return fmt.Sprintf("record %s", rec.Pos)
	}
	return fmt.Sprintf("record %s (id %s)", rec.Pos, rec.ID)
}
