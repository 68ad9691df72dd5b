package pacing

// Throttled reports that the sink throttled a write (HTTP 429) although the
// worker kept to its leases: someone else is using the service. The next
// slice cuts the worker's rate to Cut × its current rate (once per slice,
// however many writes were throttled); every slice without a report then
// raises the ceiling by Recovery × the leased rate per second until it
// reaches the leased rate again. Safe for concurrent use.
func (p *Pacer) Throttled() {
	p.mu.Lock()
	p.throttled = true
	p.mu.Unlock()
}

// feedback moves the throttle ceiling once per slice, given the leased rate
// r: a cut when the sink throttled since the last slice, else a step of
// recovery. p.mu is held.
func (p *Pacer) feedback(r float64) {
	switch {
	case p.throttled:
		p.throttled = false
		if p.ceiling == 0 || p.ceiling > r {
			p.ceiling = r
		}
		p.ceiling *= p.cut
		p.stats.Cuts++
	case p.ceiling > 0:
		p.ceiling += p.recovery * r * p.slice.Seconds()
		if p.ceiling >= r {
			p.ceiling = 0
			p.stats.Recoveries++
		}
	}
}

// capped is the leased rate r under the throttle ceiling. p.mu is held.
func (p *Pacer) capped(r float64) float64 {
	if p.ceiling > 0 {
		return min(r, p.ceiling)
	}
	return r
}
