package lease

import (
	"math"
	"sync"
	"time"
)

// Read-only views of a Manager for monitoring (the metrics package): the
// demand it announces, and how long its Redis has been unreachable.

// redisHealth tracks whether the Manager's announcements reach Redis: a
// round of announcement calls succeeds when a quorum of the Redis masters
// answers (the one Redis when there is one). The zero value is healthy.
type redisHealth struct {
	mu      sync.Mutex
	failing time.Time // the first failed round since the last success; zero while Redis answers
}

// observe records one round of calls that ended at now.
func (h *redisHealth) observe(ok bool, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case ok:
		h.failing = time.Time{}
	case h.failing.IsZero():
		h.failing = now
	}
}

// since returns how long the rounds have been failing at now; 0 while
// the last one succeeded.
func (h *redisHealth) since(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failing.IsZero() {
		return 0
	}
	return max(now.Sub(h.failing), 0)
}

// Demand returns the demand the worker announces to its pool (SetDemand),
// in units/s, capped at the pool's effective rate at now so that it stays
// finite: a worker whose backlog cannot be drained at its current rate
// announces +Inf, and no worker can use more than the whole pool. 0 when
// the worker has no demand.
func (m *Manager) Demand(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.demand
	if !(d > 0) {
		return 0
	}
	return math.Min(d, m.sched.effective(now))
}

// RedisUnreachable returns how long, at now, the worker's announcements
// to Redis have been failing without a success: from the first failed
// round after the last one that reached a quorum of the Redis masters; 0
// while Redis answers. An announcement is made at least every
// Config.KeepAlive, and every Tick while it fails, so an outage shows
// here at most a KeepAlive after it began, and its end within a Tick.
func (m *Manager) RedisUnreachable(now time.Time) time.Duration {
	return m.redisHealth.since(now)
}
