package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrSwitchPending is wrapped by SetPool's error when an earlier live
// change has not taken effect yet.
var ErrSwitchPending = errors.New("lease: a live change is already pending")

// ErrChangedConcurrently is wrapped by SetPool's error when the stored
// definition changed between its read and its write (the compare-and-set
// lost to another writer): read the definition again and decide anew.
var ErrChangedConcurrently = errors.New("lease: pool changed concurrently")

// Live-change timing.
const (
	// DecreaseLead is how far ahead of the change a decrease switches
	// (capacity and partitions both no higher): 250 ms, time for the
	// workers subscribed to the change channel to read it, so that the
	// new capacity is in force before the next second.
	DecreaseLead = 250 * time.Millisecond
	// MinLead is the least lead SetPool takes for a raise: 250 ms.
	MinLead = 250 * time.Millisecond
	// switchGap is the least time between two switches: one pacer window,
	// since a worker's schedule knows only the latest switch and its
	// sliding second must not reach back across two.
	switchGap = time.Second
)

// SetPool changes a pool's capacity and partitions while workers run, by
// the rule every live change follows (`sluice pool set`, a definition
// applied at start, a capacity source's decision):
//
//   - a decrease (neither capacity nor partitions higher) switches
//     DecreaseLead from now: at once, and before the next second;
//   - a raise switches at now + lead.
//
// Either way the change is stored as the new definition with a Switch
// that keeps the old values until then, so that every worker switches at
// the same instant: the sum of the workers' rates never exceeds the old
// capacity before the switch nor the new one after it, and no worker uses
// new partitions before the others stopped using the old ones. The change
// is published on the pool's change channel; workers confirm the
// definition's version with every keep-alive (at most RenewEvery/3 apart)
// and stop counting their leases if they cannot for half a renewal
// interval. A raise of the capacity alone is safe with any lead (a worker
// that learns of it late uses less, not more); one that adds partitions
// should have a lead of at least one renewal interval (TTL/3), so that a
// worker that learns late does not count old partitions at the old rate
// beside new ones. SetPool refuses a lead under MinLead. A switch comes at
// least a second after the one before it.
//
// capacity 0 or partitions 0 keep the stored value. It returns the new
// definition, or an error wrapping ErrNoPool, ErrInvalidPool,
// ErrSwitchPending (an earlier change is still ahead),
// ErrChangedConcurrently (another writer changed it meanwhile), or a Redis
// error.
func SetPool(ctx context.Context, client redis.UniversalClient, prefix, name string, capacity float64, partitions int, lead time.Duration, now time.Time) (Pool, error) {
	return UpdatePool(ctx, client, prefix, name, Update{Capacity: capacity, Partitions: partitions, Lead: lead}, now)
}

// Update is a live change of a pool (see UpdatePool). Zero fields keep
// the stored value.
type Update struct {
	// Capacity is the new capacity, units/s; 0 keeps it.
	Capacity float64
	// Partitions is the new number of partitions; 0 keeps it.
	Partitions int
	// Source, when set, replaces the capacity source.
	Source *Source
	// From, when set, replaces the description of how the capacity was
	// decided (Pool.From).
	From *string
	// Lead is how far ahead a raise switches; ≥ MinLead.
	Lead time.Duration
	// Change, when set, is recorded in the pool's Changes (a definition
	// applied from a worker's flags).
	Change *Change
	// Check, when set, may refuse the change given the stored definition
	// (flap detection); its error is returned as is.
	Check func(stored Pool) error
}

// UpdatePool applies u to pool name by SetPool's rule and returns the new
// definition. A change that alters nothing is not stored (and not
// published); it returns the stored definition. Errors are SetPool's.
func UpdatePool(ctx context.Context, client redis.UniversalClient, prefix, name string, u Update, now time.Time) (Pool, error) {
	if u.Lead < MinLead {
		return Pool{}, fmt.Errorf("%w: pool %q: the switch lead %v must be ≥ %v", ErrInvalidPool, name, u.Lead, MinLead)
	}
	k := keysOn(client, prefix, name)
	key := k.def()
	var (
		out     Pool
		changed bool
	)
	err := client.Watch(ctx, func(tx *redis.Tx) error {
		old, err := loadPool(ctx, tx, key)
		if errors.Is(err, redis.Nil) {
			return fmt.Errorf("%w: pool %q (%s)", ErrNoPool, name, key)
		}
		if err != nil {
			return err
		}
		old.Name = name
		if sw := old.Switch; sw != nil && sw.At.After(now) {
			return fmt.Errorf("%w: pool %q switches to %s at %s", ErrSwitchPending, name, old, sw.At.Format(time.RFC3339Nano))
		}
		if u.Check != nil {
			if err := u.Check(old); err != nil {
				return err
			}
		}
		next := old
		next.Capacity = cmp.Or(u.Capacity, old.Capacity)
		next.Partitions = cmp.Or(u.Partitions, old.Partitions)
		if u.Source != nil {
			next.Source = *u.Source
		}
		if u.From != nil {
			next.From = *u.From
		}
		if u.Change != nil {
			next.Changes = append(slices.Clone(old.Changes), *u.Change)
			if n := len(next.Changes); n > changeHistory {
				next.Changes = next.Changes[n-changeHistory:]
			}
		}
		if next.Capacity == old.Capacity && next.Partitions == old.Partitions {
			if next.Source == old.Source && next.From == old.From && u.Change == nil {
				out = old
				return nil // nothing to change
			}
			next.Switch = old.Switch // no switch: the rates do not change
		} else {
			lead := u.Lead
			if next.Capacity <= old.Capacity && next.Partitions <= old.Partitions {
				lead = DecreaseLead
			}
			at := now.Add(lead)
			if sw := old.Switch; sw != nil && at.Before(sw.At.Add(switchGap)) {
				at = sw.At.Add(switchGap)
			}
			next.Switch = &Switch{At: at, Capacity: old.Capacity, Partitions: old.Partitions}
		}
		if err := next.Validate(); err != nil {
			return err
		}
		data, err := json.Marshal(next)
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, data, 0)
			p.Incr(ctx, k.defVersion())
			return nil
		})
		out, changed = next, true
		return err
	}, key)
	if errors.Is(err, redis.TxFailedErr) {
		return Pool{}, fmt.Errorf("%w: pool %q; try again", ErrChangedConcurrently, name)
	}
	if err != nil {
		return Pool{}, err
	}
	if changed {
		// Workers read the definition at once; without channel rights they
		// see the version at their next keep-alive instead.
		_ = client.Publish(ctx, k.changes(), "d").Err()
	}
	return out, nil
}

// rampEpochScript returns the ramp's shared epoch (Unix ms), creating it as
// ARGV[1] if there is none; with ARGV[3] = "1" (the caller has demand) it
// also keeps the key alive for ARGV[2] ms, so it expires, and the ramp
// starts over, once the pool has been idle that long.
var rampEpochScript = newScript(`
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

// resyncEvery is how often a Manager reads the members and a pool
// definition without a ramp even when the change feed and the versions
// say nothing changed: a safety net, not the way changes are learnt.
const resyncEvery = 30 * time.Second

func unknownVersions(n int) []int64 {
	v := make([]int64, n)
	for i := range v {
		v[i] = -1
	}
	return v
}

// checkDefinition reads the definition when the change feed or a version
// says it changed, or when the safety net is due (every RenewEvery/2 for
// a ramp, whose shared epoch a worker with demand keeps alive, else every
// resyncEvery). If the definition has not been known current for half a
// renewal interval (read, or its version confirmed by an announcement),
// every lease stops counting: the worker could otherwise miss a switch.
func (m *Manager) checkDefinition(ctx context.Context, now time.Time) {
	if m.defDirty.Swap(false) || !now.Before(m.nextRead) {
		if !m.refreshPool(ctx) {
			m.defDirty.Store(true) // again at the next tick
		}
	}
	if ctx.Err() != nil {
		return
	}
	stale := time.Since(m.defReadAt)
	if m.defReadAt.IsZero() || stale <= m.cfg.RenewEvery/2 {
		return
	}
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
		m.unlock(ctx, hs, time.Time{})
	}
}

// refreshPool reads the pool definition (and the ramp epoch) from the
// first Redis that answers, so that a live change applies well before its
// switch. Leases on partitions a pending switch removes stop counting at
// the switch. It returns false when no Redis answered.
func (m *Manager) refreshPool(ctx context.Context) bool {
	now := time.Now()
	var (
		p     Pool
		epoch time.Time
		ver   int64
		err   error
		from  int
	)
	for i, c := range m.clients {
		if p, epoch, ver, err = m.readPool(ctx, c, now); err == nil || ctx.Err() != nil {
			from = i
			break
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			m.logErr("lease_pool_read", "pool definition read failed", err)
		}
		return false
	}
	for i := range m.seenDef {
		m.seenDef[i] = m.reportedDef[i]
	}
	m.seenDef[from] = ver
	m.defReadAt, m.nextRead = now, now.Add(resyncEvery)
	if p.Ramp.On() {
		m.nextRead = now.Add(m.cfg.RenewEvery / 2)
	}
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
	return true
}

// watch marks the members or the definition for reading, and wakes the
// loop, when a change is published on c's change channel, until ctx is
// done. After a resubscription both are read, since messages may have
// been lost meanwhile; a lost message is also caught by the versions the
// next keep-alive returns. The subscription's connection is checked with
// a PING after 30 s without a message.
func (m *Manager) watch(ctx context.Context, c redis.UniversalClient) {
	ps := c.Subscribe(ctx, m.keys.changes())
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(64), redis.WithChannelHealthCheckInterval(30*time.Second))
	own := "m " + m.cfg.WorkerID
	subscribed := false
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			switch v := msg.(type) {
			case *redis.Subscription:
				if !subscribed {
					// The first: the first step reads both anyway, and a
					// change published before the subscription took effect
					// shows in the versions of the next keep-alive.
					subscribed = true
					continue
				}
				m.membersDirty.Store(true)
				m.defDirty.Store(true)
			case *redis.Message:
				switch {
				case v.Payload == "d":
					m.defDirty.Store(true)
				case v.Payload == "f":
					m.freed.Store(true)
				case v.Payload != own:
					m.membersDirty.Store(true)
				default:
					continue
				}
			default:
				continue
			}
			select {
			case m.wake <- struct{}{}:
			default:
			}
		}
	}
}

// readPool reads the definition and, for a ramp, the shared epoch (zero
// when the ramp has not started), creating or refreshing the epoch while
// the worker has demand.
func (m *Manager) readPool(ctx context.Context, c redis.UniversalClient, now time.Time) (Pool, time.Time, int64, error) {
	rctx, cancel := context.WithTimeout(ctx, m.opTimeout)
	defer cancel()
	ver, err := c.Get(rctx, m.keys.defVersion()).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return Pool{}, time.Time{}, 0, fmt.Errorf("lease: read pool definition version: %w", err)
	}
	p, t, err := m.readPoolAt(rctx, c, now)
	return p, t, ver, err
}

// readPoolAt is readPool without the version.
func (m *Manager) readPoolAt(rctx context.Context, c redis.UniversalClient, now time.Time) (Pool, time.Time, error) {
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
