package ingest

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// WorkerConfig configures a Worker. Zero fields take the documented default.
type WorkerConfig struct {
	// Pricing prices each record in the pool's unit. Default: 1 per record.
	Pricing Pricing
	// IDField names the JSON field holding a record's ID (its idempotency
	// key). Empty, or absent from a record: a content hash (see RecordID).
	IDField string
	// MaxBatch is the most records in one sink request. Default 100.
	MaxBatch int
	// Concurrency is the most sink requests in flight at once. Default 16.
	Concurrency int
	// MaxInFlight is the most records fetched but not yet finished (queued,
	// being written or waiting to be retried), a hard bound on memory.
	// Default 10,000 records. Short of it, the worker keeps only about two
	// slices' budget or half a second of its leased rate fetched ahead (at
	// least one record, to sense a backlog), so records are dequeued only when there is capacity to
	// write them and a group rebalance strands few of them.
	MaxInFlight int
	// MaxRecordCost is one second of the whole pool's capacity, in units. A
	// record costing more can never be written without exceeding the pool,
	// so it is dead-lettered. 0: no limit.
	MaxRecordCost int64
	// Grace is how long in-flight writes may go on after ctx is done before
	// they are cancelled (their records are then redelivered). Default 10 s.
	Grace time.Duration
	// LeaseAhead makes the worker announce a backlog from the start, before
	// it has fetched anything, so its leases are taken and its first slice
	// is full when the first record arrives. For bulk loads, whose backlog
	// is known before it is produced; from the first fetch on, demand
	// follows the records as usual. Default false.
	LeaseAhead bool
	// Start, when not nil, holds the worker's first fetch until it is
	// closed (bulk-load opens it once the first records are produced).
	Start <-chan struct{}
	// Logger receives the worker's logs. Default: slog.Default().
	Logger *slog.Logger
	// Counters receives the running totals; several workers may share one.
	// Default: a Counters of the worker's own.
	Counters *Counters
	// ObserveWrite, when set, is called after every sink write attempt with
	// the batch size in records and how long the attempt took (metrics).
	ObserveWrite func(records int, took time.Duration)
	// Processor applies the record type's rules (validation, enrichment,
	// sink key) to each fetched record after its ID is set and before it is
	// priced. Default: none.
	Processor Processor
}

// Ports are the adapters a Worker drives. Every field is required.
type Ports struct {
	Source      Source
	DeadLetters DeadLetters
	Sink        Sink
	Retry       RetryPolicy
	Pacer       Pacer
	Capacity    Capacity
}

// Worker is the pipeline of one process: queue → pacer → sink, with commit
// hand-off and dead-lettering. Create it with NewWorker and start it with Run.
type Worker struct {
	cfg WorkerConfig
	p   Ports
	log *slog.Logger
	c   *Counters

	slots    chan struct{} // one per record in flight
	fetched  chan *item    // fetched records waiting for budget
	prefetch atomic.Int64  // records to keep in fetched
	demand   demand
	wake     chan struct{} // pokes the fetcher every slice
	filled   chan struct{} // the fetcher reached the prefetch target

	mu      sync.Mutex
	retries retryHeap // records waiting out a backoff

	writeErrLog, fetchErrLog logLimiter
	owner                    Owner        // the source, when it can lose records
	dropped                  int64        // records dropped because the source lost them
	owed                     atomic.Int64 // units the sink charged beyond the estimates, to charge at the next slice
	charges                  chargeRatio  // what the sink charges per unit of price by the rule
}

// item is a record in flight.
type item struct {
	rec      Record
	base     int64     // the record's price by the rule, before the learned charge ratio
	attempts int       // write attempts the sink answered
	failures int       // write attempts that failed as a whole (sink unreachable)
	due      time.Time // earliest next attempt (retries)
	invalid  string    // reason to dead-letter without writing, if set
}

// NewWorker checks cfg and ports and returns a Worker.
func NewWorker(cfg WorkerConfig, p Ports) (*Worker, error) {
	if p.Source == nil || p.DeadLetters == nil || p.Sink == nil || p.Retry == nil || p.Pacer == nil || p.Capacity == nil {
		return nil, errors.New("ingest: worker needs a source, dead letters, sink, retry policy, pacer and capacity")
	}
	if cfg.MaxBatch < 0 || cfg.Concurrency < 0 || cfg.MaxInFlight < 0 || cfg.MaxRecordCost < 0 || cfg.Grace < 0 {
		return nil, errors.New("ingest: worker limits must not be negative")
	}
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, 100)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 16)
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, 10_000)
	cfg.Grace = cmp.Or(cfg.Grace, 10*time.Second)
	cfg.Pricing.Unit = cmp.Or(cfg.Pricing.Unit, UnitRecords)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Counters == nil {
		cfg.Counters = new(Counters)
	}
	return &Worker{
		cfg:     cfg,
		p:       p,
		log:     cfg.Logger,
		c:       cfg.Counters,
		slots:   make(chan struct{}, cfg.MaxInFlight),
		fetched: make(chan *item, cfg.MaxInFlight),
		wake:    make(chan struct{}, 1),
		filled:  make(chan struct{}, 1),
	}, nil
}

// Counters returns the worker's running totals.
func (w *Worker) Counters() *Counters { return w.c }

// Run drains the source until ctx is done. Then it stops fetching, lets
// in-flight writes finish within the grace period (cancelling the rest),
// announces zero demand and returns nil. Records not finished by then are
// not marked Done and so are redelivered by the queue.
func (w *Worker) Run(ctx context.Context) error {
	writeCtx, cancelWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWrites()

	w.demand.leaseAhead = w.cfg.LeaseAhead
	w.owner, _ = w.p.Source.(Owner)
	if l, ok := w.p.Source.(Lagger); ok {
		w.demand.lag = l.Lag
	}
	w.p.Capacity.SetDemand(w.demand.estimate(time.Now(), false, true))
	var fetching, writing sync.WaitGroup
	fetching.Go(func() { w.fetch(ctx) })
	w.slices(ctx, writeCtx, &writing)
	fetching.Wait()

	drained := make(chan struct{})
	go func() { writing.Wait(); close(drained) }()
	timer := time.NewTimer(w.cfg.Grace)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
		w.log.Warn("grace period over, cancelling writes", "grace", w.cfg.Grace)
		cancelWrites()
		<-drained
	}
	w.p.Capacity.SetDemand(0)
	return nil
}

// fetch reads the source into w.fetched while there are free slots and
// fewer than the prefetch target are waiting.
func (w *Worker) fetch(ctx context.Context) {
	if w.cfg.Start != nil {
		select {
		case <-w.cfg.Start:
		case <-ctx.Done():
			return
		}
	}
	for {
		for int64(len(w.fetched)) >= max(w.prefetch.Load(), 1) {
			select {
			case <-w.wake:
			case <-ctx.Done():
				return
			}
		}
		select {
		case w.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		w.demand.fetchingSince.Store(time.Now().UnixNano())
		rec, err := w.p.Source.Fetch(ctx)
		w.demand.fetchingSince.Store(0)
		if err != nil {
			<-w.slots
			if ctx.Err() != nil {
				return
			}
			if w.fetchErrLog.allow(time.Now()) {
				w.log.Error("fetch failed, retrying", "err", err)
			}
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
			continue
		}
		w.c.noteFetch(time.Now())
		w.demand.started.Store(true)
		w.fetched <- w.prepare(rec)
		if int64(len(w.fetched)) >= w.prefetch.Load() {
			select {
			case w.filled <- struct{}{}:
			default:
			}
		}
	}
}

// prepare validates a fetched record and sets its ID and cost.
func (w *Worker) prepare(rec Record) *item {
	it := &item{rec: rec}
	rec.Cost, it.base = w.price(rec.Value)
	if !isJSONObject(rec.Value) {
		it.invalid = fmt.Sprintf("record %s: value is not a JSON object", rec.Pos)
	}
	if rec.ID == "" {
		id, err := RecordID(rec.Value, w.cfg.IDField)
		if err != nil {
			id = ContentID(rec.Value)
			it.invalid = cmp.Or(it.invalid, fmt.Sprintf("record %s: %v", rec.Pos, err))
		}
		rec.ID = id
	}
	if w.cfg.Processor != nil && it.invalid == "" {
		out, err := w.cfg.Processor.Process(rec)
		if err != nil {
			it.invalid = fmt.Sprintf("record %s (id %s): %v", rec.Pos, rec.ID, err)
		} else {
			rec = out
			rec.Cost, it.base = w.price(rec.Value)
		}
	}
	if w.cfg.MaxRecordCost > 0 && rec.Cost > w.cfg.MaxRecordCost {
		it.invalid = fmt.Sprintf("record %s (id %s) costs %d %s, more than one second of the whole pool (%d)",
			rec.Pos, rec.ID, rec.Cost, w.cfg.Pricing.Unit, w.cfg.MaxRecordCost)
	}
	it.rec = rec
	return it
}

// price returns the record's cost: its base price by the pricing rule,
// scaled by what the sink has been charging per unit of base price when it
// reports charges, so that estimates follow the sink's real rule and the
// corrections stay small.
func (w *Worker) price(value []byte) (cost, base int64) {
	base = w.cfg.Pricing.Price(value)
	cost = base
	if f := w.charges.factor(); f != 1 {
		cost = max(int64(math.Ceil(f*float64(base)-1e-9)), 1)
	}
	return cost, base
}

// chargeRatio learns the ratio of the sink's reported charges to the
// records' prices by the rule, as an exponentially weighted average over records
// (weight 1/50 each, so it settles within a few slices), kept within
// [0.1, 10]. The zero value is ready and answers 1.
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

func isJSONObject(b []byte) bool {
	var obj map[string]json.RawMessage
	return json.Unmarshal(b, &obj) == nil && obj != nil
}

// slices is the slice loop: every slice, take at most the budget's worth of
// records and send them.
func (w *Worker) slices(ctx, writeCtx context.Context, writing *sync.WaitGroup) {
	var head *item
	requests := make(chan struct{}, w.cfg.Concurrency)
	for {
		if head == nil {
			head = w.next(time.Now())
		}
		if head == nil {
			// Idle: wait for a record rather than a slice, so the first
			// one is sent at once (the pacer opens a slice immediately
			// when the last one is over).
			w.setDemand(false)
			w.setPrefetch(0, 1)
			var ok bool
			if head, ok = w.await(ctx); !ok {
				return
			}
			if head == nil {
				continue
			}
		}
		want := head.rec.Cost
		budget, err := w.p.Pacer.Next(ctx, want)
		if err != nil {
			return
		}
		w.setPrefetch(budget, want)
		var take []*item
		var spent int64
		for {
			if head == nil {
				head = w.next(time.Now())
			}
			if head == nil {
				break
			}
			if w.owner != nil && !w.owner.Owns(head.rec) {
				w.drop(head)
				head = nil
				continue
			}
			if head.invalid != "" {
				it := head
				writing.Go(func() { w.deadLetter(writeCtx, it, it.invalid) })
				head = nil
				continue
			}
			if head.rec.Cost > budget-spent {
				break
			}
			take = append(take, head)
			spent += head.rec.Cost
			head = nil
		}
		w.demand.recent.add(time.Now(), spent)
		w.setDemand(head != nil)
		w.log.Debug("slice", "budget", budget, "spent", spent, "records", len(take), "queued", len(w.fetched))
		if owed := w.owed.Swap(0); spent+owed > 0 {
			// What the sink charged beyond the estimates is charged now,
			// on top of this slice (debt if the bucket cannot cover it).
			w.p.Pacer.Spend(spent + owed)
			w.c.unitsSent.Add(spent + owed)
			w.c.unitsCorrected.Add(owed)
		}
		if spent == 0 {
			continue
		}
		for batch := range chunks(take, w.cfg.MaxBatch) {
			select {
			case requests <- struct{}{}:
			case <-ctx.Done():
				// Not sent: these records stay un-Done and are redelivered.
				return
			}
			writing.Go(func() {
				defer func() { <-requests }()
				w.write(writeCtx, batch)
			})
		}
	}
}

// idleWait bounds how long an idle worker waits for a record before it
// looks at its retries and demand again.
const idleWait = 100 * time.Millisecond

// settleWait bounds the wait for a queue to fill after an idle spell.
const settleWait = 20 * time.Millisecond

// await waits for a fetched record, a retry coming due, or idleWait,
// whichever comes first. ok is false once ctx is done.
func (w *Worker) await(ctx context.Context) (it *item, ok bool) {
	wait := idleWait
	w.mu.Lock()
	if len(w.retries) > 0 {
		wait = min(wait, time.Until(w.retries[0].due))
	}
	w.mu.Unlock()
	timer := time.NewTimer(max(wait, 0))
	defer timer.Stop()
	select {
	case it = <-w.fetched:
		w.settle(ctx)
		return it, true
	case <-timer.C:
		return w.next(time.Now()), true
	case <-ctx.Done():
		return nil, false
	}
}

// settle gives the fetcher up to settleWait to queue the records that came
// with the first one after an idle spell, so the slice about to open is not
// spent on a handful of them.
func (w *Worker) settle(ctx context.Context) {
	timer := time.NewTimer(settleWait)
	defer timer.Stop()
	for int64(len(w.fetched))+1 < w.prefetch.Load() {
		select {
		case <-w.filled:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// setDemand announces the worker's demand; backlog: records are waiting
// beyond this slice's budget.
func (w *Worker) setDemand(backlog bool) {
	w.mu.Lock()
	retrying := len(w.retries)
	w.mu.Unlock()
	idle := retrying == 0 && len(w.fetched) == 0
	w.p.Capacity.SetDemand(w.demand.estimate(time.Now(), backlog, idle))
	if br, ok := w.p.Capacity.(BacklogReporter); ok {
		units := -1.0
		if w.demand.lag != nil {
			if lag := w.demand.lag(); lag >= 0 {
				units = float64(lag+int64(len(w.fetched)+retrying)) * w.c.Totals().unitsPerRecord()
			}
		}
		br.SetBacklog(units)
	}
}

// setPrefetch keeps fetched ahead the larger of two slices' budget and half
// a second at the leased rate (so a worker whose lease was just granted
// fills its next slice), estimating a record's cost by the one waiting (1
// when none), and wakes the fetcher once a slice.
func (w *Worker) setPrefetch(budget, headCost int64) {
	units := max(2*budget, int64(w.p.Capacity.Rate(time.Now())/2))
	w.prefetch.Store(units / max(headCost, 1))
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// next returns the next record to send: a retry that is due, else a fetched
// record, else nil.
func (w *Worker) next(now time.Time) *item {
	w.mu.Lock()
	if len(w.retries) > 0 && !w.retries[0].due.After(now) {
		it := heap.Pop(&w.retries).(*item)
		w.mu.Unlock()
		return it
	}
	w.mu.Unlock()
	select {
	case it := <-w.fetched:
		return it
	default:
		return nil
	}
}

// write makes one attempt at a batch and routes every record by its result.
func (w *Worker) write(ctx context.Context, batch []*item) {
	recs := make([]Record, len(batch))
	for i, it := range batch {
		recs[i] = it.rec
	}
	w.c.requests.Add(1)
	w.c.attempts.Add(int64(len(batch)))
	began := time.Now()
	results, err := w.p.Sink.Write(ctx, recs)
	if w.cfg.ObserveWrite != nil {
		w.cfg.ObserveWrite(len(recs), time.Since(began))
	}
	if ctx.Err() != nil {
		return // shutting down: redelivered later
	}
	if err == nil && len(results) != len(recs) {
		err = fmt.Errorf("sink returned %d results for %d records", len(results), len(recs))
	}
	now := time.Now()
	if err != nil {
		// The sink never judged these records (unreachable, timeout): retry
		// them without using up their attempts, however long it lasts.
		w.c.failedWrites.Add(1)
		if w.writeErrLog.allow(now) {
			w.log.Warn("sink write failed, retrying", "records", len(batch), "err", err)
		}
		for _, it := range batch {
			it.failures++
			wait, ok := w.p.Retry.Backoff(min(it.failures, 4), 0)
			if !ok {
				wait, _ = w.p.Retry.Backoff(1, 0)
			}
			w.retry(it, now.Add(wait))
		}
		return
	}
	throttled := false
	defer func() {
		if fb, ok := w.p.Pacer.(ThrottleFeedback); ok && throttled {
			fb.Throttled()
		}
	}()
	for i, it := range batch {
		res := results[i]
		it.attempts++
		switch res.Outcome {
		case Delivered, Duplicate:
			if res.Charge > 0 {
				w.charges.observe(it.base, res.Charge)
			}
			if res.Charge > it.rec.Cost {
				w.owed.Add(res.Charge - it.rec.Cost)
			}
			if res.Outcome == Duplicate {
				w.c.duplicates.Add(1)
			}
			w.c.delivered.Add(1)
			w.c.unitsDelivered.Add(it.rec.Cost)
			w.finish(it, now)
		case Retryable:
			if res.Throttled {
				w.c.throttled.Add(1)
				throttled = true
			} else {
				w.c.retryable.Add(1)
			}
			wait, ok := w.p.Retry.Backoff(it.attempts, res.RetryAfter)
			if !ok {
				w.deadLetter(ctx, it, fmt.Sprintf("gave up after %d attempts: %s", it.attempts, res.Reason))
				continue
			}
			w.retry(it, now.Add(wait))
		default:
			w.c.permanent.Add(1)
			w.deadLetter(ctx, it, res.Reason)
		}
	}
}

// retry schedules it for another attempt at due.
func (w *Worker) retry(it *item, due time.Time) {
	w.c.retried.Add(1)
	it.due = due
	w.mu.Lock()
	heap.Push(&w.retries, it)
	w.mu.Unlock()
}

// logLimiter lets a repeated log line through at most once per interval.
type logLimiter struct {
	mu   sync.Mutex
	last time.Time
}

func (l *logLimiter) allow(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.last) < 5*time.Second {
		return false
	}
	l.last = now
	return true
}

// deadLetter stores it in the dead-letter topic, trying until it succeeds or
// ctx is done (then the record is left un-Done and will be redelivered).
func (w *Worker) deadLetter(ctx context.Context, it *item, reason string) {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		err := w.p.DeadLetters.DeadLetter(ctx, it.rec, reason)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		w.log.Error("dead-letter write failed, retrying", "record_id", it.rec.ID, "err", err)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
	w.log.Warn("record dead-lettered", "record_id", it.rec.ID, "source", it.rec.Pos.String(), "reason", reason)
	w.c.deadLettered.Add(1)
	w.finish(it, time.Now())
}

// drop lets go of a record the source no longer owns: it is not sent and
// not Done, so its new owner gets it.
func (w *Worker) drop(it *item) {
	w.dropped++
	if w.dropped == 1 || w.dropped%1000 == 0 {
		w.log.Info("records of a reassigned partition dropped unsent", "source", it.rec.Pos.String(), "dropped", w.dropped)
	}
	<-w.slots
}

func (w *Worker) finish(it *item, now time.Time) {
	w.p.Source.Done(it.rec)
	w.c.noteDone(now)
	<-w.slots
}

// chunks yields consecutive sub-slices of s of at most n elements.
func chunks[T any](s []T, n int) func(func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k:k]) {
				return
			}
			s = s[k:]
		}
	}
}

// retryHeap orders records waiting for a retry by due time.
type retryHeap []*item

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h retryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *retryHeap) Push(x any)        { *h = append(*h, x.(*item)) }
func (h *retryHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}
