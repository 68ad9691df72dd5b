package pipeline

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// sendsPerSlice is how many requests a slice's budget is spread over (as
// far as MaxBatch allows more): the sends of a slice leave at even
// intervals across it, not as one burst at its start, so the busiest
// 200 ms at the sink holds about one slice's budget and bursts of several
// workers do not align. A sliding 200 ms holds one send more than a slice
// of each worker's when they flow evenly, and two where a late send meets
// the next on time; a send is a worker's share ÷ sendsPerSlice, so the
// excess is about 1-2 ÷ sendsPerSlice slices however many workers share
// the pool. At 20 sends that sat on the 1.1-slice target: the end-to-end
// rate cases measured up to 1.103 slices (441 records of 400 with three
// workers at 2,000 records/s). At 30, the paths of the worker package's
// TestSinkSideSecondHoldsWithSeveralWorkers put 414-430 records in the
// busiest 200 ms at the sink (420-438 at 20), for 1.5 × the requests.
const sendsPerSlice = 30

// idleWait bounds how long an idle pipeline waits for a record before it
// looks at its retries and demand again.
const idleWait = 100 * time.Millisecond

// settleWait bounds the wait for a queue to fill after an idle spell.
const settleWait = 20 * time.Millisecond

// batch is what is sent in one request. A batch that failed as a
// whole is retried as it was (keep), so that its idempotency key, derived
// from its records' IDs, stays the same; a record answered Retryable is
// retried alone and may join other records in its next batch.
type batch struct {
	items []*item
	cost  int64
	due   time.Time
	keep  bool
	epoch int64 // the breaker's successes when the batch was sent
}

func newBatch(items []*item) *batch {
	u := &batch{items: items}
	for _, it := range items {
		u.cost += it.rec.Cost
	}
	return u
}

// slices is the slice loop: every slice, take at most the budget's worth of
// records and send them, spread over the slice.
func (p *Pipeline) slices(ctx, writeCtx context.Context, writing *sync.WaitGroup) {
	var head *item // the next fresh record, fetched but not taken
	for {
		until, changed, probe := p.breaker.gate(time.Now())
		if changed != nil {
			// The sink is paused: take nothing, spend no budget, until
			// the pause is over (or a probe's answer arrives).
			if !waitFor(ctx, until, changed) {
				return
			}
			continue
		}
		if head == nil {
			head = p.nextFresh()
		}
		due := p.dueCost(time.Now())
		if (!probe || (head == nil && due == 0 && p.ranges.heldRecords() == 0)) && p.releaseSuspects(time.Now()) {
			// A probe with nothing else to send re-sends the suspects (see
			// suspect); and once the sink works they are retried.
			due = p.dueCost(time.Now())
		}
		if head == nil && due == 0 && p.ranges.heldRecords() == 0 {
			// Idle: wait for a record rather than a slice, so the first
			// one is sent at once (the pacer opens a slice immediately
			// when the last one is over).
			if probe {
				p.breaker.cancelProbe()
			}
			p.setDemand(false, 0, nil)
			p.setPrefetch(0, 1)
			var ok bool
			if head, ok = p.await(ctx); !ok {
				return
			}
			continue
		}
		want := due
		if want == 0 && head != nil {
			want = head.rec.Cost
		}
		budget, err := p.p.Pacer.Next(ctx, want)
		if err != nil {
			return
		}
		// The slice ends a slice after it opened, whatever the settle
		// below takes: its sends must not run into the next slice's.
		end := time.Now().Add(p.cfg.Slice)
		if g, ok := p.p.Pacer.(ingest.GuardReporter); ok && budget > 0 {
			p.c.NoteGuard(g.Guard())
		}
		p.setPrefetch(budget, want)
		if int64(len(p.fetched))*want < budget && p.demand.lagging() {
			// More waits in the queue than was fetched for this budget
			// (the first slice, or a rate that just rose): give the
			// fetcher a moment rather than spend the slice on a handful.
			p.settle(ctx)
		}
		open := time.Now()
		var batches []*batch
		var spent int64
		batches, head, spent = p.take(open, budget, head, probe, 0)
		if probe && len(batches) == 0 {
			p.breaker.cancelProbe()
		}
		// Capped: records wait that this slice's budget could not take.
		// What was taken is still to be sent over the slice, each send
		// when the account has room: until then the worker is not idle,
		// or the leases it needs could go back to the pool.
		p.setDemand(head != nil || p.dueCost(open) > 0 || p.ranges.heldRecords() > 0, spent, head)
		if owed := p.owed.Swap(0); owed > 0 {
			// What the sink charged beyond the estimates is charged now,
			// on top of this slice (debt if the bucket cannot cover it).
			switch sent, err := p.p.Pacer.Spend(ctx, owed); {
			case errors.Is(err, ingest.ErrNoRate):
				p.owed.Add(owed) // charged once a rate comes back
			case err != nil:
				return
			default:
				sent.Answered()
				p.c.Count(ingest.EventUnitsCorrected, owed)
				p.c.NoteSent(sent.At, owed)
			}
		}
		if p.log.Enabled(ctx, slog.LevelDebug) {
			p.log.Debug("slice", "budget", budget, "spent", spent, "requests", len(batches), "queued", len(p.fetched))
		}
		// The sends flow at the budget's rate: over the whole slice when
		// the budget is used, over its share of it when the queue ran dry
		// first (the last records of a load are not held back).
		span := end.Sub(open)
		if budget > 0 && spent < budget && !p.ranges.holding() {
			span = time.Duration(float64(span) * float64(spent) / float64(budget))
		}
		cut, ok := p.dispatch(ctx, writeCtx, writing, batches, open, span)
		if !ok {
			return
		}
		if !cut && !probe && !p.ranges.active() {
			// (With hot key ranges in play the budget is left unspent
			// on purpose: their records wait for their range's rate.)
			var ok bool
			if head, ok = p.topUp(ctx, writeCtx, writing, end, budget, spent, head); !ok {
				return
			}
		}
	}
}

// topUp goes on spending a slice ending at end with budget units, spent
// of them sent, while its time lasts: the records fetched since it opened
// are taken and sent at the budget's rate. Without it, what a slice sends
// would be bounded by what was in flight when it opened, and the pipeline
// by that bound ÷ the slice, however fast the sink. Nothing is sent beyond
// the budget Next gave, so the pacing is the same. It returns the fresh
// record it could not fit (the new head); ok is false once ctx is done.
func (p *Pipeline) topUp(ctx, writeCtx context.Context, writing *sync.WaitGroup, end time.Time, budget, spent int64, head *item) (_ *item, ok bool) {
	for spent < budget {
		if head == nil {
			if head = p.nextFresh(); head == nil {
				// The slice ran dry and its sends are out: a worker whose
				// source caught up says what it asks for now, not at the
				// next slice, so that leases it no longer needs reach
				// peers with backlogs at once (not one whose queue is
				// only between two fetches, which would give its leases
				// back and take them again).
				announced := p.demand.caughtUp(time.Now())
				if announced {
					p.setDemand(false, 0, nil)
				}
				if head, ok = p.awaitUntil(ctx, end); !ok {
					return nil, false
				}
				if head == nil {
					return nil, true
				}
				if announced {
					// A record came after all: asked for before it is
					// sent, or its send would wait for credit on leases
					// given back (and the slice loop with it, for good).
					p.setDemand(false, 0, head)
				}
			}
		}
		if !p.gather(ctx, end) {
			return nil, false
		}
		now := time.Now()
		if paused, _ := p.breaker.paused(); paused || !now.Before(end) || p.ranges.active() {
			return head, true
		}
		var batches []*batch
		var n int64
		batches, head, n = p.take(now, budget-spent, head, false, p.cfg.MaxBatch)
		if len(batches) == 0 {
			return head, true
		}
		// At the budget's rate: n units take n/budget of the slice.
		span := min(time.Duration(float64(p.cfg.Slice)*float64(n)/float64(budget)), end.Sub(now))
		spent += n
		if cut, ok := p.dispatch(ctx, writeCtx, writing, batches, now, span); !ok || cut {
			return head, ok
		}
	}
	return head, true
}

// gatherWait bounds how long a slice's top-up waits for a full batch.
const gatherWait = 5 * time.Millisecond

// gather gives the fetcher up to gatherWait (and no later than end) to
// queue a full batch beside the head record, so that records fetched while
// a slice tops up go out in full batches rather than one by one. It stops
// waiting as soon as the fetcher is held by the in-flight bound. It
// returns false once ctx is done.
func (p *Pipeline) gather(ctx context.Context, end time.Time) bool {
	if len(p.fetched)+1 >= p.cfg.MaxBatch || p.inFlight.held.Load() {
		return true
	}
	timer := time.NewTimer(min(gatherWait, max(time.Until(end), 0)))
	defer timer.Stop()
	for len(p.fetched)+1 < p.cfg.MaxBatch && !p.inFlight.held.Load() {
		select {
		case <-p.filled:
		case <-timer.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// awaitUntil waits until end for a fetched record that can be sent. ok is
// false once ctx is done.
func (p *Pipeline) awaitUntil(ctx context.Context, end time.Time) (it *item, ok bool) {
	timer := time.NewTimer(max(time.Until(end), 0))
	defer timer.Stop()
	for {
		select {
		case it = <-p.fetched:
			if it = p.admit(it); it != nil {
				return it, true
			}
		case <-timer.C:
			return nil, true
		case <-ctx.Done():
			return nil, false
		}
	}
}

// take returns the batches to send in a slice of budget units opened at
// now: the retries that are due, then fresh records, in batches spread for
// sendsPerSlice requests, or of size records each when size > 0. With
// probe, it takes one batch only. It returns the fresh record it could not
// fit (the new head) and the units taken.
func (p *Pipeline) take(now time.Time, budget int64, head *item, probe bool, size int) (batches []*batch, rest *item, spent int64) {
	var fresh []*item
	for {
		u := p.popDue(now, budget-spent)
		if u == nil {
			break
		}
		if !u.keep {
			var n int64
			fresh, n = p.rangeAdmit(now, u.items, fresh)
			spent += n
			continue
		}
		if probe && len(fresh) > 0 {
			// The probe is one request: the records already taken make
			// it, and the batch waits for the next slice.
			p.pushRetry(u)
			break
		}
		if !probe && p.ranges.active() && !p.ranges.admitBatch(now, u) {
			// A range it writes to is full: it waits a slice.
			u.due = now.Add(p.cfg.Slice)
			p.pushRetry(u)
			continue
		}
		spent += u.cost
		batches = append(batches, u)
		if probe {
			return batches, head, spent
		}
	}
	if p.ranges.active() {
		var n int64
		fresh, n = p.releaseHeld(now, budget-spent, fresh)
		spent += n
		if probe && len(fresh) > p.cfg.MaxBatch {
			// The probe is one request: the rest wait as retries.
			for _, it := range fresh[p.cfg.MaxBatch:] {
				spent -= it.rec.Cost
				b := newBatch([]*item{it})
				b.due = now
				p.pushRetry(b)
			}
			fresh = fresh[:p.cfg.MaxBatch]
		}
	}
	for {
		if head == nil {
			head = p.nextFresh()
		}
		if head == nil || head.rec.Cost > budget-spent || (probe && len(fresh) == p.cfg.MaxBatch) {
			break
		}
		if p.ranges.active() {
			// Its key range is hot: held back (up to two slices' budget
			// of records held in all), or left in line.
			if v := p.ranges.admit(now, head, true, 2*budget); v != rangeSend {
				if v == rangeFull {
					break
				}
				head = nil
				continue
			}
		}
		fresh = append(fresh, head)
		spent += head.rec.Cost
		head = nil
	}
	if len(fresh) == 0 {
		return batches, head, spent
	}
	if size <= 0 {
		size = min(max((len(fresh)+sendsPerSlice-1)/sendsPerSlice, 1), p.cfg.MaxBatch)
	}
	if probe {
		size = len(fresh)
	}
	for len(fresh) > 0 {
		n := min(size, len(fresh))
		batches = append(batches, newBatch(fresh[:n:n]))
		fresh = fresh[n:]
	}
	return batches, head, spent
}

// dispatch sends batches, the i-th of n at open + i × span/n (later by
// what the account held back, and the first no sooner than half a step
// after the previous dispatch's last send, see spacing), each through
// the pacer's account and a request slot. When the worker's rate rose
// since the slice opened (ingest.RiseReporter), it stops: the batches not
// sent are taken again, first, by the slice the pacer then opens at once
// with the gain, and cut is true. ok is false once ctx is done; the
// batches not sent then stay un-Done and are redelivered.
func (p *Pipeline) dispatch(ctx, writeCtx context.Context, writing *sync.WaitGroup, batches []*batch, open time.Time, span time.Duration) (cut, ok bool) {
	if len(batches) == 0 {
		return false, true
	}
	riser, _ := p.p.Pacer.(ingest.RiseReporter)
	step := span / time.Duration(len(batches))
	shift := p.spacing.carry(open, step) // how long sends were held back so far, or must wait for the last
	for i, u := range batches {
		// On schedule; a send the account or the request bound held back
		// shifts the ones after it by as much, so they keep their spacing
		// instead of going in a bunch (a hold shorter than half a step
		// once put two sends of every worker within a few ms of each
		// other a second after a load's first slices, when the accounts
		// fill: a sliding 200 ms at the sink then held 1.1 slices), while
		// a busy machine's late wake-ups shift them only beyond half a
		// step, so that their small delays do not add up over the slice.
		due := open.Add(shift + time.Duration(i)*step)
		if !sleepUntil(ctx, due) {
			return false, false
		}
		if p.breaker.halted() {
			// A write failed as a whole since the slice opened: what is
			// left waits for the sink to answer again.
			p.requeue(batches[i:], true)
			return false, true
		}
		if i > 0 && riser != nil && riser.Rose() {
			p.requeue(batches[i:], false)
			return true, true
		}
		if !u.keep && p.ranges.active() {
			// A range may have been found or cut since the slice opened.
			if u = p.ranges.recheck(time.Now(), open, u); u == nil {
				continue
			}
		}
		woke := time.Now()
		if late := woke.Sub(due); late > step/2 {
			shift += late
		}
		select {
		case p.requests <- struct{}{}:
		case <-ctx.Done():
			return false, false
		}
		sent, err := p.p.Pacer.Spend(ctx, u.cost)
		if err != nil {
			<-p.requests
			if !errors.Is(err, ingest.ErrNoRate) {
				return false, false
			}
			// The leases went while the send waited: what is left goes
			// back in line, and the slice loop announces the demand that
			// brings them back.
			p.requeue(batches[i:], false)
			return false, true
		}
		p.c.NoteSent(sent.At, u.cost)
		// Counted once sent: a batch that a cut slice requeues counts
		// once, in the slice that sends it.
		p.demand.recent.add(sent.At, u.cost)
		shift += max(sent.At.Sub(woke), 0)
		p.spacing.sent(sent.At, step)
		u.epoch = p.breaker.successes()
		writing.Go(func() {
			defer func() { <-p.requests }()
			p.write(writeCtx, u, sent.Answered)
		})
	}
	return false, true
}

// nextFresh returns the next fetched record that can be sent, without
// waiting: records the source no longer owns are dropped, invalid ones
// are dead-lettered.
func (p *Pipeline) nextFresh() *item {
	for {
		select {
		case it := <-p.fetched:
			if it = p.admit(it); it != nil {
				return it
			}
		default:
			return nil
		}
	}
}

// admit passes it on, or drops or dead-letters it and returns nil.
func (p *Pipeline) admit(it *item) *item {
	switch {
	case p.owner != nil && !p.owner.Owns(it.rec):
		p.drop(it)
	case it.invalid != "":
		p.c.Count(ingest.EventInvalid, 1)
		p.deadLetter(it, it.invalid)
	default:
		return it
	}
	return nil
}

// await waits for a fetched record, a retry coming due, or idleWait,
// whichever comes first. ok is false once ctx is done.
func (p *Pipeline) await(ctx context.Context) (it *item, ok bool) {
	wait := idleWait
	p.mu.Lock()
	if len(p.retries) > 0 {
		wait = min(wait, time.Until(p.retries[0].due))
	}
	p.mu.Unlock()
	timer := time.NewTimer(max(wait, 0))
	defer timer.Stop()
	select {
	case it = <-p.fetched:
		p.settle(ctx)
		return p.admit(it), true
	case <-timer.C:
		return nil, true
	case <-ctx.Done():
		return nil, false
	}
}

// settle gives the fetcher up to settleWait to queue the records that came
// with the first one after an idle spell, so the slice about to open is not
// spent on a handful of them.
func (p *Pipeline) settle(ctx context.Context) {
	timer := time.NewTimer(settleWait)
	defer timer.Stop()
	for int64(len(p.fetched))+1 < p.prefetch.Load() && !p.inFlight.held.Load() {
		select {
		case <-p.filled:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// setDemand announces the pipeline's demand and backlog; capped: records
// are waiting beyond this slice's budget; sending: the units the slice
// took and has yet to send; head: the record at the head of the line, nil
// when none.
func (p *Pipeline) setDemand(capped bool, sending int64, head *item) {
	retrying := p.retrying()
	held := p.ranges.heldRecords()
	retrying += int(held)
	idle := retrying == 0 && len(p.fetched) == 0 && sending == 0 && head == nil
	units, lagUnits := -1.0, -1.0 // waiting for the worker: its queue lag, fetched, retries; of which the lag
	if p.demand.lag != nil {
		if lag := p.demand.lag(); lag >= 0 {
			per := p.c.Totals().UnitsPerRecord()
			units, lagUnits = float64(lag+int64(len(p.fetched)+retrying))*per, float64(lag)*per
		}
	}
	waiting := units
	if head != nil && waiting >= 0 {
		waiting += float64(head.rec.Cost)
	}
	if held > 0 {
		waiting = -1 // records held for their key range's rate, not the pool's
	}
	now := time.Now()
	var guard time.Duration
	if g, ok := p.p.Pacer.(ingest.GuardReporter); ok {
		guard = g.Guard()
	}
	leased := p.p.Capacity.Rate(now)
	demand := p.demand.estimate(now, capped, sending, waiting, lagUnits, leased, guard, idle)
	if p.log.Enabled(context.Background(), slog.LevelDebug) { // the values are boxed even when the line is dropped
		p.log.Debug("demand", "units_per_s", demand, "leased", leased, "capped", capped, "sending", sending, "waiting", waiting, "lag", lagUnits)
	}
	p.p.Capacity.SetDemand(demand)
	if br, ok := p.p.Capacity.(ingest.BacklogReporter); ok {
		br.SetBacklog(units)
	}
}

// setPrefetch keeps fetched ahead the larger of two slices' budget and half
// a second at the leased rate (so a pipeline whose lease was just granted
// fills its next slice), estimating a record's cost by the one waiting (1
// when none), and wakes the fetcher once a slice.
func (p *Pipeline) setPrefetch(budget, headCost int64) {
	units := max(2*budget, int64(p.p.Capacity.Rate(time.Now())/2))
	p.prefetch.Store(units / max(headCost, 1))
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// requeue puts batches a slice did not send back in line, due now; keep
// marks them to be sent again as they are (see batch).
func (p *Pipeline) requeue(batches []*batch, keep bool) {
	now := time.Now()
	for _, u := range batches {
		u.due, u.keep = now, u.keep || keep
		p.pushRetry(u)
	}
}

// pushRetry schedules u for another attempt at u.due.
func (p *Pipeline) pushRetry(u *batch) {
	p.mu.Lock()
	heap.Push(&p.retries, u)
	p.mu.Unlock()
}

// popDue removes and returns the earliest retry if it is due at now and
// costs at most room; nil otherwise.
func (p *Pipeline) popDue(now time.Time, room int64) *batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.retries) == 0 || p.retries[0].due.After(now) || p.retries[0].cost > room {
		return nil
	}
	return heap.Pop(&p.retries).(*batch)
}

// dueCost returns the cost of the earliest retry if it is due at now, else 0.
func (p *Pipeline) dueCost(now time.Time) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.retries) == 0 || p.retries[0].due.After(now) {
		return 0
	}
	return p.retries[0].cost
}

// waitFor blocks until t (when not zero), until ch is closed, or until ctx
// is done; false when ctx is done.
func waitFor(ctx context.Context, t time.Time, ch <-chan struct{}) bool {
	var tc <-chan time.Time
	if !t.IsZero() {
		timer := time.NewTimer(max(time.Until(t), 0))
		defer timer.Stop()
		tc = timer.C
	}
	select {
	case <-tc:
	case <-ch:
	case <-ctx.Done():
		return false
	}
	return true
}

// sleepUntil blocks until t or until ctx is done; false when ctx is done.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// batchHeap orders batches waiting for a retry by due time.
type batchHeap []*batch

func (h batchHeap) Len() int           { return len(h) }
func (h batchHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h batchHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *batchHeap) Push(x any)        { *h = append(*h, x.(*batch)) }
func (h *batchHeap) Pop() any {
	old := *h
	u := old[len(old)-1]
	*h = old[:len(old)-1]
	return u
}

// spacing is when the slice loop's latest send went out, and the step
// between the sends of its dispatch (slice loop only).
type spacing struct {
	last time.Time
	step time.Duration
}

// sent notes a send at at, in a dispatch whose sends are step apart.
func (s *spacing) sent(at time.Time, step time.Duration) { s.last, s.step = at, step }

// carry is how far a dispatch starting at open, whose sends are step
// apart, must shift its first send so that it follows the latest send by
// at least half the shorter of their steps. A slice whose sends were held
// back opens late, as soon as its predecessor's last send is out; sent at
// once, its first send made the two a pair, and a sliding 200 ms held a
// slice and two sends. Half a step still lets a late slice catch up on
// the grid, so the holds' delays are not lost: on the path with
// stragglers of TestSinkSideSecondHoldsWithSeveralWorkers (worker) the
// busiest 200 ms as sent is 1.045-1.06 slices (1.075-1.09 without), and
// with a whole step 1.00-1.04 but utilization 0.004-0.014 lower. The
// shorter step, since a dispatch of a slice's only batch has the whole
// slice for its step.
func (s *spacing) carry(open time.Time, step time.Duration) time.Duration {
	if s.last.IsZero() {
		return 0
	}
	return max(s.last.Add(min(s.step, step)/2).Sub(open), 0)
}
