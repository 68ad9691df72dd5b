package lease

import (
	"cmp"
	"context"
	"errors"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
)

// reclaimScript deletes KEYS[1] if it holds a lock of the worker ARGV[1]
// ("<worker>/<token>").
var reclaimScript = newScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '/' then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// reclaim frees the partitions an earlier process with this worker's ID
// still holds (a crashed run of the same bulk load, say), so the worker
// need not wait out their TTL. Worker IDs are unique among live processes,
// so such a lease belongs to a process that is gone.
func (m *Manager) reclaim(ctx context.Context) {
	parts := m.partitionsNow()
	names := make([]string, parts)
	for p := range parts {
		names[p] = m.keys.partition(p)
	}
	var freed atomic.Int64
	m.each(ctx, func(ctx context.Context, _ int, c redis.UniversalClient) error {
		vals, err := c.MGet(ctx, names...).Result()
		if err != nil {
			return err
		}
		for i, v := range vals {
			if s, ok := v.(string); ok && holderOf(s) == m.cfg.WorkerID {
				n, err := reclaimScript.Run(ctx, c, []string{names[i]}, m.cfg.WorkerID).Int()
				if err != nil {
					return err
				}
				freed.Add(int64(n))
			}
		}
		return nil
	}, "lease_reclaim", "reclaiming this worker's earlier leases failed")
	if n := freed.Load(); n > 0 {
		m.log.Info("took back the leases an earlier process with this worker ID held", "partitions", n)
	}
}

// acquire tries to lock up to n partitions this worker does not hold,
// those that look free first, in random order, n at a time (at most
// maxParallelLocks), one try each,
// at most 2n tries in all (when many peers race for the few free
// partitions, most tries fail; the next attempt comes with the next
// release), and returns how many it got and, when none looked free, the
// instant the first lease of a worker that is no longer a member expires
// (zero if there is none).
func (m *Manager) acquire(ctx context.Context, n int) (int, time.Time) {
	want := n
	cands, orphanExpiry := m.candidates(ctx)
	if len(cands) > 2*n {
		cands = cands[:2*n]
	}
	for n > 0 && len(cands) > 0 && ctx.Err() == nil {
		batch := cands[:min(n, len(cands), maxParallelLocks)]
		cands = cands[len(batch):]
		got := make([]*held, len(batch))
		var wg sync.WaitGroup
		for i, p := range batch {
			wg.Go(func() { got[i] = m.tryLock(ctx, p) })
		}
		wg.Wait()
		for _, h := range got {
			if h != nil {
				n--
			}
		}
	}
	return want - n, orphanExpiry
}

// maxParallelLocks bounds the locks one attempt tries at once: each runs on
// a connection of its own, and every connection the client opens costs the
// server a HELLO (bench scenario 10b, 3 workers on 20 partitions: 31
// HELLOs unbounded, 14 with the bound, of about 590 commands in all).
const maxParallelLocks = 4

// tryLock makes one attempt at partition p and, on success, starts counting
// it.
func (m *Manager) tryLock(ctx context.Context, p int) *held {
	mu := m.rs.NewMutex(m.keys.partition(p),
		redsync.WithExpiry(m.cfg.Pool.TTL),
		redsync.WithTries(1),
		redsync.WithGenValueFunc(m.lockValue),
	)
	start := time.Now()
	if err := mu.TryLockContext(ctx); err != nil {
		m.events.failed.Add(1)
		if re := (*redsync.RedisError)(nil); errors.As(err, &re) && ctx.Err() == nil {
			m.logErr("lease_acquire", "lease acquire failed", err, "partition", p)
		}
		return nil
	}
	since, handed := m.handedSince(ctx, p)
	h := &held{partition: p, mutex: mu, renewedAt: start}
	m.mu.Lock()
	now := time.Now()
	from := now
	if handed {
		from = minTime(since, now)
	}
	h.count = span{from: from, to: m.countEnd(p, mu.Until().Add(-m.cfg.Margin), now)}
	ok := now.Before(h.count.to)
	if ok {
		m.held[p] = h
	}
	m.mu.Unlock()
	if !ok { // too slow to be worth anything
		m.unlock(ctx, []*held{h}, time.Time{})
		return nil
	}
	m.events.acquired.Add(1)
	m.log.Debug("lease acquired", "partition", p)
	return h
}

// handOverSlack is how much later than a hand-over key says a taker
// starts counting: the key's expiry and its PTTL are whole milliseconds.
const handOverSlack = 2 * time.Millisecond

// handOverKeep is how long a hand-over key lives after the instant it
// gives: 2 s, a Window and the time a peer takes to lock, and at most
// half the TTL, so that it is gone before a lease taken after it was set
// can expire unreleased (and the partition be taken without a release
// that deletes the key).
func (m *Manager) handOverKeep() time.Duration { return min(2*time.Second, m.cfg.Pool.TTL/2) }

// handOverSince asks Config.HandOver about an unlock at now of n leases
// that stopped counting by stopped; zero when there is no hand-over.
func (m *Manager) handOverSince(now, stopped time.Time, n int) time.Time {
	if m.cfg.HandOver == nil {
		return time.Time{}
	}
	m.mu.Lock()
	freed := float64(n) * m.sched.partitionRate(stopped)
	m.mu.Unlock()
	if since, ok := m.cfg.HandOver(now, stopped, freed); ok {
		return since // unlock leaves no key for one handOverKeep old
	}
	return time.Time{}
}

// handedSince reads partition p's hand-over key, just locked, on every
// Redis, and returns since when the worker may count p: the latest any of
// them gives, read as the key's remaining life against the worker's own
// clock after the answer, which only makes it later. ok is false when any
// of them has none or cannot be read: the caller counts from its lock.
func (m *Manager) handedSince(ctx context.Context, p int) (since time.Time, ok bool) {
	var (
		mu     sync.Mutex
		absent bool
	)
	read := m.each(ctx, func(ctx context.Context, _ int, c redis.UniversalClient) error {
		ttl, err := c.PTTL(ctx, m.keys.handOver(p)).Result()
		at := time.Now()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if ttl <= 0 {
			absent = true
		} else if s := at.Add(ttl - m.handOverKeep() + handOverSlack); s.After(since) {
			since = s
		}
		return nil
	}, "lease_handover", "reading a partition's hand-over failed; it counts from its lock")
	return since, !absent && read == len(m.clients)
}

func (m *Manager) lockValue() (string, error) {
	return m.cfg.WorkerID + "/" + randomHex(16), nil
}

// candidates returns the partitions not held, shuffled, those that look
// free in the first Redis first; those that look taken are left out unless
// the lookup failed. When none looks free and some are held by workers
// that are no longer members (a crashed worker's leases, which free
// themselves only when their keys expire, with no release to announce
// it), it also returns the instant the first of them expires, read with
// a PTTL each (at most maxExpiryReads) in one round trip.
func (m *Manager) candidates(ctx context.Context) ([]int, time.Time) {
	m.mu.Lock()
	var all []int
	for p := range m.sched.partitions(time.Now()) {
		if _, ok := m.held[p]; !ok {
			all = append(all, p)
		}
	}
	m.mu.Unlock()
	mrand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	if n := m.rankOf; n > 1 {
		// This worker's own partitions first (p mod n = its rank among the
		// members, by worker ID): workers that see the same members try
		// disjoint partitions first, so a crowd that starts or rebalances
		// together does not race for the same few.
		own := func(p int) int {
			if p%n == m.rank {
				return 0
			}
			return 1
		}
		slices.SortStableFunc(all, func(a, b int) int { return cmp.Compare(own(a), own(b)) })
	}
	names := make([]string, len(all))
	for i, p := range all {
		names[i] = m.keys.partition(p)
	}
	if len(names) == 0 {
		return nil, time.Time{}
	}
	cctx, cancel := context.WithTimeout(ctx, m.opTimeout)
	defer cancel()
	vals, err := m.clients[0].MGet(cctx, names...).Result()
	if err != nil {
		if ctx.Err() == nil {
			m.logErr("lease_lookup", "partition lookup failed", err)
		}
		return all, time.Time{}
	}
	free := all[:0]
	var orphans []string
	for i, p := range all {
		value, taken := vals[i].(string)
		if !taken {
			free = append(free, p)
			continue
		}
		if _, live := m.peers[holderOf(value)]; m.peers != nil && !live {
			orphans = append(orphans, names[i])
		}
	}
	if len(free) > 0 || len(orphans) == 0 {
		return free, time.Time{}
	}
	return free, m.firstExpiry(cctx, orphans[:min(len(orphans), maxExpiryReads)])
}

// maxExpiryReads bounds the PTTLs of one attempt: a crowd of workers that
// have not yet read each other's announcements sees many holders it does
// not know.
const maxExpiryReads = 8

// firstExpiry returns when the first of the keys expires in the first
// Redis, or zero if none has a time to live left (a key past it answers
// PTTL -2, so an expiry is never in the past).
func (m *Manager) firstExpiry(ctx context.Context, keys []string) time.Time {
	start := time.Now()
	cmds := make([]*redis.DurationCmd, len(keys))
	_, err := m.clients[0].Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.PTTL(ctx, k)
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			m.logErr("lease_lookup", "partition lookup failed", err)
		}
		return time.Time{}
	}
	var first time.Time
	for _, c := range cmds {
		if ttl := c.Val(); ttl > 0 {
			if at := start.Add(ttl); first.IsZero() || at.Before(first) {
				first = at
			}
		}
	}
	return first
}
