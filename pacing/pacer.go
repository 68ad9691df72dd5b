package pacing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/ingest"
)

var (
	_ ingest.Pacer            = (*Pacer)(nil)
	_ ingest.ThrottleFeedback = (*Pacer)(nil)
	_ ingest.GuardReporter    = (*Pacer)(nil)
	_ ingest.RiseReporter     = (*Pacer)(nil)
)

// Defaults for Config.
const (
	// DefaultSlice is ingest.DefaultSlice (200 ms).
	DefaultSlice = ingest.DefaultSlice
	// DefaultGuard is the least time a send stays in the account beyond
	// one Window: 0, since the measured answer already bounds when the
	// sink accepted it.
	DefaultGuard = 0
	// DefaultWindow is the sliding account's length: 1 s, the window a
	// throttled service measures.
	DefaultWindow = time.Second
)

// Config tunes a Pacer. The zero value uses the defaults.
type Config struct {
	// Slice is how often a slice opens and how much of the rate one slice
	// carries (the token bucket's burst is rate × Slice). Defaults to
	// DefaultSlice (200 ms).
	Slice time.Duration
	// Guard is the floor of the send-to-accept allowance: a send stays in
	// the account until Window after its answer arrived, and at least
	// Guard + Window after it was sent. Defaults to DefaultGuard (0); it
	// must be shorter than Slice.
	Guard time.Duration
	// Window is the length of the sliding account: the units in the
	// account at any send never exceed the integral of the rate over the
	// Window before it. Defaults to DefaultWindow (1 s); at least Slice.
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
	// pacer only asks for intervals that end at or before time.Now(). It
	// must never shrink for instants already past; it may grow for them
	// (capacity handed over with what its giver left, see HandOver).
	Credit(from, to time.Time) float64
}

// Gatherer is implemented by capacities that can gather a larger share of
// the pool for a record costing more than the worker's rate lets its
// account ever hold (lease.Manager): the pacer announces at every slice
// the least rate, in units/s, at which the record at the head of the line
// can be sent (its cost per Window), 0 when there is none. Safe for
// concurrent use.
type Gatherer interface {
	SetNeed(unitsPerSecond float64)
}

// Pacer opens slices of a worker's leased capacity and admits each send
// against a sliding account; see the package documentation for the rules.
// Create it with New.
type Pacer struct {
	slice, guard, window time.Duration
	capa                 Capacity
	gather               Gatherer // capa's, when it can gather; else nil

	mu       sync.Mutex
	lim      *rate.Limiter // nil until the first slice
	debt     int64         // units sent beyond the bucket, repaid before any budget
	spends   []*spend      // oldest first; those still in the account
	next     time.Time     // when the next slice opens; zero before the first
	opened   time.Time     // when the current slice opened: its sends draw on the bucket as of then
	planned  float64       // the rate, in units/s, the current slice was planned with (capped)
	answered chan struct{} // closed and replaced when an answer arrives

	pins    []pin         // the releases Releasable said yes to whose windows a send may still share: the sends that follow keep the account releasable
	handed  handOver      // the last HandOver, for a Window; zero when none
	past    pastCredit    // the credit before instants already past, for beyond
	held    []leaving     // beyond's scratch: the sends in the account, by when they leave
	holds   []hold        // the send→answer latencies of the answers of the last Window, oldest first
	allowed time.Duration // the allowance the current slice was planned with

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
	// Held counts sends the account made wait (for an older send to leave
	// it); HeldFor is how long they waited in all.
	Held    int64
	HeldFor time.Duration
	// InFlight is the units sent whose answer has not arrived.
	InFlight int64
	// Cuts is the number of slices whose rate was cut because the sink
	// throttled during the one before.
	Cuts int64
	// Recoveries is the number of times the ceiling climbed back to the
	// leased rate and was lifted.
	Recoveries int64
	// Ceiling is the current throttle ceiling in units/s, 0 when none.
	Ceiling float64
	// Guard is the send-to-accept allowance the current slice was planned
	// with (see Pacer.Next), and GuardMin and GuardMax the least and the
	// most of it over the slices with a rate.
	Guard, GuardMin, GuardMax time.Duration
}

// spend is one send in the account.
type spend struct {
	at       time.Time
	units    int64
	answered time.Time // zero while in flight
}

// leaves is when s leaves the account: Window after its answer, and no
// sooner than Guard + Window after its send. In flight: never (so far).
func (p *Pacer) leaves(s *spend) (time.Time, bool) {
	if s.answered.IsZero() {
		return time.Time{}, false
	}
	return maxTime(s.answered, s.at.Add(p.guard)).Add(p.window), true
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
		slice:    cmp.Or(cfg.Slice, DefaultSlice),
		guard:    cmp.Or(cfg.Guard, DefaultGuard),
		window:   cmp.Or(cfg.Window, DefaultWindow),
		capa:     capa,
		answered: make(chan struct{}),
	}
	p.gather, _ = capa.(Gatherer)
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
	return p, nil
}

// Next blocks until the next slice opens and returns its budget in units
// (≥ 0): what the token bucket allows, within what the sliding account will
// hold by the end of the slice if the rate stays as it is. A slice opens
// Slice after the previous one (10 ms after one with no rate, so that a
// lease just gained is used at once); the first opens at once, and so
// does one asked for after the rate rose since the previous one opened
// (Rose: the gain adds a slice of its flow to the bucket, see below), and
// one whose time has passed when Next is called opens at once but
// keeps its planned time for the bucket and the next slice (unless it is a
// whole slice late). Each send is still checked against the account by
// Spend.
//
// want is the cost, in units, of the record waiting at the head of the
// line (0 when none). When want exceeds the slice's budget and one slice of
// the rate, the budget is want as soon as the record may be admitted on
// debt (see the package documentation).
//
// Next returns every slice, even when the budget is 0, and returns
// context.Cause(ctx) once ctx is done.
func (p *Pacer) Next(ctx context.Context, want int64) (int64, error) {
	if ctx.Err() != nil {
		return 0, context.Cause(ctx)
	}
	p.mu.Lock()
	open, rose := p.next, p.rose(time.Now())
	p.mu.Unlock()
	if rose || time.Since(open) > p.slice {
		// The first slice, a stall, or a rate that rose: a new grid
		// starts now. A slice opened late by less than a slice keeps the
		// grid, so the delays of a busy machine do not stretch every
		// slice, and the bucket is read at the planned opening, so a late
		// slice loses no tokens.
		open = time.Now()
	}
	if err := sleepUntil(ctx, open); err != nil {
		return 0, err
	}
	if p.gather != nil {
		p.gather.SetNeed(float64(max(want, 0)) / p.window.Seconds())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.feedback(p.rate(now))
	r := p.capped(p.rate(now))
	// Every send stays in the account for Window plus its own latency, so
	// the account lets through at most r × Window / (Window + latency):
	// the bucket flows at that rate, so the slices stay even instead of
	// running into the account and stalling.
	p.allowed = p.allowance(now)
	flow := r * p.window.Seconds() / (p.window + p.allowed).Seconds()
	if r > 0 {
		p.stats.Guard = p.allowed
		p.stats.GuardMax = max(p.stats.GuardMax, p.allowed)
		if p.stats.GuardMin == 0 || p.allowed < p.stats.GuardMin {
			p.stats.GuardMin = p.allowed
		}
	}
	burst := p.burst(flow)
	depth := depth(burst)
	if p.lim == nil || (p.lim.Limit() == 0 && flow > 0 && len(p.spends) == 0 && p.debt == 0) {
		// The first rate, or the first after none: the bucket starts full,
		// so leases just gained are used in this slice. The account still
		// holds every send to the credit earned since they were gained.
		// Full is a slice: the bucket's extra unit only carries fractions.
		p.lim = bucket(open, flow, depth, burst)
	} else {
		gained := p.gained(open, r, flow)
		p.lim.SetLimitAt(open, rate.Limit(flow))
		p.lim.SetBurstAt(open, depth)
		if gained > 0 {
			// The rate rose during the last slice: the bucket filled at
			// the old flow. Like a first rate, the leases gained are used
			// at once: a slice of their flow, so that the sends that
			// follow flow at the new rate from this slice on, not from
			// the next (a peer's backlog drains at once when a worker
			// runs dry). The account holds every send to the credit
			// earned since they were gained.
			p.lim = bucket(open, flow, depth, int(min(p.lim.TokensAt(open)+gained, float64(burst))))
		}
	}
	p.prune(now)
	if pay := min(p.debt, wholeUnits(p.lim.TokensAt(open))); pay > 0 {
		p.lim.ReserveN(open, int(pay))
		p.debt -= pay
	}
	allow := min(wholeUnits(p.lim.TokensAt(open)-float64(p.debt)), int64(burst))
	var budget int64
	if r > 0 { // no valid lease: nothing to send
		budget = min(allow, wholeUnits(p.room(now.Add(p.slice), now, r)))
	}
	if want := max(want, 0); want > budget && want > int64(burst) && p.debt == 0 &&
		float64(want) <= p.room(now.Add(p.slice), now, r)+epsilon {
		// A record costing more than a slice, admitted on debt: the account
		// holds it within the slice, and Spend sends it the moment it does.
		budget = want
	}
	p.next, p.opened, p.planned = open.Add(p.slice), open, r
	if r == 0 {
		// No valid lease: look again soon, so that a lease just gained
		// is used at once rather than a slice later.
		p.next = open.Add(min(p.slice, noRateRecheck))
	}
	p.stats.Slices++
	p.stats.Budget += budget
	return budget, nil
}

// Spend waits until units may be sent now — until the sliding account has
// room for them, which it normally has within the budget Next gave, and,
// while a release Releasable said yes to is less than its grace plus a
// Window old, until every coming window keeps within the rate now (see
// Releasable) — and records them as sent at the Send's At; units the
// bucket cannot cover become debt. The pipeline calls the Send's Answered once the sink's
// answer has arrived (or the send was abandoned); the send leaves the
// account Window after that.
// Spend returns context.Cause(ctx) once ctx is done, and ingest.ErrNoRate
// once the units have waited a slice with no rate (no lease) and no room:
// without it, a worker whose leases went while its send waited waited for
// ever, since only its slice loop, blocked here, announces the demand
// that brings them back. Units ≤ 0 are recorded as nothing. Safe for
// concurrent use with Next.
func (p *Pacer) Spend(ctx context.Context, units int64) (ingest.Send, error) {
	if units <= 0 {
		return ingest.Send{At: time.Now(), Answered: func() {}}, nil
	}
	var held, noRate time.Time
	for {
		p.mu.Lock()
		now := time.Now()
		inAccount := p.prune(now)
		r := p.capped(p.rate(now))
		switch {
		case r > 0:
			noRate = time.Time{}
		case noRate.IsZero():
			noRate = now
		}
		// p.room(now, now, r), without a second pass over the account:
		// every send left in it after the prune is held at now.
		short := float64(units) - (p.credit(now.Add(-p.window), now, now, r) - float64(inAccount))
		if p.pinned(now) {
			// Capacity went to a peer: the send must leave the account
			// releasable at the rate now.
			short = max(short, p.beyond(now, r, units))
		}
		if short <= epsilon {
			s := p.record(now, units)
			if !held.IsZero() {
				p.stats.Held++
				p.stats.HeldFor += now.Sub(held)
			}
			p.mu.Unlock()
			return ingest.Send{At: now, Answered: sync.OnceFunc(func() { p.answer(s) })}, nil
		}
		if held.IsZero() {
			held = now
		}
		if !noRate.IsZero() && now.Sub(noRate) >= p.slice {
			p.mu.Unlock()
			return ingest.Send{}, ingest.ErrNoRate
		}
		wake, changed := p.nextRoom(now, r, short), p.answered
		p.mu.Unlock()
		if err := waitUntil(ctx, wake, changed); err != nil {
			return ingest.Send{}, err
		}
	}
}

// Rose reports whether the worker's rate rose since the current slice
// opened: Next then opens the next slice at once, with a slice of the
// gain (see Next). Safe for concurrent use.
func (p *Pacer) Rose() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rose(time.Now())
}

// rose is Rose at now. p.mu is held.
func (p *Pacer) rose(now time.Time) bool {
	return !p.opened.IsZero() && p.planned > 0 && p.capped(p.rate(now)) > p.planned+epsilon
}

// record adds a send of units at now. p.mu is held.
func (p *Pacer) record(now time.Time, units int64) *spend {
	s := &spend{at: now, units: units}
	p.spends = append(p.spends, s)
	p.stats.Spent += units
	var take int64
	if p.lim != nil {
		// The slice's sends draw on the bucket as of its opening, so that
		// a send the account held back does not lose the tokens that
		// accrued meanwhile (the bucket is capped at one slice and a unit).
		at := p.opened
		take = min(units, wholeUnits(p.lim.TokensAt(at)))
		if take > 0 {
			p.lim.ReserveN(at, int(take)) // take ≤ tokens ≤ depth: always granted at once
		}
	}
	p.debt += units - take
	return s
}

// noRateRecheck is how soon a slice follows one that had no rate.
const noRateRecheck = 10 * time.Millisecond

// hold is one answer's send→answer latency.
type hold struct {
	at      time.Time // when the answer arrived
	latency time.Duration
}

// answer marks s answered now.
func (p *Pacer) answer(s *spend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s.answered = time.Now()
	p.holds = append(p.holds, hold{s.answered, s.answered.Sub(s.at)})
	close(p.answered)
	p.answered = make(chan struct{})
}

// Guard returns the send-to-accept allowance the current slice was planned
// with: the 90th percentile of the send→answer latencies of the last
// Window, within [Config.Guard, Window]. Every send stays in the account
// until Window after its own answer whatever this is; the slices flow at
// rate × Window / (Window + Guard), the most such an account lets through.
func (p *Pacer) Guard() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allowed
}

// SliceLength returns the slice the pacer opens (Config.Slice).
func (p *Pacer) SliceLength() time.Duration { return p.slice }

// Stats returns the pacer's counters.
func (p *Pacer) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Ceiling = p.ceiling
	for _, s := range p.spends {
		if s.answered.IsZero() {
			st.InFlight += s.units
		}
	}
	return st
}

// room is what the account can take at t ≥ now: the credit of the Window
// before t (the part after now predicted at rate r) minus the units still
// in the account at t. p.mu is held.
func (p *Pacer) room(t, now time.Time, r float64) float64 {
	var held int64
	for _, s := range p.spends {
		if leave, ok := p.leaves(s); !ok || leave.After(t) {
			held += s.units
		}
	}
	return p.credit(t.Add(-p.window), t, now, r) - float64(held)
}

// allowance is the send-to-accept allowance to plan the slice opening at
// now with: the 90th percentile of the send→answer latencies of the answers
// of the last Window (the last one's when there are none), at least Guard
// and at most Window. p.mu is held.
func (p *Pacer) allowance(now time.Time) time.Duration {
	i := 0
	for i < len(p.holds)-1 && !p.holds[i].at.After(now.Add(-p.window)) {
		i++
	}
	p.holds = p.holds[i:]
	n := len(p.holds)
	if n == 0 {
		return p.guard
	}
	lat := make([]time.Duration, n)
	for i, h := range p.holds {
		lat[i] = h.latency
	}
	slices.Sort(lat)
	return min(max(lat[(n*9+9)/10-1], p.guard), p.window)
}

// nextRoom is when the account may next have room for a send that is
// short units beyond it: the next answered send leaving it, or the credit
// growing enough at rate r,
// whichever comes first (within a slice; sends in flight leave only after
// their answers, which wake Spend on their own). p.mu is held.
func (p *Pacer) nextRoom(now time.Time, r, short float64) time.Time {
	next := now.Add(p.slice)
	if r > 0 {
		next = minTime(next, now.Add(max(time.Duration(short/r*float64(time.Second)), time.Millisecond)))
	}
	for _, s := range p.spends {
		if leave, ok := p.leaves(s); ok && leave.After(now) {
			next = minTime(next, leave)
		}
	}
	return next
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

// gained is how many more tokens the flow planned at the opening now, at
// rate r, puts in the bucket than the limiter's old flow did: a slice of
// their difference, when the flow rose since the last opening; 0 when it
// has not or there was no last opening. p.mu is held.
func (p *Pacer) gained(open time.Time, r, flow float64) float64 {
	old := float64(p.lim.Limit())
	if p.opened.IsZero() || !(flow > old) || !(r > 0) || !open.After(p.opened) {
		return 0
	}
	return (flow - old) * p.slice.Seconds()
}

// depth is the size of the token bucket for a slice of burst units: the
// slice and one unit, or 0 when burst is 0 (no rate). A slice spends its budget in whole units, so
// the bucket opens the next slice with a slice of tokens plus the fraction
// the last budget left, which a bucket of one slice would drop: at 700
// units/s its slices opened with 139 and 140 units in turn (0.36 % under
// the rate), at 100 units/s with 19 and 20 (2.5 % under). A budget is
// still at most a slice: the unit waits in the bucket.
func depth(burst int) int {
	if burst > 0 {
		return burst + 1
	}
	return 0
}

// bucket is a token bucket flowing at flow units/s, of depth units,
// holding tokens (0 ≤ tokens ≤ depth) at open. Negative tokens would
// leave it full: ReserveN refuses more than depth.
func bucket(open time.Time, flow float64, depth, tokens int) *rate.Limiter {
	lim := rate.NewLimiter(rate.Limit(flow), depth)
	lim.ReserveN(open, depth-tokens)
	return lim
}

// burst is one slice at rate r in whole units, rounded up so that a rate
// below one unit per slice still sends; 0 when r is 0. It is the most a
// slice's budget holds, beyond a record admitted on debt.
func (p *Pacer) burst(r float64) int {
	if r == 0 {
		return 0
	}
	b := math.Ceil(r*p.slice.Seconds() - epsilon)
	return int(min(max(b, 1), math.MaxInt32))
}

// prune forgets the sends that have left the account at now and returns
// the units of those left in it, all held at now. p.mu is held.
func (p *Pacer) prune(now time.Time) (held int64) {
	keep := p.spends[:0]
	for _, s := range p.spends {
		if leave, ok := p.leaves(s); !ok || leave.After(now) {
			keep = append(keep, s)
			held += s.units
		}
	}
	clear(p.spends[len(keep):])
	p.spends = keep
	return held
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

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// sleepUntil blocks until t or until ctx is done.
func sleepUntil(ctx context.Context, t time.Time) error {
	return waitUntil(ctx, t, nil)
}

// waitUntil blocks until t, until ch is closed, or until ctx is done.
func waitUntil(ctx context.Context, t time.Time, ch <-chan struct{}) error {
	d := time.Until(t)
	if d <= 0 {
		return context.Cause(ctx)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ch:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
