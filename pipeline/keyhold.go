package pipeline

import "time"

// What the hot key ranges let go and what they hold back: each range's
// token account and sliding second, the records it holds, its probes.

// refill adds the tokens earned since the last refill, up to one slice.
func (r *hotRange) refill(now time.Time) {
	if now.After(r.filled) {
		r.tokens += r.rate * now.Sub(r.filled).Seconds()
		r.filled = now
	}
}

// fits reports whether cost more units may go to r at now: the sink's
// Retry-After is over (or will be before the slice's second send), a token
// is left this slice, and the last second's account has room within ahead
// (a slice for records taken when it opens, which are sent across it; 0
// for one about to be sent), or is empty, for a record costing more than a
// second.
func (k *keyRanges) fits(now time.Time, r *hotRange, cost int64, ahead time.Duration) bool {
	if now.Add(k.slice / sendsPerSlice).Before(r.notBefore) {
		return false
	}
	r.refill(now)
	r.tokens = min(r.tokens, max(r.rate*k.slice.Seconds(), 1))
	at := max(k.at(now), r.last)
	if r.tokens <= 0 || (r.sent.Sum(at) > 0 && r.sent.WaitFor(at, 0, cost, max(int64(r.rate), cost)) > ahead) {
		r.limited = now
		return false
	}
	return true
}

// charge records cost units sent to r at now.
func (k *keyRanges) charge(now time.Time, r *hotRange, cost int64) {
	r.tokens -= float64(cost)
	r.last = max(r.last, k.at(now))
	r.sent.Add(r.last, cost)
}

// rangeVerdict is what take does with a record.
type rangeVerdict int

const (
	rangeSend rangeVerdict = iota // send it now
	rangeHeld                     // its range holds it back
	rangeFull                     // its range would hold it, but enough are held: leave it in line
)

// admit decides about a record about to be taken at now: sent now (and
// charged to its range, if it has one), or held back by its range (queued
// behind the records the range already holds). A fresh record is held only
// while the held records cost less than limit units; beyond it, it is left
// in line (rangeFull), so a range that takes every record (sequential keys)
// holds the worker to its rate with bounded memory.
func (k *keyRanges) admit(now time.Time, it *item, fresh bool, limit int64) rangeVerdict {
	k.mu.Lock()
	defer k.mu.Unlock()
	r := k.find(rangeKey(it.rec))
	if r == nil {
		return rangeSend
	}
	if r.waiting.len() == 0 && k.fits(now, r, it.rec.Cost, k.slice) {
		k.charge(now, r, it.rec.Cost)
		return rangeSend
	}
	if fresh && k.heldUnits+it.rec.Cost > limit {
		return rangeFull
	}
	k.hold(now, r, it, false)
	return rangeHeld
}

// admitBatch decides about a batch kept whole (retried as it was
// sent): it goes now, charged to its records' ranges, only if every one of
// them has room for its share; else it waits for a later slice.
func (k *keyRanges) admitBatch(now time.Time, u *batch) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	need := map[*hotRange]int64{}
	for _, it := range u.items {
		if r := k.find(rangeKey(it.rec)); r != nil {
			need[r] += it.rec.Cost
		}
	}
	for r, units := range need {
		if !k.fits(now, r, units, k.slice) {
			r.held = now
			return false
		}
	}
	for r, units := range need {
		k.charge(now, r, units)
	}
	return true
}

// hold queues it in r, first in line when it was throttled. k.mu is held.
func (k *keyRanges) hold(now time.Time, r *hotRange, it *item, first bool) {
	if first {
		r.waiting.pushFront(it)
	} else {
		r.waiting.push(it)
	}
	r.held = now
	k.heldUnits += it.rec.Cost
	k.heldCount++
	k.on.Store(true)
}

// requeue holds a throttled record in its range, first in line, and holds
// the range for the sink's Retry-After. False when its key is in no range.
func (k *keyRanges) requeue(now time.Time, it *item, retryAfter time.Duration) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	r := k.find(rangeKey(it.rec))
	if r == nil {
		return false
	}
	if until := now.Add(retryAfter); until.After(r.notBefore) {
		r.notBefore = until
	}
	k.hold(now, r, it, true)
	return true
}

// recheck looks again, just before a send, at the records of a batch taken
// when its slice opened: those whose range was found or cut since then are
// sent only if it has room now, else held. It returns what is left to
// send, nil when nothing is.
func (k *keyRanges) recheck(now, open time.Time, u *batch) *batch {
	k.mu.Lock()
	defer k.mu.Unlock()
	var keep []*item
	for i, it := range u.items {
		r := k.find(rangeKey(it.rec))
		switch {
		case r == nil || !r.changed.After(open):
		case k.fits(now, r, it.rec.Cost, 0):
			k.charge(now, r, it.rec.Cost)
		default:
			if keep == nil {
				keep = append(make([]*item, 0, len(u.items)), u.items[:i]...)
			}
			k.hold(now, r, it, false)
			continue
		}
		if keep != nil {
			keep = append(keep, it)
		}
	}
	switch {
	case keep == nil:
		return u
	case len(keep) == 0:
		return nil
	}
	return newBatch(keep)
}

// take moves the ranges on to now (probes, forgets quiet ones) and returns
// the held records that may be sent now, within room units, appended to
// out, and their cost. tail: nothing is waiting but what the ranges hold
// (the end of a backlog), so they probe as fast as they can.
func (k *keyRanges) take(now time.Time, room int64, out []*item, tail bool) ([]*item, int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var spent int64
	for len(k.released) > 0 && k.released[0].rec.Cost <= room-spent {
		it := k.released[0]
		k.released = k.released[1:]
		spent += it.rec.Cost
		out = append(out, it)
	}
	for i := 0; i < len(k.hot); i++ {
		r := k.hot[i]
		if now.Sub(r.throttled) >= rangeQuiet && now.Sub(r.held) >= rangeQuiet && r.waiting.len() == 0 {
			k.forget(i)
			i--
			continue
		}
		k.probe(now, r, tail)
		for r.waiting.len() > 0 {
			it := r.waiting.peek()
			if it.rec.Cost > room-spent || !k.fits(now, r, it.rec.Cost, k.slice) {
				break
			}
			r.waiting.pop()
			k.charge(now, r, it.rec.Cost)
			spent += it.rec.Cost
			out = append(out, it)
		}
	}
	k.countHeld()
	k.on.Store(len(k.hot) > 0 || len(k.released) > 0)
	return out, spent
}

// countHeld recounts the records held. k.mu is held.
func (k *keyRanges) countHeld() {
	var units, count int64
	for _, r := range k.hot {
		for it := range r.waiting.all() {
			units += it.rec.Cost
			count++
		}
	}
	for _, it := range k.released {
		units += it.rec.Cost
		count++
	}
	k.heldUnits, k.heldCount = units, count
}

// probe raises a range that holds records back once its hold is over: by
// rangeProbe of its ceiling every slice while near the ceiling, then by a
// step that doubles every slice once past rangeGrowth × the ceiling (at
// once when the ceiling is unknown or only held records are left: tail),
// so a range the store split is found within a few slices and one it did
// not is probed gently. k.mu is held.
func (k *keyRanges) probe(now time.Time, r *hotRange, tail bool) {
	if now.Before(r.probeAt) || now.Sub(r.limited) > 2*k.slice {
		return // holding, or its rate is not what holds its records back
	}
	switch {
	case r.step == 0 && (r.peak == 0 || tail):
		r.step = r.rate
	case r.step == 0:
		r.step = rangeProbe * max(r.peak, r.rate)
	case r.peak == 0 || tail || r.rate >= rangeGrowth*r.peak:
		r.step *= 2
	}
	// Never far above what it sent in the last second (with this slice's
	// share): the sink's sliding second shows an excess only once it has
	// been sent. At the tail, what is left is all there is to send.
	next := r.rate + r.step
	if !tail {
		sent := float64(r.sent.Sum(max(k.at(now), r.last))) + r.rate*k.slice.Seconds()
		next = min(next, rangeLead*sent)
	}
	r.rate = max(r.rate, next)
	r.probeAt = now.Add(k.slice)
}

// holding reports whether ranges hold records back.
func (k *keyRanges) holding() bool {
	if !k.active() {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.heldCount > 0
}

// heldRecords is how many records the ranges hold.
func (k *keyRanges) heldRecords() int64 {
	if !k.active() {
		return 0
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.heldCount
}

// keyMark is a key seen at an instant, with the units accepted for it.
type keyMark struct {
	key   string
	at    time.Duration
	units int64
}

// keyRing keeps the latest size marks; its buffer is allocated at the
// first one.
type keyRing struct {
	size int
	buf  []keyMark
	next int // where the next mark goes
	n    int // marks kept
}

func (r *keyRing) add(m keyMark) {
	if r.buf == nil {
		r.buf = make([]keyMark, r.size)
	}
	r.buf[r.next] = m
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// each calls fn on the marks, oldest first.
func (r *keyRing) each(fn func(keyMark)) {
	if r.n == 0 {
		return
	}
	start := (r.next - r.n + len(r.buf)) % len(r.buf)
	for i := range r.n {
		fn(r.buf[(start+i)%len(r.buf)])
	}
}

// itemQueue is a FIFO of records.
type itemQueue struct {
	items []*item
	head  int
}

func (q *itemQueue) len() int { return len(q.items) - q.head }

func (q *itemQueue) push(it *item) { q.items = append(q.items, it) }

func (q *itemQueue) pushFront(it *item) {
	if q.head > 0 {
		q.head--
		q.items[q.head] = it
		return
	}
	q.items = append([]*item{it}, q.items...)
}

func (q *itemQueue) peek() *item { return q.items[q.head] }

func (q *itemQueue) pop() *item {
	it := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head >= 1024 && 2*q.head >= len(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return it
}

// all yields the queued records in order.
func (q *itemQueue) all() func(func(*item) bool) {
	return func(yield func(*item) bool) {
		for _, it := range q.items[q.head:] {
			if !yield(it) {
				return
			}
		}
	}
}

// The pipeline's side of the key ranges: what take, dispatch and write ask.

// rangeAdmit appends to fresh the records of items their ranges let go now
// (charged to them) and holds the others; it returns fresh and the cost of
// what it appended.
func (p *Pipeline) rangeAdmit(now time.Time, items []*item, fresh []*item) ([]*item, int64) {
	var spent int64
	for _, it := range items {
		if p.ranges.active() && p.ranges.admit(now, it, false, 0) == rangeHeld {
			continue
		}
		fresh = append(fresh, it)
		spent += it.rec.Cost
	}
	return fresh, spent
}

// releaseHeld appends to fresh the held records whose ranges have room in
// a slice opened at now, within room units, and returns fresh and their
// cost. Records the source no longer owns are dropped.
func (p *Pipeline) releaseHeld(now time.Time, room int64, fresh []*item) ([]*item, int64) {
	n := len(fresh)
	tail := len(p.fetched) == 0 && !p.demand.lagging()
	fresh, spent := p.ranges.take(now, room, fresh, tail)
	if p.owner == nil {
		return fresh, spent
	}
	kept := fresh[:n]
	for _, it := range fresh[n:] {
		if !p.owner.Owns(it.rec) {
			spent -= it.rec.Cost
			p.drop(it)
			continue
		}
		kept = append(kept, it)
	}
	return kept, spent
}
