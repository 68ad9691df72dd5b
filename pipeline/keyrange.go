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

// everyKey reports whether r has no end on either side.
func (r *hotRange) everyKey() bool { return r.low.unbounded && r.high.unbounded }

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
// was in a range already known to be hot (explained: a range-specific
// answer, not a failure of the whole request), and whether a throttle is
// the sink's as a whole (refused): a throttled key whose range would cover
// every key, with nothing of it accepted in the last second. Such a range
// is not kept: there is no key range to pace, the sink is full or refusing,
// and the pipeline pauses it.
func (k *keyRanges) observe(now, sent time.Time, items []*item, results []ingest.Result) (explained, refused bool) {
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
		return false, false
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
				var whole bool
				if r, whole = k.cover(now, m.key, low, high); r == nil {
					refused = refused || whole
					continue
				}
			} else if !cut[r] && sent.After(r.changed) {
				// Sent at its current rate and still throttled: cut it
				// (once per answer). A request sent before its last
				// change is old news.
				if k.cut(now, r) == 0 && r.everyKey() {
					// Nothing of the whole key space got through in a
					// second: the sink's throttle, which its pause
					// handles; the range and what it holds go.
					k.forget(k.index(m.key))
					refused = true
					continue
				}
			}
			cut[r] = true
			r.throttled = now
			r.noteHot(m.key)
		}
		i = j
	}
	k.on.Store(true)
	return explained, refused
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
// and accepted in one answer), and nil with whole set when the range would
// cover every key and none of them was accepted in the last second: a
// throttle of the whole sink, not of a range. k.mu is held.
func (k *keyRanges) cover(now time.Time, key string, low, high bound) (_ *hotRange, whole bool) {
	i := k.index(key) // the range below key, if any
	r := &hotRange{low: low, high: high, hold: rangeHold}
	if i >= 0 && !before(k.hot[i].high, low) {
		r.low = k.hot[i].high
	}
	if i+1 < len(k.hot) && !before(high, k.hot[i+1].low) {
		r.high = k.hot[i+1].low
	}
	if !r.contains(key) {
		return nil, false
	}
	accepted := k.fill(now, r)
	if accepted == 0 && r.everyKey() {
		return nil, true
	}
	r.peak = accepted
	r.rate = max(rangeBackoff*accepted, k.minRate())
	r.changed, r.throttled, r.probeAt, r.filled = now, now, now.Add(r.hold), now
	k.hot = slices.Insert(k.hot, i+1, r)
	k.c.Count(ingest.EventHotRanges, 1)
	k.log.Debug("hot key range found", "low", r.low.key, "high", r.high.key, "rate", r.rate)
	if len(k.hot) > maxHotRanges {
		k.evict()
	}
	return r, false
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
// it accepted nothing, and returns what it accepted (units/s). k.mu is held.
func (k *keyRanges) cut(now time.Time, r *hotRange) (accepted float64) {
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
	return ceiling
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
