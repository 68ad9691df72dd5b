package pipeline

import (
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Throttle feedback per key range. A range-partitioned store (Azure
// Tables, Cloud Storage, OSS, Spanner; sink-sim --partition-limit) cuts its
// keys into lexicographic ranges with a limit each, so a 429 often says
// that one range is full, not that the sink is. The pipeline learns those
// ranges from the sink's answers and paces each hot range on its own; the
// rest of the slice's budget goes to the records headed elsewhere. See the
// package doc for the rules.
const (
	// rangeBackoff is the share of what a throttled range accepted in the
	// last second that it may send from then on.
	rangeBackoff = 0.95
	// rangeProbe is the step a range's rate rises by every slice once its
	// hold is over, as a share of its ceiling, while the rate is below
	// rangeGrowth × the ceiling; past it the step doubles every slice until
	// the next throttle.
	rangeProbe = 0.05
	// rangeHold is the wait after a throttle before a range's rate rises
	// again. It doubles, up to rangeMaxHold, while its probes keep finding
	// the same ceiling (within rangeGrowth), and falls back when one finds
	// more (the store split the range).
	rangeHold    = 500 * time.Millisecond
	rangeMaxHold = time.Second
	rangeGrowth  = 1.1
	// rangeLead caps a probe: a range's rate stays within this factor of
	// what it sent in the last second.
	rangeLead = 1.25
	// rangeQuiet is how long a range must go without a throttle and
	// without holding a record back before it is forgotten.
	rangeQuiet = 3 * time.Second
	// maxHotRanges bounds the ranges kept; beyond it the one throttled
	// least recently is forgotten.
	maxHotRanges = 256
	// acceptedMemory bounds the accepted keys remembered (about the last
	// second of them), to measure a range's rate.
	acceptedMemory = 8192
	// recentThrottles is how many throttled keys a range remembers, to
	// tell which side of a cool key is hot.
	recentThrottles = 8
)

// rangeKey is the key a record is stored under: its SinkKey, else its ID.
func rangeKey(rec ingest.Record) string {
	if rec.SinkKey != "" {
		return rec.SinkKey
	}
	return rec.ID
}

// bound is one end of a key range: a low end is inclusive, a high end
// exclusive; unbounded is −∞ as a low end and +∞ as a high end.
type bound struct {
	key       string
	unbounded bool
}

// atOrBelow reports whether low, as a low end, admits key.
func (low bound) atOrBelow(key string) bool { return low.unbounded || low.key <= key }

// above reports whether high, as a high end, admits key.
func (high bound) above(key string) bool { return high.unbounded || key < high.key }

// before reports whether a high end a is at or below a low end b: the
// ranges they end and start do not overlap.
func before(high, low bound) bool {
	return !high.unbounded && !low.unbounded && high.key <= low.key
}

// highBelow is the high end of a range holding hot but not cool (hot <
// cool): the shortest prefix of cool that hot does not start with. Keys
// sharing more with the cool key than with the hot one fall outside, so
// keys that grow from the cool one (the next sequence numbers of a cool
// partition) are not taken for hot.
func highBelow(hot, cool string) bound {
	n := commonPrefix(hot, cool)
	return bound{key: cool[:n+1]}
}

// lowAbove is the low end of a range holding hot but not cool (cool <
// hot): just past every key that starts with the shortest prefix of cool
// that hot does not start with (cool itself when hot extends it).
func lowAbove(cool, hot string) bound {
	n := commonPrefix(cool, hot)
	if n == len(cool) {
		return bound{key: cool + "\x00"}
	}
	return bound{key: cool[:n] + string([]byte{cool[n] + 1})}
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// hotRange is a key range the sink throttled: the keys from low up to
// high, paced at rate.
type hotRange struct {
	low, high bound
	rate      float64 // units/s it may send
	peak      float64 // units/s it accepted in the second before its last throttle; 0 unknown
	tokens    float64 // units it may send now, at most a slice at rate
	filled    time.Time
	sent      ingest.Window // units sent (or accepted before it was found) in the last second
	last      time.Duration // latest instant added to sent
	notBefore time.Time     // the sink's Retry-After
	changed   time.Time     // found, cut or split: slices opened before it recheck their records
	hold      time.Duration
	probeAt   time.Time // when the rate may rise again
	step      float64   // units/s of the last rise; 0 before the first since the throttle
	throttled time.Time // latest throttle
	held      time.Time // latest record held back
	limited   time.Time // latest time it had no room for a record
	hotKeys   []string  // recent throttled keys, a ring
	nextHot   int
	waiting   itemQueue // records held back: throttled ones first, then in order
}

func (r *hotRange) contains(key string) bool { return r.low.atOrBelow(key) && r.high.above(key) }

// keyRanges is a pipeline's throttle feedback per key range; the zero
// value is not ready, see init. Safe for concurrent use.
type keyRanges struct {
	slice time.Duration
	epoch time.Time
	on    atomic.Bool // ranges are hot or hold records: take and dispatch consult them

	c   *ingest.Counters
	log *slog.Logger

	mu                   sync.Mutex
	hot                  []*hotRange // by low end, disjoint
	accepted             keyRing     // keys accepted in about the last second
	released             []*item     // held by a range since forgotten: sent first
	heldUnits, heldCount int64       // what the ranges hold, released records included
}

func (k *keyRanges) init(slice time.Duration, now time.Time, c *ingest.Counters, log *slog.Logger) {
	k.slice, k.epoch, k.c, k.log = slice, now, c, log
	k.accepted.size = acceptedMemory
}

// active reports whether a range is hot or holds records, without a lock.
func (k *keyRanges) active() bool { return k.on.Load() }

// at is now as an offset on the ranges' timeline.
func (k *keyRanges) at(now time.Time) time.Duration { return max(now.Sub(k.epoch), 0) }

// minRate is the least rate of a range: one unit per slice.
func (k *keyRanges) minRate() float64 { return 1 / k.slice.Seconds() }

// find returns the range holding key, or nil. k.mu is held.
func (k *keyRanges) find(key string) *hotRange {
	i := k.index(key)
	if i < 0 || !k.hot[i].high.above(key) {
		return nil
	}
	return k.hot[i]
}

// index returns the index of the last range whose low end admits key, -1
// when none does. k.mu is held.
func (k *keyRanges) index(key string) int {
	return sort.Search(len(k.hot), func(i int) bool { return !k.hot[i].low.atOrBelow(key) }) - 1
}

// observe learns from one answer of the sink to a request sent at sent:
// items in request order with their results. A sink admits a request's
// records in order at one instant, so a record accepted after another of
// the same request was throttled is cool evidence: its range had room
// when the throttled one's was full, so it is in another range. The
// answer's throttled keys, taken in key order, make groups that no cool key
// separates; a group's range reaches, on each side, up to its nearest cool
// key (see highBelow and lowAbove), or without end when there is none,
// and never into a neighbouring range; a cool key inside a range splits
// it.
// observe returns whether the answer throttled every record and every one
// was in a range already known to be hot (a range-specific answer, not a
// failure of the whole request).
func (k *keyRanges) observe(now, sent time.Time, items []*item, results []ingest.Result) (explained bool) {
	at := k.at(now)
	first := -1
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, res := range results {
		switch {
		case res.Outcome == ingest.Delivered || res.Outcome == ingest.Duplicate:
			k.accepted.add(keyMark{key: rangeKey(items[i].rec), at: at, units: items[i].rec.Cost})
		case res.Outcome == ingest.Retryable && res.Throttled && first < 0:
			first = i
		}
	}
	if first < 0 {
		return false
	}
	explained = true
	var marks []keyMark // the evidence, in key order: units 1 hot, 0 cool
	var hot []string
	for i := first; i < len(results); i++ {
		key := rangeKey(items[i].rec)
		switch res := results[i]; {
		case res.Outcome == ingest.Retryable && res.Throttled:
			marks = append(marks, keyMark{key: key, units: 1})
			hot = append(hot, key)
			if r := k.find(key); r != nil {
				r.noteHot(key)
			} else {
				explained = false
			}
		case res.Outcome == ingest.Delivered || res.Outcome == ingest.Duplicate:
			marks = append(marks, keyMark{key: key})
		}
	}
	if len(hot) < len(results) {
		explained = false
	}
	for _, m := range marks {
		if m.units == 0 {
			k.split(now, m.key, hot)
		}
	}
	slices.SortFunc(marks, func(a, b keyMark) int { return strings.Compare(a.key, b.key) })
	cut := map[*hotRange]bool{}
	for i := 0; i < len(marks); {
		if marks[i].units == 0 {
			i++
			continue
		}
		j := i
		for j < len(marks) && marks[j].units == 1 {
			j++
		}
		low, high := bound{unbounded: true}, bound{unbounded: true}
		if i > 0 {
			low = lowAbove(marks[i-1].key, marks[i].key)
		}
		if j < len(marks) {
			high = highBelow(marks[j-1].key, marks[j].key)
		}
		for _, m := range marks[i:j] {
			r := k.find(m.key)
			if r == nil {
				if r = k.cover(now, m.key, low, high); r == nil {
					continue
				}
			} else if !cut[r] && sent.After(r.changed) {
				// Sent at its current rate and still throttled: cut it
				// (once per answer). A request sent before its last
				// change is old news.
				k.cut(now, r)
			}
			cut[r] = true
			r.throttled = now
			r.noteHot(m.key)
		}
		i = j
	}
	k.on.Store(true)
	return explained
}

func (r *hotRange) noteHot(key string) {
	if slices.Contains(r.hotKeys, key) {
		return
	}
	if len(r.hotKeys) < recentThrottles {
		r.hotKeys = append(r.hotKeys, key)
		return
	}
	r.hotKeys[r.nextHot] = key
	r.nextHot = (r.nextHot + 1) % recentThrottles
}

// cover finds the range of a throttled key that is in no range: within
// [low, high), the bounds its answer's cool keys allow, and never into a
// neighbouring range. Its rate is rangeBackoff × what its keys accepted in
// the last second, and that second's accepts count in its account. It
// returns nil when the bounds do not hold the key (a key both throttled
// and accepted in one answer). k.mu is held.
func (k *keyRanges) cover(now time.Time, key string, low, high bound) *hotRange {
	i := k.index(key) // the range below key, if any
	r := &hotRange{low: low, high: high, hold: rangeHold}
	if i >= 0 && !before(k.hot[i].high, low) {
		r.low = k.hot[i].high
	}
	if i+1 < len(k.hot) && !before(high, k.hot[i+1].low) {
		r.high = k.hot[i+1].low
	}
	if !r.contains(key) {
		return nil
	}
	accepted := k.fill(now, r)
	r.peak = accepted
	r.rate = max(rangeBackoff*accepted, k.minRate())
	r.changed, r.throttled, r.probeAt, r.filled = now, now, now.Add(r.hold), now
	k.hot = slices.Insert(k.hot, i+1, r)
	k.c.Count(ingest.EventHotRanges, 1)
	k.log.Debug("hot key range found", "low", r.low.key, "high", r.high.key, "rate", r.rate)
	if len(k.hot) > maxHotRanges {
		k.evict()
	}
	return r
}

// fill builds r's account from the keys accepted in it in the last second
// and returns their rate in units/s. k.mu is held.
func (k *keyRanges) fill(now time.Time, r *hotRange) float64 {
	at := k.at(now)
	r.sent, r.last = ingest.NewWindow(time.Second), 0
	var units int64
	oldest := at
	k.accepted.each(func(m keyMark) {
		if m.at <= at-time.Second {
			return
		}
		oldest = min(oldest, m.at)
		if r.contains(m.key) {
			units += m.units
			r.last = max(r.last, m.at)
			r.sent.Add(r.last, m.units)
		}
	})
	span := time.Second
	if k.accepted.n == k.accepted.size && at-oldest < time.Second {
		// The memory holds less than a second: scale to one.
		span = max(at-oldest, k.slice)
	}
	return float64(units) / span.Seconds()
}

// cut lowers a range the sink throttled although it kept to its rate:
// rangeBackoff × what it accepted in the last second, or half its rate when
// it accepted nothing. k.mu is held.
func (k *keyRanges) cut(now time.Time, r *hotRange) {
	k.c.Count(ingest.EventRangeCuts, 1)
	prev := r.peak
	r.refill(now)
	// The ceiling is what it accepted in the last second, or the rate it
	// was held to when that is less: a second that includes records of
	// other ranges (retried after the store split) is no ceiling. Its
	// account holds what was accepted, as the sink's does, not the
	// refused sends.
	ceiling := min(k.fill(now, r), r.rate)
	if ceiling > 0 {
		r.peak = ceiling
		r.rate = rangeBackoff * ceiling
	} else {
		r.rate /= 2
	}
	r.rate = max(r.rate, k.minRate())
	if prev > 0 && ceiling < rangeGrowth*prev {
		r.hold = min(2*r.hold, rangeMaxHold)
	} else {
		r.hold = rangeHold
	}
	// The rest of the slice goes at the new rate as the account frees up
	// (recheck), not at the old one.
	r.tokens = r.rate * k.slice.Seconds()
	r.step = 0
	r.changed, r.probeAt = now, now.Add(r.hold)
}

// split cuts the range holding a cool key at it. A side that holds a key
// the same answer throttled (or, when that answer throttled none in the
// range, a key throttled recently) stays hot, up to the cool key's prefix
// (see highBelow, lowAbove); a side that holds none is forgotten, its
// records sent. When both stay, they share the rate by their throttled
// keys until their next throttle measures them. k.mu is held.
func (k *keyRanges) split(now time.Time, cool string, hot []string) {
	i := k.index(cool)
	if i < 0 || !k.hot[i].high.above(cool) {
		return
	}
	r := k.hot[i]
	evidence := r.hotKeys
	if in := slices.DeleteFunc(slices.Clone(hot), func(key string) bool { return !r.contains(key) }); len(in) > 0 {
		evidence = in
	}
	var lowKeys, highKeys []string
	for _, key := range evidence {
		switch {
		case key < cool:
			lowKeys = append(lowKeys, key)
		case key > cool:
			highKeys = append(highKeys, key)
		}
	}
	var sides []*hotRange
	if len(lowKeys) > 0 {
		left := r.clone()
		left.high, left.hotKeys = highBelow(slices.Max(lowKeys), cool), lastKeys(lowKeys)
		sides = append(sides, left)
	}
	if len(highKeys) > 0 {
		right := r.clone()
		right.low, right.hotKeys = lowAbove(cool, slices.Min(highKeys)), lastKeys(highKeys)
		sides = append(sides, right)
	}
	if len(sides) == 2 {
		for _, side := range sides {
			share := float64(len(side.hotKeys)) / float64(len(sides[0].hotKeys)+len(sides[1].hotKeys))
			side.rate = max(r.rate*share, k.minRate())
			side.peak, side.tokens = r.peak*share, r.tokens*share
			side.changed = now
		}
	}
	k.hot = slices.Replace(k.hot, i, i+1, sides...)
	for it := range r.waiting.all() {
		if dst := k.find(rangeKey(it.rec)); dst != nil && slices.Contains(sides, dst) {
			dst.waiting.push(it)
			continue
		}
		k.release(it)
	}
	if len(sides) == 0 {
		k.log.Debug("hot key range forgotten", "low", r.low.key, "high", r.high.key, "rate", r.rate)
	}
}

// lastKeys returns the last recentThrottles of keys.
func lastKeys(keys []string) []string {
	return slices.Clone(keys[max(len(keys)-recentThrottles, 0):])
}

// clone returns a copy of r with its own account and no records held.
func (r *hotRange) clone() *hotRange {
	c := *r
	c.sent = r.sent.Clone()
	c.waiting = itemQueue{}
	c.nextHot = 0
	return &c
}

// release hands a held record back to be sent without waiting. k.mu is
// held.
func (k *keyRanges) release(it *item) {
	k.released = append(k.released, it)
}

// evict forgets the range throttled least recently. k.mu is held.
func (k *keyRanges) evict() {
	oldest := 0
	for i, r := range k.hot {
		if r.throttled.Before(k.hot[oldest].throttled) {
			oldest = i
		}
	}
	k.forget(oldest)
}

// forget drops range i; its held records are released. k.mu is held.
func (k *keyRanges) forget(i int) {
	r := k.hot[i]
	for it := range r.waiting.all() {
		k.release(it)
	}
	k.hot = append(k.hot[:i], k.hot[i+1:]...)
	k.log.Debug("hot key range forgotten", "low", r.low.key, "high", r.high.key, "rate", r.rate)
}

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
