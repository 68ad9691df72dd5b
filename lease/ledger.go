package lease

import (
	"slices"
	"time"
)

// span is an interval [from, to) during which one lease counted.
type span struct{ from, to time.Time }

// clip returns [from, to) ∩ s; ok is false when it is empty.
func (s span) clip(from, to time.Time) (lo, hi time.Time, ok bool) {
	lo, hi = s.from, s.to
	if from.After(lo) {
		lo = from
	}
	if to.Before(hi) {
		hi = to
	}
	return lo, hi, hi.After(lo)
}

func (s span) contains(t time.Time) bool { return !t.Before(s.from) && t.Before(s.to) }

// ledger records when leases counted, so that Rate and Credit are exact
// and never change for the past: a running lease's span ends at its
// counting end (Until − margin), which only moves forward while it has not
// passed; a lease that stops counting moves to the closed history with its
// end cut at the moment it stopped. The zero value is ready; it is not
// safe for concurrent use.
type ledger struct {
	closed []span
}

// close records a span that stopped counting at end (the span's own end if
// it came first).
func (l *ledger) close(s span, at time.Time) {
	if at.Before(s.to) {
		s.to = at
	}
	if s.to.After(s.from) {
		l.closed = append(l.closed, s)
	}
}

// prune forgets spans that ended before horizon.
func (l *ledger) prune(horizon time.Time) {
	l.closed = slices.DeleteFunc(l.closed, func(s span) bool { return s.to.Before(horizon) })
}

// count returns how many closed spans contain t.
func (l *ledger) count(t time.Time) int {
	n := 0
	for _, s := range l.closed {
		if s.contains(t) {
			n++
		}
	}
	return n
}

// credit returns Σ rate([from, to) ∩ s) over the closed spans, where
// rate(lo, hi) is the integral of one lease's rate over [lo, hi).
func (l *ledger) credit(from, to time.Time, rate func(lo, hi time.Time) float64) float64 {
	var sum float64
	for _, s := range l.closed {
		if lo, hi, ok := s.clip(from, to); ok {
			sum += rate(lo, hi)
		}
	}
	return sum
}
