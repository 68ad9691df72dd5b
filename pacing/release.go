package pacing

import (
	"math"
	"slices"
	"time"
)

// releaseStep is how finely Releasable samples the coming window.
const releaseStep = 20 * time.Millisecond

// Releasable reports whether the worker's rate may drop from its current
// rate to rate (units/s) at now without a send already in its account
// ending up beyond its credit, and the least grace, at most most, that
// this takes: in every sliding window of the coming one, the units the
// account still holds must stay within the credit earned before now, plus
// the current rate for grace after now (a lease released but unlocked
// only after grace, on which no peer earns meanwhile) and rate after it.
// Smooth sending passes with a grace of 0 or a few milliseconds; what
// needs more is a send admitted against credit the next slice was to
// earn — a slice's budget sent as the slice opened, a record costlier
// than a slice sent on debt — whose window a peer taking the capacity
// over at once would share. A lease manager asks before it gives
// capacity back of its own will, unlocks what it released after the
// grace returned, and waits while the answer is no. Sends in flight count
// as answered now.
//
// A yes is taken as the release it asked about: a peer earns on the
// capacity from grace after now, so for a Window after that the pacer
// holds every send to the same test (see Spend), and no later send leans
// on the credit the worker earned before now either (a worker sending
// below its rate has such credit in its account's window, and would
// spend it beside the peer).
// Safe for concurrent use; it reads the Capacity's Credit, so the caller
// must not hold a lock Credit takes.
func (p *Pacer) Releasable(now time.Time, rate float64, most time.Duration) (grace time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pinned(now) // drops the pins no send can share a window with any more
	rate = max(rate, 0)
	current := p.capped(p.rate(now))
	grace, ok = time.Duration(0), true
	p.windows(now, 0, p.handed, func(units, earned float64, d time.Duration) {
		need := units - earned - rate*d.Seconds() // beyond the credit with no grace
		if need <= epsilon || !ok {
			return
		}
		// Each second of grace adds current − rate to the window's credit,
		// up to the window's part after now.
		if !(current > rate) || need > (current-rate)*d.Seconds()+epsilon {
			ok = false
			return
		}
		g := min(time.Duration(math.Ceil(need/(current-rate)*float64(time.Second))), d)
		if g > most {
			ok = false
			return
		}
		grace = max(grace, g)
	})
	if !ok {
		return 0, false
	}
	p.pins = append(p.pins, pin{at: now, freed: max(current-rate, 0), grace: grace})
	return grace, true
}

// HandOver reports the instant since which a peer that takes over the
// capacity this worker gave up, freed units/s that stopped counting at
// stopped, may count that capacity's credit as its own, for a lease
// manager that unlocks it at now. A peer's sends come after now, so they
// share a sliding window only with this worker's sends that the sink may
// have accepted after now − Window; since is the least instant such that,
// in every sliding window of the coming one, the units this worker's
// account still holds fit in its credit without the freed rate from
// since on, and without any release's grace (now − Window when its
// account holds nothing). A peer counting the capacity from since, not
// from its lock, sends at once what the pool's second allows: a worker
// whose turn to send a costly record ended leaves the next worker up to a
// second of credit, which the next worker would otherwise earn anew. ok
// is false, and the peer must count from its lock, when even since =
// stopped does not fit (the account leans on a grace), when freed is not
// positive, or while an earlier hand-over is less than a Window old.
//
// A yes is taken as the hand-over it reports: for a Window after now the
// pacer counts none of the freed rate from since on in any window, and
// the grace of earlier releases no more, so the worker's later sends do
// not spend what the peer counts. Safe for concurrent use; it reads the
// Capacity's Rate and Credit, so the caller must not hold a lock they
// take.
func (p *Pacer) HandOver(now, stopped time.Time, freed float64) (since time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pinned(now)
	if !p.handed.at.IsZero() || !(freed > 0) || math.IsInf(freed, 0) || p.rate(now) > 0 {
		return time.Time{}, false
	}
	fits := func(since time.Time) bool {
		ok := true
		p.windows(now, 0, handOver{since: since, stopped: stopped, freed: freed}, func(held, earned float64, d time.Duration) {
			ok = ok && held-earned <= epsilon
		})
		return ok
	}
	// The pins' grace is not counted: once the peer counts from since, it
	// earns on what they freed. So they are dropped with a yes.
	pins := p.pins
	p.pins = nil
	lo, hi := now.Add(-p.window), minTime(stopped, now)
	switch {
	case !lo.Before(hi) || fits(lo):
		since = lo
	case !fits(hi):
		p.pins = pins
		return time.Time{}, false
	default:
		// fits is monotone: a later since leaves this worker more credit.
		for hi.Sub(lo) > handOverStep {
			mid := lo.Add(hi.Sub(lo) / 2)
			if fits(mid) {
				hi = mid
			} else {
				lo = mid
			}
		}
		since = hi
	}
	p.handed = handOver{at: now, since: since, stopped: stopped, freed: freed}
	return since, true
}

// handOverStep is how finely HandOver finds its instant.
const handOverStep = time.Millisecond

// handOver is a HandOver said yes to at at: freed units/s, which stopped
// counting at stopped, went to a peer from since on.
type handOver struct {
	at, since, stopped time.Time
	freed              float64
}

// taken returns the credit of [from, to) that went to the peer: the freed
// rate over the part of [since, stopped) inside; 0 for no hand-over.
func (h handOver) taken(from, to time.Time) float64 {
	d := minTime(to, h.stopped).Sub(maxTime(from, h.since))
	return h.freed * max(d, 0).Seconds()
}

// pin is a release Releasable said yes to: at, the worker's rate dropped by
// freed units/s, on which no peer earns for grace.
type pin struct {
	at    time.Time
	freed float64
	grace time.Duration
}

// idle returns the credit of [from, to) the pin's grace holds back from
// every worker: its freed rate over the part of the grace inside.
func (q pin) idle(from, to time.Time) float64 {
	d := minTime(to, q.at.Add(q.grace)).Sub(maxTime(from, q.at))
	return q.freed * max(d, 0).Seconds()
}

// pinned prunes the pins that no send from now on shares a window with
// (a Window past their grace), and forgets a hand-over a Window old, and
// reports whether any of either is left. p.mu is held.
func (p *Pacer) pinned(now time.Time) bool {
	i := 0
	for i < len(p.pins) && !p.pins[i].at.Add(p.pins[i].grace+p.window).After(now) {
		i++
	}
	p.pins = p.pins[i:]
	if !p.handed.at.IsZero() && !p.handed.at.Add(p.window).After(now) {
		p.handed = handOver{}
	}
	return len(p.pins) > 0 || !p.handed.at.IsZero()
}

// beyond returns by how many units, at most, the account plus a send of
// units at now would pass the credit of a sliding window of the coming
// one at rate from now on (see Releasable and windows); ≤ 0 when it
// passes none. p.mu is held.
func (p *Pacer) beyond(now time.Time, rate float64, units int64) float64 {
	most := math.Inf(-1)
	p.windows(now, units, p.handed, func(held, earned float64, d time.Duration) {
		most = max(most, held-earned-rate*d.Seconds())
	})
	return most
}

// windows calls check for the sliding windows of the coming one that a
// release must keep within their credit, each with the units the account
// plus a send of units at now still holds at its end, the credit it earned
// before now (for each release pinned, the freed rate over the part of its
// grace inside the window included: no peer earned on it then; what the
// hand-over h gave a peer left out) and its part after now. Between two instants at which a held send leaves, the
// units a window holds stay the same while its credit changes with the
// rate a Window before and the rate after now, so the windows that hold
// the most beyond their credit end just before a send leaves, or where
// the rate changed a Window before: it looks at the first, at the windows
// starting every releaseStep of the last Window (on a grid fixed in time,
// so the credit before each start is read once: Capacity.Credit never
// shrinks for instants already past, and where it grows for them, a lease
// taken over with a hand-over, the cache only undercounts), at those starting at each pinned
// release, where the credit of the coming windows is least, and at the
// one starting now, which holds the sends in flight. A window that
// starts between two steps where the rate changed may hold a little more
// (the old rate's credit over less than a step). p.mu is held.
func (p *Pacer) windows(now time.Time, units int64, h handOver, check func(held, earned float64, d time.Duration)) {
	end := now.Add(p.window)
	held := append(p.held[:0], leaving{at: end, units: units})
	for _, s := range p.spends {
		at, ok := p.leaves(s)
		if !ok {
			at = end
		}
		if at.After(now) {
			held = append(held, leaving{at: at, units: s.units})
		}
	}
	slices.SortFunc(held, func(a, b leaving) int { return a.at.Compare(b.at) })
	var after int64
	for i := len(held) - 1; i >= 0; i-- {
		after += held[i].units
		held[i].after = after
	}
	p.held = held
	window := func(from time.Time, past float64) {
		u := from.Add(p.window)
		if !u.After(now) {
			return
		}
		// The sends leaving after u: the first of them on.
		i, _ := slices.BinarySearchFunc(held, u, func(l leaving, u time.Time) int {
			if l.at.After(u) {
				return 1
			}
			return -1
		})
		var units int64
		if i < len(held) {
			units = held[i].after
		}
		earned := max(past-h.taken(from, u), 0)
		for _, q := range p.pins {
			earned += q.idle(from, u)
		}
		check(float64(units), earned, u.Sub(now))
	}
	origin, upToNow := p.past.at(now, p)
	for i, c := range p.past.sums {
		window(origin.Add(time.Duration(i)*releaseStep), upToNow-c)
	}
	for _, q := range p.pins {
		window(q.at, p.credit(q.at, now, now, 0))
	}
	for i, l := range held {
		if i+1 < len(held) && held[i+1].at.Equal(l.at) {
			continue // the last of those leaving together
		}
		if from := l.at.Add(-p.window - time.Nanosecond); from.Before(now) {
			window(from, p.credit(from, now, now, 0)) // just before l leaves
		}
	}
	window(now.Add(-time.Nanosecond), 0) // what is in flight, and this send
}

// leaving is a send's units and when they leave the account; after, in
// windows, the units of the sends leaving at or after it.
type leaving struct {
	at           time.Time
	units, after int64
}

// pastCredit caches the credit earned before instants already past, on a
// grid of releaseStep: sums[i] is the credit over [origin, origin +
// i × releaseStep).
type pastCredit struct {
	origin time.Time
	sums   []float64
}

// at moves the grid to the last Window before now, reads the credit of
// the grid's new instants, and returns the origin and the credit over
// [origin, now). p.mu is held.
func (c *pastCredit) at(now time.Time, p *Pacer) (time.Time, float64) {
	first := now.Add(-p.window).Truncate(releaseStep)
	drop := int(first.Sub(c.origin) / releaseStep)
	if c.origin.IsZero() || drop < 0 || drop >= len(c.sums) {
		c.origin, c.sums = first, c.sums[:0]
	} else if drop > 0 {
		base := c.sums[drop]
		c.sums = append(c.sums[:0], c.sums[drop:]...)
		for i := range c.sums {
			c.sums[i] -= base
		}
		c.origin = first
	}
	for x := c.origin.Add(time.Duration(len(c.sums)) * releaseStep); !x.After(now); x = x.Add(releaseStep) {
		c.sums = append(c.sums, p.credit(c.origin, x, now, 0))
	}
	return c.origin, p.credit(c.origin, now, now, 0)
}

// Answered reports whether every send made before the given instant has
// had its answer: a lease manager unlocks a released lease only once the
// sends made before it stopped counting it have, since the sink may accept
// a request any time before its answer. Safe for concurrent use.
func (p *Pacer) Answered(before time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.spends {
		if s.at.Before(before) && s.answered.IsZero() {
			return false
		}
	}
	return true
}
