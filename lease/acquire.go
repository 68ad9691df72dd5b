package lease

import (
	"cmp"
	"context"
	"fmt"
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

// lockScript takes, in the order of KEYS, up to ARGV[1] of the leases
// KEYS[i] (i ≤ n, KEYS holding n candidate leases and then their n
// hand-over keys) that no one holds, each with the value ARGV[3] and a PX
// of ARGV[2] ms, as redsync's lock does for one (SET NX PX: the script is
// atomic, so a key the MGET finds free is set plainly). For each lease it
// takes it answers i and the PTTL of its hand-over key, read in the same
// atomic step, so that the key speaks only of the last release before the
// lock. One call locks a worker's whole share on one Redis in one round
// trip, for about 2 + 2k commands as the server counts them when it takes
// k leases (the call, an MGET per 500 candidates, a SET and a PTTL per
// lease), where redsync's lock takes a round trip and a command per lease
// and the hand-over reads as many again.
var lockScript = newScript(`
local n = #KEYS / 2
local want = tonumber(ARGV[1])
local out = {}
for i = 1, n, 500 do
  local vs = redis.call('MGET', unpack(KEYS, i, math.min(i + 499, n)))
  for j, v in ipairs(vs) do
    if #out >= 2 * want then
      return out
    end
    local k = i + j - 1
    if not v then
      redis.call('SET', KEYS[k], ARGV[3], 'PX', ARGV[2])
      out[#out + 1] = k
      out[#out + 1] = redis.call('PTTL', KEYS[n + k])
    end
  end
end
return out`)

// acquire tries to lock up to n partitions this worker does not hold, its
// own first (see candidates), with one lockScript call per Redis, and
// returns how many it got and, when it got none, the instant the first
// lease of a worker that is no longer a member expires (zero if there is
// none). A lease is this worker's when a quorum of the Redis clients
// (len/2 + 1) locked it; it counts from its lock, or from the instant its
// hand-over key gives when every Redis has one (see Config.HandOver),
// until the call's start + TTL − 1 % of the TTL (as redsync computes a
// lock's validity) − Margin. Locks short of a quorum or already too late
// to count are unlocked, and after a failed call every lock of the attempt
// is, as redsync does for a failed lock.
func (m *Manager) acquire(ctx context.Context, n int) (int, time.Time) {
	cands := m.candidates()
	if len(cands) == 0 || n <= 0 {
		return 0, time.Time{}
	}
	keys := make([]string, 2*len(cands))
	for i, p := range cands {
		keys[i], keys[len(cands)+i] = m.keys.partition(p), m.keys.handOver(p)
	}
	value := m.cfg.WorkerID + "/" + randomHex(16)
	// Per candidate: how many Redis locked it, how many of those had its
	// hand-over key, and the latest instant they give.
	type lock struct {
		votes, handed int
		since         time.Time
	}
	var (
		mu    sync.Mutex
		locks = make([]lock, len(cands))
	)
	start := time.Now()
	answered := m.each(ctx, func(ctx context.Context, _ int, c redis.UniversalClient) error {
		res, err := lockScript.Run(ctx, c, keys, n, m.cfg.Pool.TTL.Milliseconds(), value).Int64Slice()
		at := time.Now()
		if err == nil && len(res)%2 != 0 {
			err = fmt.Errorf("lease: lock answered %d values, not index and hand-over pairs", len(res))
		}
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for j := 0; j < len(res); j += 2 {
			i, ttl := int(res[j])-1, time.Duration(res[j+1])*time.Millisecond
			if i < 0 || i >= len(cands) {
				continue
			}
			l := &locks[i]
			l.votes++
			if ttl > 0 {
				l.handed++
				// Read as the key's remaining life against this worker's
				// clock after the answer, which only makes it later.
				if s := at.Add(ttl - m.handOverKeep() + handOverSlack); s.After(l.since) {
					l.since = s
				}
			}
		}
		return nil
	}, "lease_acquire", "lease acquire failed")

	until := start.Add(m.cfg.Pool.TTL - m.cfg.Pool.TTL/100)
	quorum := len(m.clients)/2 + 1
	var got, undo []*held
	failed := len(m.clients) - answered
	m.mu.Lock()
	now := time.Now()
	for i, l := range locks {
		if l.votes == 0 && answered == len(m.clients) {
			continue
		}
		p := cands[i]
		h := &held{partition: p, renewedAt: start, mutex: m.rs.NewMutex(keys[i],
			redsync.WithExpiry(m.cfg.Pool.TTL), redsync.WithValue(value))}
		from := now
		if l.handed == len(m.clients) {
			from = minTime(l.since, now)
		}
		h.count = span{from: from, to: m.countEnd(p, until.Add(-m.cfg.Margin), now)}
		if l.votes < quorum || !now.Before(h.count.to) {
			undo = append(undo, h)
			if l.votes > 0 {
				failed++ // locked somewhere, but not a lease
			}
			continue
		}
		m.held[p] = h
		got = append(got, h)
	}
	m.mu.Unlock()
	m.events.acquired.Add(int64(len(got)))
	for _, h := range got {
		m.log.Debug("lease acquired", "partition", h.partition)
	}
	m.events.failed.Add(int64(failed))
	m.unlock(ctx, undo, time.Time{})
	if len(got) > 0 || ctx.Err() != nil {
		return len(got), time.Time{}
	}
	return 0, m.orphanExpiry(ctx, keys[:len(cands)])
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

// candidates returns the partitions not held, shuffled, this worker's own
// first.
func (m *Manager) candidates() []int {
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
	return all
}

// orphanExpiry returns, when none of the partition keys names looks free in the first Redis and some are held by workers that
// are no longer members (a crashed worker's leases, which free themselves
// only when their keys expire, with no release to announce it), the
// instant the first of them expires, read with a PTTL each (at most
// maxExpiryReads) in one round trip; zero otherwise.
func (m *Manager) orphanExpiry(ctx context.Context, names []string) time.Time {
	if m.peers == nil {
		return time.Time{}
	}
	cctx, cancel := context.WithTimeout(ctx, m.opTimeout)
	defer cancel()
	vals, err := m.clients[0].MGet(cctx, names...).Result()
	if err != nil {
		if ctx.Err() == nil {
			m.logErr("lease_lookup", "partition lookup failed", err)
		}
		return time.Time{}
	}
	var orphans []string
	for i, v := range vals {
		value, taken := v.(string)
		if !taken {
			return time.Time{}
		}
		if _, live := m.peers[holderOf(value)]; !live {
			orphans = append(orphans, names[i])
		}
	}
	if len(orphans) == 0 {
		return time.Time{}
	}
	return m.firstExpiry(cctx, orphans[:min(len(orphans), maxExpiryReads)])
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
