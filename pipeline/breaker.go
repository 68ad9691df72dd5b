package pipeline

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// breaker pauses the sink after a write failed as a whole (a circuit
// breaker): nothing more is sent until the pause is over, then one probe
// goes out alone; its success ends the pause, its failure starts a longer
// one (RetryPolicy.Pause: capped exponential, at least the sink's
// Retry-After). While paused the pipeline takes no budget.
type breaker struct {
	retry ingest.RetryPolicy
	log   *slog.Logger

	mu       sync.Mutex
	state    breakerState
	failures int       // consecutive failures
	until    time.Time // open: when the probe may go
	since    time.Time // start of the current pause; zero when closed
	last     string    // the latest failure
	total    time.Duration
	changed  chan struct{} // closed and replaced at every change of state
	ok       int64         // answered writes so far
}

type breakerState int

const (
	closed  breakerState = iota // writing
	open                        // paused until until
	probing                     // paused, one probe in flight
)

func (b *breaker) init(retry ingest.RetryPolicy, log *slog.Logger) {
	b.retry, b.log, b.changed = retry, log, make(chan struct{})
}

// gate says whether the slice loop may send. With changed nil it may: all
// that fits (probe false), or exactly one batch, the probe (probe true,
// after which the breaker waits for its answer). Otherwise the loop waits
// until until (when not zero) or until changed is closed.
func (b *breaker) gate(now time.Time) (until time.Time, changed <-chan struct{}, probe bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case open:
		if now.Before(b.until) {
			return b.until, b.changed, false
		}
		b.set(probing)
		return time.Time{}, nil, true
	case probing:
		return time.Time{}, b.changed, false
	}
	return time.Time{}, nil, false
}

// cancelProbe gives back a probe that found nothing to send.
func (b *breaker) cancelProbe() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == probing {
		b.until = time.Time{}
		b.set(open)
	}
}

// failure records a failed write (or a sink that did not answer its
// warm-up) and returns when the probe may go, and whether it is the first
// failure since the sink last answered (first).
func (b *breaker) failure(now time.Time, err error) (probeAt time.Time, first bool) {
	var retryAfter time.Duration
	if se := (*ingest.SinkError)(nil); errors.As(err, &se) {
		retryAfter = se.RetryAfter
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	b.last = err.Error()
	wait := b.retry.Pause(b.failures, retryAfter)
	if until := now.Add(wait); until.After(b.until) {
		b.until = until
	}
	if b.state == closed {
		b.since = now
		b.log.Warn("sink paused: a write failed as a whole; records keep their place and attempts",
			"err", err, "retry_in", wait.Round(time.Millisecond))
	}
	b.set(open)
	return b.until, b.failures == 1
}

// success records an answered write; it ends a pause. judged: the sink
// gave a verdict on a record (stored it, had it, refused it for good); an
// answer that throttled every record in key ranges known hot ends a pause
// too (the sink works, its throttles are the ranges'), but is no success.
func (b *breaker) success(now time.Time, judged bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if judged {
		b.ok++
	}
	b.failures = 0
	if b.state == closed {
		return
	}
	paused := now.Sub(b.since)
	b.total += paused
	if judged {
		b.log.Info("sink resumed", "paused_s", paused.Seconds(), "last_err", b.last)
	} else {
		b.log.Info("sink pause over: its throttles are key ranges', paced on their own", "paused_s", paused.Seconds(), "last_err", b.last)
	}
	b.since, b.until = time.Time{}, time.Time{}
	b.set(closed)
}

// set changes the state and wakes the waiters. b.mu is held.
func (b *breaker) set(s breakerState) {
	b.state = s
	close(b.changed)
	b.changed = make(chan struct{})
}

// halted reports whether a failure paused the sink and no probe is being
// sent: a slice being dispatched stops sending.
func (b *breaker) halted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == open
}

// paused reports whether the sink is paused and since when.
func (b *breaker) paused() (bool, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state != closed, b.since
}

// successes is the number of writes answered with a verdict so far.
func (b *breaker) successes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ok
}

// lastErr is the latest failure, "" before any.
func (b *breaker) lastErr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last
}

// pausedTotal is the time paused in all up to now.
func (b *breaker) pausedTotal(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != closed {
		return b.total + now.Sub(b.since)
	}
	return b.total
}
