package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrStalled is wrapped by the *StalledError Run returns.
var ErrStalled = errors.New("ingest: no progress")

// StalledError is returned by Pipeline.Run when a failure has kept the
// pipeline from making progress for Config.StallTimeout.
type StalledError struct {
	// What failed: "the sink is paused", "the dead-letter topic is
	// unreachable" or "the queue is unreachable".
	What string
	// For is how long it had lasted.
	For time.Duration
	// Last is the latest error, e.g. "HTTP 503: service unavailable".
	Last string
}

func (e *StalledError) Error() string {
	msg := fmt.Sprintf("ingest: no progress for %s: %s", e.For.Round(time.Second), e.What)
	if e.Last != "" {
		msg += " (last error: " + e.Last + ")"
	}
	return msg
}

func (e *StalledError) Unwrap() error { return ErrStalled }

// trouble is the longest-lasting current failure; its zero value means
// none.
type trouble struct {
	what string
	age  time.Duration
	last string
}

func (t trouble) err() error {
	return &StalledError{What: t.what, For: t.age, Last: t.last}
}

// failing returns the failure that has lasted longest at now.
func (p *Pipeline) failing(now time.Time) trouble {
	var worst trouble
	consider := func(what string, sinceNs int64, last string) {
		if sinceNs == 0 {
			return
		}
		if age := now.Sub(time.Unix(0, sinceNs)); age > worst.age {
			worst = trouble{what: what, age: age, last: last}
		}
	}
	if paused, since := p.breaker.paused(); paused {
		consider("the sink is paused", since.UnixNano(), p.breaker.lastErr())
	}
	consider("the dead-letter topic is unreachable", p.letters.failing.Load(), "")
	consider("the queue is unreachable", p.fetchFailing.Load(), "")
	return worst
}

// watch stops the pipeline with a *StalledError once a failure has lasted
// StallTimeout; without one it does nothing.
func (p *Pipeline) watch(ctx context.Context, stop context.CancelCauseFunc) {
	if p.cfg.StallTimeout <= 0 {
		return
	}
	tick := time.NewTicker(min(time.Second, p.cfg.StallTimeout/4))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if t := p.failing(now); t.age >= p.cfg.StallTimeout {
				p.log.Error("giving up", "err", t.err())
				stop(t.err())
				return
			}
		}
	}
}
