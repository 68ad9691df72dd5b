package lease

import (
	"fmt"
	"math"
	"time"
)

// Ramp is a pool's ramp-up rule for new key ranges: the effective rate
// starts at Start units/s and is multiplied by Factor every Period, up to
// the pool's capacity:
//
//	effective(t) = min(capacity, Start · Factor^((t − epoch) / Period))
//
// The epoch is shared through Redis (see Manager), so every worker computes
// the same rate, and it starts again after the pool has been idle for
// IdleReset. The zero Ramp (Start 0) is off: the effective rate is the
// capacity.
//
// The presets follow the vendors' guidance: RampGCS is Cloud Storage's
// "start at about 1,000 writes per second and double every 20 minutes" for
// a new key range; RampFirestore is Firestore's "500/50/5" rule (start at
// 500 operations per second, increase by 50 % every 5 minutes).
type Ramp struct {
	// Start is the effective rate at the epoch, in units/s; > 0 turns the
	// ramp on.
	Start float64
	// Factor multiplies the rate every Period; > 1.
	Factor float64
	// Period is how often the rate is multiplied by Factor; ≥ 1 s.
	Period time.Duration
	// IdleReset is how long the pool must go without demand before the
	// ramp starts again from Start. Default 24 h.
	IdleReset time.Duration
}

// Ramp presets (see Ramp).
var (
	RampGCS       = Ramp{Start: 1000, Factor: 2, Period: 20 * time.Minute}
	RampFirestore = Ramp{Start: 500, Factor: 1.5, Period: 5 * time.Minute}
)

// DefaultIdleReset is the IdleReset of a ramp that does not set one.
const DefaultIdleReset = 24 * time.Hour

// On reports whether the ramp applies.
func (r Ramp) On() bool { return r.Start > 0 }

func (r Ramp) withDefaults() Ramp {
	if r.On() && r.IdleReset == 0 {
		r.IdleReset = DefaultIdleReset
	}
	return r
}

// validate reports the first field that cannot work, for an enabled ramp.
func (r Ramp) validate() error {
	switch {
	case !r.On():
		return nil
	case math.IsInf(r.Start, 0) || math.IsNaN(r.Start):
		return fmt.Errorf("ramp start must be a finite rate > 0, got %v", r.Start)
	case !(r.Factor > 1) || math.IsInf(r.Factor, 0):
		return fmt.Errorf("ramp factor must be a finite number > 1, got %v", r.Factor)
	case r.Period < time.Second:
		return fmt.Errorf("ramp period must be ≥ 1s, got %v", r.Period)
	case r.IdleReset < 0:
		return fmt.Errorf("ramp idle reset must not be negative, got %v", r.IdleReset)
	}
	return nil
}

// String describes the ramp, e.g. "ramp 1000/s ×2 every 20m0s".
func (r Ramp) String() string {
	if !r.On() {
		return "no ramp"
	}
	return fmt.Sprintf("ramp %v/s ×%v every %v", r.Start, r.Factor, r.Period)
}

// Switch is a live change of a pool's capacity or partitions (SetPool),
// scheduled for At so that every worker applies it at the same instant:
// before At the pool had Capacity and Partitions; from At on, the values of
// the Pool that carries the Switch.
type Switch struct {
	At         time.Time
	Capacity   float64
	Partitions int
}

// schedule is a pool's effective rate over time: the capacity and
// partitions in force (the Switch splits time in two), under the ramp.
type schedule struct {
	pool  Pool
	epoch time.Time // the ramp's shared epoch; zero when unknown (rate = Start)
}

// at returns the capacity and partitions in force at t.
func (s schedule) at(t time.Time) (capacity float64, partitions int) {
	if sw := s.pool.Switch; sw != nil && t.Before(sw.At) {
		return sw.Capacity, sw.Partitions
	}
	return s.pool.Capacity, s.pool.Partitions
}

// partitions returns the number of partitions in force at t.
func (s schedule) partitions(t time.Time) int {
	_, p := s.at(t)
	return p
}

// effective returns the pool's effective rate at t, in units/s.
func (s schedule) effective(t time.Time) float64 {
	c, _ := s.at(t)
	r := s.pool.Ramp
	if !r.On() {
		return c
	}
	if s.epoch.IsZero() || !t.After(s.epoch) {
		return min(c, r.Start)
	}
	return min(c, r.Start*math.Pow(r.Factor, t.Sub(s.epoch).Seconds()/r.Period.Seconds()))
}

// partitionRate returns the rate one lease is worth at t, in units/s.
func (s schedule) partitionRate(t time.Time) float64 {
	_, p := s.at(t)
	return s.effective(t) / float64(max(p, 1))
}

// partitionCredit returns the integral of partitionRate over [from, to), in
// units: exact, in closed form, across the switch and the ramp.
func (s schedule) partitionCredit(from, to time.Time) float64 {
	if !to.After(from) {
		return 0
	}
	if sw := s.pool.Switch; sw != nil && sw.At.After(from) && sw.At.Before(to) {
		return s.partitionCredit(from, sw.At) + s.partitionCredit(sw.At, to)
	}
	c, p := s.at(from)
	return s.rampIntegral(from, to, c) / float64(max(p, 1))
}

// rampIntegral is ∫ min(c, ramp(t)) dt over [from, to), in units.
func (s schedule) rampIntegral(from, to time.Time, c float64) float64 {
	r := s.pool.Ramp
	secs := to.Sub(from).Seconds()
	if !r.On() || r.Start >= c {
		return c * secs
	}
	if s.epoch.IsZero() {
		return r.Start * secs
	}
	var sum float64
	if from.Before(s.epoch) { // before the epoch the rate is Start
		end := minTime(to, s.epoch)
		sum += r.Start * end.Sub(from).Seconds()
		from = end
	}
	if !to.After(from) {
		return sum
	}
	// The ramp reaches c at cross seconds after the epoch.
	lnF := math.Log(r.Factor)
	cross := r.Period.Seconds() * math.Log(c/r.Start) / lnF
	a, b := from.Sub(s.epoch).Seconds(), to.Sub(s.epoch).Seconds()
	if a < cross {
		hi := math.Min(b, cross)
		// ∫ Start·F^(x/T) dx = Start·T/ln F · (F^(hi/T) − F^(a/T))
		T := r.Period.Seconds()
		sum += r.Start * T / lnF * (math.Pow(r.Factor, hi/T) - math.Pow(r.Factor, a/T))
		a = hi
	}
	if b > a {
		sum += c * (b - a)
	}
	return sum
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
