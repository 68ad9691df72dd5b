package pacing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/ingest"
)

var (
	_ ingest.Pacer            = (*Pacer)(nil)
	_ ingest.ThrottleFeedback = (*Pacer)(nil)
)

// Defaults for Config.
const (
	DefaultSlice  = 200 * time.Millisecond
	DefaultGuard  = 5 * time.Millisecond
	DefaultWindow = time.Second
)

// Config tunes a Pacer. The zero value uses the defaults.
type Config struct {
	// Slice is how often a slice opens and how much of the rate one slice
	// carries (the token bucket's burst is rate × Slice). Default 200 ms.
	Slice time.Duration
	// Guard is the send-to-accept jitter the account allows for: a spend
	// stays in the account for Window + Guard. Default 5 ms; it must be
	// shorter than Slice. A zero value means the default.
	Guard time.Duration
	// Window is the length of the sliding account: the units spent in any
	// Window never exceed the integral of the rate over it. Default 1 s,
	// the window a throttled service measures; at least Slice.
	Window time.Duration
	// Cut is the factor the throttle ceiling is multiplied by for each
	// slice in which the sink throttled the worker despite its leases
	// (another application sharing the service): the multiplicative
	// decrease of AIMD. Default 0.7; within (0, 1).
	Cut float64
	// Recovery is how fast the ceiling rises again, as a fraction of the
	// leased rate per second: the additive increase of AIMD. Default 0.1
	// (from one cut back to the leased rate in 3 s); > 0.
	Recovery float64
}

// Capacity is what the pacer reads from the lease side; ingest.Capacity
// satisfies it. Both methods must be safe for concurrent use.
type Capacity interface {
	// Rate returns the worker's rate at now, in units/s. A negative, NaN or
	// infinite rate counts as 0.
	Rate(now time.Time) float64
	// Credit returns the integral of Rate over [from, to), in units. The
	// pacer only asks for intervals that end at or before time.Now().
	Credit(from, to time.Time) float64
}

// Pacer opens slices of a worker's leased capacity; see the package
// documentation for the budget rule. Create it with New.
type Pacer struct {
	slice, guard, window time.Duration
	maxDelay             time.Duration // how late a slice may open to fit a full one
	capa                 Capacity

	mu     sync.Mutex
	lim    *rate.Limiter // nil until the first slice
	debt   int64         // units sent beyond the bucket, repaid before any budget
	spends []spend       // oldest first; only those within window + guard
	next   time.Time     // when the next slice opens; zero before the first

	cut, recovery float64
	throttled     bool    // the sink throttled since the last slice opened
	ceiling       float64 // throttle ceiling in units/s; 0: none
	stats         Stats
}

// Stats counts what a pacer released and how it reacted to throttling.
type Stats struct {
	// Slices is the number of slices opened.
	Slices int64
	// Budget is the units granted over all slices; Spent the units the
	// pipeline reported sending (corrections included).
	Budget, Spent int64
	// Cuts is the number of slices whose rate was cut because the sink
	// throttled during the one before.
	Cuts int64
	// Recoveries is the number of times the ceiling climbed back to the
	// leased rate and was lifted.
	Recoveries int64
	// Ceiling is the current throttle ceiling in units/s, 0 when none.
	Ceiling float64
}

type spend struct {
	at    time.Time
	units int64
}

// New returns a Pacer over capa. It returns an error if capa is nil or cfg
// has a negative duration, a Guard not shorter than Slice, or a Window
// shorter than Slice.
func New(cfg Config, capa Capacity) (*Pacer, error) {
	if capa == nil {
		return nil, errors.New("pacing: nil capacity")
	}
	if cfg.Slice < 0 || cfg.Guard < 0 || cfg.Window < 0 {
		return nil, fmt.Errorf("pacing: negative duration in config (slice %v, guard %v, window %v)",
			cfg.Slice, cfg.Guard, cfg.Window)
	}
	p := &Pacer{
		slice:  cmp.Or(cfg.Slice, DefaultSlice),
		guard:  cmp.Or(cfg.Guard, DefaultGuard),
		window: cmp.Or(cfg.Window, DefaultWindow),
		capa:   capa,
	}
	if p.guard >= p.slice {
		return nil, fmt.Errorf("pacing: guard %v must be shorter than slice %v", p.guard, p.slice)
	}
	if p.window < p.slice {
		return nil, fmt.Errorf("pacing: window %v must be at least one slice (%v)", p.window, p.slice)
	}
	p.cut, p.recovery = cmp.Or(cfg.Cut, 0.7), cmp.Or(cfg.Recovery, 0.1)
	if !(p.cut > 0 && p.cut < 1) {
		return nil, fmt.Errorf("pacing: cut %v must be within (0, 1)", cfg.Cut)
	}
	if !(p.recovery > 0) || math.IsInf(p.recovery, 0) {
		return nil, fmt.Errorf("pacing: recovery %v must be a positive fraction of the rate per second", cfg.Recovery)
	}
	p.maxDelay = p.guard + p.slice/4
	return p, nil
}

// Next blocks until the next slice opens and returns its budget in units
// (≥ 0). A slice opens Slice after the previous one; the first, and any
// whose time has already passed when Next is called, opens at once. A slice
// opens up to Guard + Slice/4 late when that lets the account admit its full
// budget (see the package documentation), and the following one opens Slice
// after it.
//
// want is the cost, in units, of the record waiting at the head of the line
// (0 when none). When want exceeds the slice's budget and one slice of the
// rate, the budget is want as soon as the record may be admitted on debt.
//
// Next returns every slice, even when the budget is 0, and returns
// context.Cause(ctx) once ctx is done.
func (p *Pacer) Next(ctx context.Context, want int64) (int64, error) {
	if ctx.Err() != nil {
		return 0, context.Cause(ctx)
	}
	p.mu.Lock()
	open := p.next
	p.mu.Unlock()
	if now := time.Now(); open.Before(now) {
		open = now
	}
	if err := sleepUntil(ctx, open); err != nil {
		return 0, err
	}
	deadline := open.Add(p.maxDelay)
	p.mu.Lock()
	p.feedback(p.rate(time.Now()))
	p.mu.Unlock()
	for {
		p.mu.Lock()
		budget, wait := p.openSlice(time.Now(), max(want, 0), deadline)
		if wait.IsZero() {
			p.next = open.Add(p.slice)
			p.stats.Slices++
			p.stats.Budget += budget
			p.mu.Unlock()
			return budget, nil
		}
		p.mu.Unlock()
		// An old spend leaves the account at wait; the slice opens then.
		if err := sleepUntil(ctx, wait); err != nil {
			return 0, err
		}
		open = wait
	}
}

// Spend records that units were sent now (the pipeline calls it right
// before sending). Units the bucket cannot cover become debt. Units ≤ 0 are
// ignored. Safe for concurrent use with Next.
func (p *Pacer) Spend(units int64) {
	if units <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.prune(now)
	p.spends = append(p.spends, spend{at: now, units: units})
	p.stats.Spent += units
	var take int64
	if p.lim != nil {
		take = min(units, wholeUnits(p.lim.TokensAt(now)))
		if take > 0 {
			p.lim.ReserveN(now, int(take)) // take ≤ tokens ≤ burst: always granted at once
		}
	}
	p.debt += units - take
}

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

// Stats returns the pacer's counters.
func (p *Pacer) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Ceiling = p.ceiling
	return st
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

// openSlice computes the budget of a slice opening at now. If the account is what
// keeps the budget short and an old spend leaves it by deadline, it returns
// the first instant at which the full budget fits instead. p.mu is held.
func (p *Pacer) openSlice(now time.Time, want int64, deadline time.Time) (budget int64, wait time.Time) {
	r := p.capped(p.rate(now))
	burst := p.burst(r)
	if p.lim == nil {
		p.lim = rate.NewLimiter(rate.Limit(r), burst) // starts full
	} else {
		p.lim.SetLimitAt(now, rate.Limit(r))
		p.lim.SetBurstAt(now, burst)
	}
	p.prune(now)
	if pay := min(p.debt, wholeUnits(p.lim.TokensAt(now))); pay > 0 {
		p.lim.ReserveN(now, int(pay))
		p.debt -= pay
	}
	budget, short := p.budgetAt(now, now, r, want)
	if !short {
		return budget, time.Time{}
	}
	for _, s := range p.spends {
		leaves := s.at.Add(p.window + p.guard)
		if leaves.After(deadline) {
			break
		}
		if !leaves.After(now) {
			continue
		}
		// Worth waiting for once a full slice fits (to within rounding):
		// the bucket keeps filling while we wait, so "not short of the
		// bucket" may never come within the deadline. Worth waiting for
		// too when the wait gains half a slice or more: budgets are
		// floored to whole units, so the slice freed by a spend that
		// leaves a millisecond from now can be a unit or two short of
		// r × Slice (at 2000/3 units/s, 131 or 132 of 133.3) while the
		// budget now is nearly nothing; not waiting would lose the slice.
		if b, short := p.budgetAt(leaves, now, r, want); !short || float64(b) >= r*p.slice.Seconds()-1 || float64(b-budget) >= r*p.slice.Seconds()/2 {
			return 0, leaves
		}
	}
	return budget, time.Time{}
}

// budgetAt is the budget a slice opening at t ≥ now would get, assuming the
// rate stays r and nothing more is spent until then. short reports that the
// account, not the bucket or debt, is what keeps the budget below its full
// size, so that waiting for an old spend to leave could help. p.mu is held.
func (p *Pacer) budgetAt(t, now time.Time, r float64, want int64) (budget int64, short bool) {
	if r == 0 {
		return 0, false
	}
	allow := wholeUnits(p.lim.TokensAt(t) - float64(p.debt))
	var spent int64
	for _, s := range p.spends {
		if s.at.After(t.Add(-p.window - p.guard)) {
			spent += s.units
		}
	}
	credit := p.credit(t.Add(-p.window), t, now, r)
	room := credit - float64(spent)
	budget = min(allow, wholeUnits(room))

	if want <= budget || want <= int64(p.burst(r)) || p.debt > 0 {
		// An ordinary slice: the record fits a slice, or debt comes first.
		return budget, budget < allow
	}
	// A record costing more than a slice: admit it on debt if the account
	// holds it, or, if no window at this rate ever could, once the window
	// is empty and (but for a slice) fully credited.
	if float64(want) <= room+epsilon {
		return want, false
	}
	perWindow := r * p.window.Seconds()
	if float64(want) > perWindow && spent == 0 && credit+epsilon >= perWindow-r*p.slice.Seconds() {
		return want, false
	}
	return budget, true
}

// credit is Capacity.Credit over [from, to), predicting the part after now
// at rate r.
func (p *Pacer) credit(from, to, now time.Time, r float64) float64 {
	var ahead float64
	if to.After(now) {
		ahead = r * to.Sub(now).Seconds()
		to = now
	}
	c := p.capa.Credit(from, to)
	if math.IsNaN(c) || c < 0 {
		c = 0
	}
	return c + ahead
}

// rate is Capacity.Rate, with anything but a finite positive rate as 0.
func (p *Pacer) rate(now time.Time) float64 {
	r := p.capa.Rate(now)
	if !(r > 0) || math.IsInf(r, 1) {
		return 0
	}
	return r
}

// burst is one slice at rate r in whole units, rounded up so that a rate
// below one unit per slice still sends; 0 when r is 0.
func (p *Pacer) burst(r float64) int {
	if r == 0 {
		return 0
	}
	b := math.Ceil(r*p.slice.Seconds() - epsilon)
	return int(min(max(b, 1), math.MaxInt32))
}

// prune forgets the spends that have left the account at now.
func (p *Pacer) prune(now time.Time) {
	cut := now.Add(-p.window - p.guard)
	i := 0
	for i < len(p.spends) && !p.spends[i].at.After(cut) {
		i++
	}
	p.spends = p.spends[i:]
}

// epsilon absorbs floating-point error in credit and token arithmetic (the
// credit of 1,000 units/s over 1 s may come out as 999.9999999).
const epsilon = 1e-6

// wholeUnits floors x to whole units, with negative values as 0.
func wholeUnits(x float64) int64 {
	if !(x > 0) {
		return 0
	}
	return int64(min(math.Floor(x+epsilon), math.MaxInt64/2))
}

// sleepUntil blocks until t or until ctx is done.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
