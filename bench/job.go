package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// member is one worker of a job: sluice's or a peer's.
type member interface {
	run(ctx context.Context) error
	progress() progress
	redis() *redisProbe // nil when it does not use Redis
	timeline() *tally
	goal() int64
}

// progress is a member's running totals.
type progress struct {
	finished, attempts, throttled, requests int64
	first, last                             time.Time     // first fetch, last finished record
	guardMin, guardFinal                    time.Duration // the guard in effect (sluice workers)
}

// outcome is what a job measured.
type outcome struct {
	elapsed      time.Duration // earliest first fetch to latest last finish
	records      int64
	attempts     int64 // record attempts sent to the sink
	throttled    int64 // record attempts answered 429
	requests     int64
	commands     int64 // Redis commands sent by the members
	lockAttempts int64
	lockFailures int64
	members      []progress
}

// runJob runs members until each has finished its goal (or timeout), then
// stops them. start, when not nil, is closed once every group in groups is
// stable, so sluice workers that lease ahead start fetching together.
func (e *env) runJob(ctx context.Context, members []member, start chan struct{}, groups []string, timeout time.Duration) (outcome, error) {
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(members))
	for _, m := range members {
		go func() { errs <- m.run(jctx) }()
	}
	running := len(members)
	wait := func() error {
		cancel()
		var all []error
		for ; running > 0; running-- {
			if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
				all = append(all, err)
			}
		}
		return errors.Join(all...)
	}
	if start != nil {
		e.awaitGroups(jctx, groups)
		close(start)
	}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = wait()
			return outcome{}, context.Cause(ctx)
		case err := <-errs:
			running--
			_ = wait()
			return outcome{}, fmt.Errorf("a worker stopped early: %v", err)
		case <-tick.C:
		}
		done := true
		for _, m := range members {
			if m.progress().finished < m.goal() {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			_ = wait()
			return outcome{}, fmt.Errorf("job did not finish within %s", timeout)
		}
	}
	out := outcome{}
	var first, last time.Time
	for _, m := range members {
		p := m.progress()
		out.members = append(out.members, p)
		out.records += p.finished
		out.attempts += p.attempts
		out.throttled += p.throttled
		out.requests += p.requests
		if first.IsZero() || p.first.Before(first) {
			first = p.first
		}
		if p.last.After(last) {
			last = p.last
		}
		if r := m.redis(); r != nil {
			out.commands += r.commands.Load()
			out.lockAttempts += r.lockAttempts.Load()
			out.lockFailures += r.lockFailures.Load()
		}
	}
	out.elapsed = last.Sub(first)
	return out, wait()
}

// awaitGroups waits (up to 30 s) until every group has a member and is
// stable, so no rebalance moves records a worker already fetched.
func (e *env) awaitGroups(ctx context.Context, groups []string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, g := range groups {
		for {
			n, stable, err := queue.GroupMembers(ctx, e.brokers, g)
			if (err == nil && n > 0 && stable) || ctx.Err() != nil {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
