package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrSwitchPending is wrapped by SetPool's error when an earlier live
// change has not taken effect yet.
var ErrSwitchPending = errors.New("lease: a live change is already pending")

// SetPool changes a pool's capacity and partitions while workers run. The
// change takes effect at now + lead for every worker at once: it is stored
// as the new definition with a Switch that keeps the old values until then,
// so that the sum of the workers' rates never exceeds the old capacity
// before the switch nor the new one after it, and no worker uses the
// new partitions before the others stopped using the old ones. Workers
// read the definition every RenewEvery/2 and stop counting their leases if they
// cannot for half a renewal interval, so lead should be at least one
// renewal interval (TTL/3); SetPool refuses less than a second.
//
// capacity 0 or partitions 0 keep the stored value. It returns the new
// definition, or an error wrapping ErrNoPool, ErrInvalidPool,
// ErrSwitchPending (an earlier change is still ahead), or a Redis error.
func SetPool(ctx context.Context, client redis.UniversalClient, prefix, name string, capacity float64, partitions int, lead time.Duration, now time.Time) (Pool, error) {
	if lead < time.Second {
		return Pool{}, fmt.Errorf("%w: pool %q: the switch lead %v must be ≥ 1s", ErrInvalidPool, name, lead)
	}
	key := keysFor(prefix, name).def()
	var out Pool
	err := client.Watch(ctx, func(tx *redis.Tx) error {
		old, err := loadPool(ctx, tx, key)
		if errors.Is(err, redis.Nil) {
			return fmt.Errorf("%w: pool %q (%s)", ErrNoPool, name, key)
		}
		if err != nil {
			return err
		}
		if sw := old.Switch; sw != nil && sw.At.After(now) {
			return fmt.Errorf("%w: pool %q switches to %s at %s", ErrSwitchPending, name, old, sw.At.Format(time.RFC3339Nano))
		}
		next := old
		next.Capacity = cmp.Or(capacity, old.Capacity)
		next.Partitions = cmp.Or(partitions, old.Partitions)
		next.Switch = &Switch{At: now.Add(lead), Capacity: old.Capacity, Partitions: old.Partitions}
		if err := next.Validate(); err != nil {
			return err
		}
		data, err := json.Marshal(next)
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, data, 0)
			return nil
		})
		out = next
		return err
	}, key)
	if errors.Is(err, redis.TxFailedErr) {
		return Pool{}, fmt.Errorf("lease: pool %q changed concurrently; try again", name)
	}
	return out, err
}

// rampEpochScript returns the ramp's shared epoch (Unix ms), creating it as
// ARGV[1] if there is none; with ARGV[3] = "1" (the caller has demand) it
// also keeps the key alive for ARGV[2] ms, so it expires, and the ramp
// starts over, once the pool has been idle that long.
var rampEpochScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  if ARGV[3] ~= '1' then return false end
  v = ARGV[1]
  redis.call('SET', KEYS[1], v, 'PX', ARGV[2])
elseif ARGV[3] == '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return v
`)

// refreshPool reads the pool definition (and the ramp epoch) from the
// first Redis that answers, every RenewEvery/2 (each Tick while it fails),
// so that a live change applies well before its switch. Leases on partitions a pending switch removes stop counting at the
// switch. If the definition cannot be read for half a renewal interval,
// every lease stops counting: the worker could otherwise miss a switch.
func (m *Manager) refreshPool(ctx context.Context) {
	now := time.Now()
	var (
		p     Pool
		epoch time.Time
		err   error
	)
	for _, c := range m.clients {
		if p, epoch, err = m.readPool(ctx, c, now); err == nil || ctx.Err() != nil {
			break
		}
	}
	m.nextRead = now // on failure, again at the next tick
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		m.logErr("lease_pool_read", "pool definition read failed", err)
		if stale := now.Sub(m.defReadAt); !m.defReadAt.IsZero() && stale > m.cfg.RenewEvery/2 {
			m.mu.Lock()
			var hs []*held
			for _, h := range m.held {
				hs = append(hs, h)
			}
			m.mu.Unlock()
			if len(hs) > 0 {
				m.log.Warn("pool definition unread for half a renewal interval; leases stop counting", "stale", stale)
				m.stopCounting(hs)
				m.events.lost.Add(int64(len(hs)))
				m.unlock(ctx, hs)
			}
		}
		return
	}
	m.defReadAt, m.nextRead = now, now.Add(m.cfg.RenewEvery/2)
	m.mu.Lock()
	defer m.mu.Unlock()
	before := m.sched.pool
	m.sched = schedule{pool: p, epoch: epoch}
	for _, h := range m.held {
		h.count.to = m.countEnd(h.partition, h.count.to, now)
	}
	if sw := p.Switch; sw != nil && (before.Switch == nil || !before.Switch.At.Equal(sw.At)) {
		m.log.Info("pool change scheduled", "at", sw.At, "capacity", p.Capacity, "partitions", p.Partitions,
			"capacity_before", sw.Capacity, "partitions_before", sw.Partitions)
	}
}

// readPool reads the definition and, for a ramp, the shared epoch (zero
// when the ramp has not started), creating or refreshing the epoch while
// the worker has demand.
func (m *Manager) readPool(ctx context.Context, c redis.UniversalClient, now time.Time) (Pool, time.Time, error) {
	rctx, cancel := context.WithTimeout(ctx, m.opTimeout)
	defer cancel()
	p, err := loadPool(rctx, c, m.keys.def())
	if errors.Is(err, redis.Nil) {
		// Redis lost its data (restarted without persistence): store the
		// definition this worker last knew again, as EnsurePool would.
		m.mu.Lock()
		p = m.sched.pool
		m.mu.Unlock()
		data, merr := json.Marshal(p)
		if merr != nil {
			return p, time.Time{}, merr
		}
		err = c.SetNX(rctx, m.keys.def(), data, 0).Err()
	}
	if err != nil {
		return p, time.Time{}, err
	}
	if !samePoolKind(p, m.cfg.Pool) {
		return p, time.Time{}, fmt.Errorf("%w: pool %q now counts %s; this worker prices records in %s", ErrPoolMismatch, p.Name, p.Unit, m.cfg.Pool.Unit)
	}
	if !p.Ramp.On() {
		return p, time.Time{}, nil
	}
	m.mu.Lock()
	active := m.demand > 0 || m.cfg.Reserved > 0
	m.mu.Unlock()
	v, err := rampEpochScript.Run(rctx, c, []string{m.keys.rampEpoch()},
		now.UnixMilli(), p.Ramp.IdleReset.Milliseconds(), boolArg(active)).Text()
	if errors.Is(err, redis.Nil) {
		return p, time.Time{}, nil // idle and no epoch: the ramp has not started
	}
	if err != nil {
		return p, time.Time{}, fmt.Errorf("lease: ramp epoch: %w", err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return p, time.Time{}, fmt.Errorf("lease: ramp epoch %q: %w", v, err)
	}
	return p, time.UnixMilli(ms), nil
}

// countEnd caps a lease's counting end for partition p: a partition that a
// pending switch removes counts until the switch at most (but never less
// than now, so the past stays as it was). m.mu is held.
func (m *Manager) countEnd(p int, end, now time.Time) time.Time {
	pool := m.sched.pool
	if sw := pool.Switch; sw != nil && p >= pool.Partitions {
		cut := sw.At
		if cut.Before(now) {
			cut = now
		}
		if cut.Before(end) {
			return cut
		}
	}
	return end
}

// partitionsNow is the number of partitions in force now.
func (m *Manager) partitionsNow() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sched.partitions(time.Now())
}

// samePoolKind reports whether a live definition still counts the unit the
// worker prices records in (capacity, partitions and the switch may change
// live; the TTL the worker locks with is its own).
func samePoolKind(a, b Pool) bool { return a.Unit == b.Unit }

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
