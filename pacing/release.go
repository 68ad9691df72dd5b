package pacing

import "time"

// releaseStep is how finely Releasable samples the coming window.
const releaseStep = 20 * time.Millisecond

// Releasable reports whether the worker's rate may drop from its current
// rate to rate (units/s) at now without a send already in its account
// ending up beyond its credit: in every sliding window of the coming one,
// the units the account still holds must stay within the credit earned
// before now, plus the current rate for grace after now (a lease released
// but unlocked only after grace, on which no peer earns meanwhile) and
// rate after it. Smooth sending always passes; what does
// not is a send admitted against credit the next second was to earn — a
// record costlier than a slice, sent on debt — whose window a peer taking
// the capacity over would share. A lease manager asks before it gives
// capacity back of its own will, and waits while the answer is no.
// Sends in flight count as answered now. Safe for concurrent use; it reads
// the Capacity's Credit, so the caller must not hold a lock Credit takes.
func (p *Pacer) Releasable(now time.Time, rate float64, grace time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	type leave struct {
		at    time.Time
		units int64
	}
	var held []leave
	for _, s := range p.spends {
		at, ok := p.leaves(s)
		if !ok {
			at = now.Add(p.window)
		}
		if at.After(now) {
			held = append(held, leave{at, s.units})
		}
	}
	if len(held) == 0 {
		return true
	}
	current := p.capped(p.rate(now))
	for d := releaseStep; d <= p.window; d += releaseStep {
		u := now.Add(d)
		var units int64
		for _, l := range held {
			if l.at.After(u) {
				units += l.units
			}
		}
		credit := p.credit(u.Add(-p.window), now, now, 0) + current*min(d, grace).Seconds() + rate*max(d-grace, 0).Seconds()
		if float64(units) > credit+epsilon {
			return false
		}
	}
	return true
}
