package ingest

import "time"

// Window is a sliding account of units over the half-open window (t−Width, t]
// of a non-decreasing timeline: a deque of (time, units) events, O(1)
// amortized per event. It also keeps the running maximum of its sum, which is
// the most units in any window of that width: the sum over (t−w, t] only
// increases at event times, so the maximum over all windows is attained by a
// window ending at an event, and every such window is measured when the event
// is added.
//
// Instants are offsets on any timeline (from an emulator's epoch, say);
// callers pass them in non-decreasing order. The zero Window needs a Width;
// NewWindow gives one. Not safe for concurrent use.
type Window struct {
	width  time.Duration
	events []event
	head   int           // events[head:] are live
	sum    int64         // units of the live events
	max    int64         // largest sum seen right after an add
	last   time.Duration // time of the latest add
}

type event struct {
	at    time.Duration
	units int64
}

// NewWindow returns an empty Window of the given width.
func NewWindow(width time.Duration) Window { return Window{width: width} }

// Expire drops the events no longer in (at−width, at].
func (w *Window) Expire(at time.Duration) {
	cutoff := at - w.width
	for w.head < len(w.events) && w.events[w.head].at <= cutoff {
		w.sum -= w.events[w.head].units
		w.head++
	}
	if w.head == len(w.events) {
		w.events, w.head = w.events[:0], 0
	} else if w.head >= 1024 && 2*w.head >= len(w.events) {
		n := copy(w.events, w.events[w.head:])
		w.events, w.head = w.events[:n], 0
	}
}

// Add records units at time at and updates the maximum. units ≤ 0 are
// ignored.
func (w *Window) Add(at time.Duration, units int64) {
	if units <= 0 {
		return
	}
	w.Expire(at)
	if n := len(w.events); n > w.head && w.events[n-1].at == at {
		w.events[n-1].units += units
	} else {
		w.events = append(w.events, event{at: at, units: units})
	}
	w.sum += units
	w.max = max(w.max, w.sum)
	w.last = at
}

// WaitFor returns how long after at the live sum, plus pending units added
// at at, drops enough that need more units fit under limit. It assumes
// Expire(at) was called and need ≤ limit; the result is > 0 when the units
// do not fit now and 0 when they do.
func (w *Window) WaitFor(at time.Duration, pending, need, limit int64) time.Duration {
	excess := w.sum + pending + need - limit
	if excess <= 0 {
		return 0
	}
	for _, e := range w.events[w.head:] {
		excess -= e.units
		if excess <= 0 {
			return e.at + w.width - at
		}
	}
	return w.width // only the pending units, added at at, are left to expire
}

// Sum returns the units in (at−Width, at], dropping older events.
func (w *Window) Sum(at time.Duration) int64 {
	w.Expire(at)
	return w.sum
}

// Last returns the time of the latest event added, 0 before any.
func (w *Window) Last() time.Duration { return w.last }

// Max returns the most units seen in any window so far.
func (w *Window) Max() int64 { return w.max }

// Clone returns an independent copy of w (its live events, sum and maximum).
func (w *Window) Clone() Window {
	c := *w
	c.events = append([]event(nil), w.events[w.head:]...)
	c.head = 0
	return c
}
