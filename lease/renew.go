package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
)

// stopCounting removes the given leases from the held set and closes their
// spans at the current instant; it must run before they are unlocked.
func (m *Manager) stopCounting(hs []*held) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for _, h := range hs {
		if m.held[h.partition] == h {
			delete(m.held, h.partition)
			m.ledger.close(h.count, now)
		}
	}
}

// dropExpired stops tracking leases whose counting end has passed without a
// renewal and unlocks them, in case the key is still theirs.
func (m *Manager) dropExpired(ctx context.Context) {
	m.mu.Lock()
	now := time.Now()
	var gone []*held
	for _, h := range m.held {
		if !now.Before(h.count.to) {
			gone = append(gone, h)
		}
	}
	m.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	m.stopCounting(gone)
	for _, h := range gone {
		m.log.Warn("lease stopped counting before renewal", "partition", h.partition)
	}
	m.events.lost.Add(int64(len(gone)))
	m.unlock(ctx, gone, time.Time{})
}

// ownedLua defines owned(n), for the lease scripts: per index i ≤ n of
// KEYS, whether KEYS[i] still holds ARGV[i] (the lease's value), read with
// one MGET per 500 keys.
const ownedLua = `
local function owned(n)
  local own = {}
  for i = 1, n, 500 do
    local vs = redis.call('MGET', unpack(KEYS, i, math.min(i + 499, n)))
    for j, v in ipairs(vs) do own[i + j - 1] = v == ARGV[i + j - 1] end
  end
  return own
end
`

// extendScript extends every lease KEYS[i] whose value is still ARGV[i]
// to ARGV[#KEYS + 1] ms, and returns, per key, 1 if it did and 0 if not:
// one call renews all of a worker's due leases on one Redis, as redsync's
// extend does for one. The server counts about 2 + n commands for n leases
// (2n with a GET each).
var extendScript = newScript(ownedLua + `
local ttl = ARGV[#KEYS + 1]
local own, out = owned(#KEYS), {}
for k = 1, #KEYS do
  out[k] = own[k] and redis.call('PEXPIRE', KEYS[k], ttl) or 0
end
return out
`)

// releaseScript deletes every lease KEYS[i] (i ≤ n, KEYS holding n
// leases and then their n hand-over keys) whose value is still ARGV[i],
// and with each one sets its hand-over key to expire in ARGV[n + 1] ms,
// or deletes it when that is 0 (see Manager.unlock); it returns how many
// leases it deleted. One call unlocks all of a worker's leases on one
// Redis, as redsync's unlock does for one, for about 3 commands as the
// server counts them (the call, MGET and DEL; and a SET per lease handed
// over) where redsync's costs 3 per lease.
var releaseScript = newScript(ownedLua + `
local n = #KEYS / 2
local px = tonumber(ARGV[n + 1])
local own, del, count = owned(n), {}, 0
for k = 1, n do
  if own[k] then
    count = count + 1
    del[#del + 1] = KEYS[k]
    if px > 0 then
      redis.call('SET', KEYS[n + k], '1', 'PX', px)
    else
      del[#del + 1] = KEYS[n + k]
    end
  end
end
for i = 1, #del, 500 do
  redis.call('DEL', unpack(del, i, math.min(i + 499, #del)))
end
return count
`)

// renewDue extends every lease whose renewal is due, and with them those
// due within the next half renewal interval, so that a worker's leases come
// due together and one call per Redis renews them all. The call runs under
// a deadline at the earliest counting end among them; a lease that does
// not reach a quorum of extends stops counting at once and is unlocked.
func (m *Manager) renewDue(ctx context.Context) {
	m.mu.Lock()
	now := time.Now()
	var (
		due   []*held
		early []*held
	)
	for _, h := range m.held {
		switch next := h.renewedAt.Add(m.cfg.RenewEvery); {
		case !now.Before(next):
			due = append(due, h)
		case !now.Before(next.Add(-m.cfg.RenewEvery / 2)):
			early = append(early, h)
		}
	}
	m.mu.Unlock()
	if len(due) == 0 {
		return
	}
	if lost := m.renew(ctx, append(due, early...)); len(lost) > 0 {
		m.unlock(ctx, lost, time.Time{})
	}
}

// renew extends hs on every Redis with one script call each and updates
// their counting spans; it returns those that failed, which stopped
// counting.
func (m *Manager) renew(ctx context.Context, hs []*held) (lost []*held) {
	m.mu.Lock()
	end := hs[0].count.to
	keys := make([]string, len(hs))
	args := make([]any, len(hs)+1)
	for i, h := range hs {
		end = minTime(end, h.count.to)
		keys[i], args[i] = h.mutex.Name(), h.mutex.Value()
	}
	m.mu.Unlock()
	args[len(hs)] = m.cfg.Pool.TTL.Milliseconds()
	rctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	start := time.Now()
	var (
		mu    sync.Mutex
		votes = make([]int, len(hs))
		errs  []error
		wg    sync.WaitGroup
	)
	for _, c := range m.clients {
		wg.Go(func() {
			res, err := extendScript.Run(rctx, c, keys, args...).Int64Slice()
			if err == nil && len(res) != len(hs) {
				err = fmt.Errorf("lease: extend answered %d results for %d leases", len(res), len(hs))
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			for i, ok := range res {
				if ok == 1 {
					votes[i]++
				}
			}
		})
	}
	wg.Wait()
	// As redsync's extend: valid until start + TTL − 1 % of the TTL.
	until := start.Add(m.cfg.Pool.TTL - m.cfg.Pool.TTL/100)
	quorum := len(m.clients)/2 + 1
	for i, h := range hs {
		if votes[i] >= quorum && m.extended(h, start, until) {
			m.events.renewed.Add(1)
			continue
		}
		lost = append(lost, h)
	}
	if len(lost) == 0 {
		return nil
	}
	m.stopCounting(lost)
	m.events.lost.Add(int64(len(lost)))
	if ctx.Err() == nil {
		err := errors.Join(errs...)
		if err == nil {
			err = redsync.ErrExtendFailed
		}
		for _, h := range lost {
			m.log.Warn("lease renewal failed; partition dropped", "partition", h.partition, "err", err)
		}
	}
	return lost
}

// extended moves h's counting end after a successful extend started at
// start and valid until until; false when it can no longer count (its new
// end already passed, or it was dropped meanwhile).
func (m *Manager) extended(h *held, start, until time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	newEnd := m.countEnd(h.partition, until.Add(-m.cfg.Margin), now)
	if !now.Before(newEnd) || m.held[h.partition] != h {
		return false
	}
	if now.Before(h.count.to) {
		if newEnd.After(h.count.to) {
			h.count.to = newEnd // counted without a gap
		}
	} else {
		// It stopped counting before the extend returned; the past stays
		// as it was and a new span starts now.
		m.ledger.close(h.count, now)
		h.count = span{from: now, to: newEnd}
	}
	h.renewedAt = start
	return true
}

// release gives up n leases, or as many as Config.Releasable allows now
// (the rest at a later tick): they stop counting, then are unlocked after
// the grace Config.Releasable returns (a pacer's sends just before it
// stopped counting a partition may be justified by credit that reaches up
// to a slice past it, so a peer must not start earning on the partition
// until those sends are covered), and only once the sends made before are
// answered (Config.Answered). Without Config.Releasable every release
// waits a slice.
func (m *Manager) release(ctx context.Context, n int) {
	cool := m.cfg.Slice
	if m.cfg.Releasable != nil {
		now := time.Now()
		m.mu.Lock()
		holding, per := len(m.held), m.sched.partitionRate(now)
		m.mu.Unlock()
		for ; n > 0; n-- {
			grace, ok := m.cfg.Releasable(now, float64(holding-n)*per, m.cfg.Slice)
			if ok {
				cool = grace
				break
			}
		}
		if n == 0 {
			return
		}
	}
	m.mu.Lock()
	var hs []*held
	for _, h := range m.held {
		if len(hs) == n {
			break
		}
		hs = append(hs, h)
	}
	m.mu.Unlock()
	m.stopCounting(hs)
	m.events.released.Add(int64(len(hs)))
	stopped := time.Now()
	for _, h := range hs {
		m.cooling = append(m.cooling, cooling{h, stopped, stopped.Add(cool)})
		m.log.Debug("lease released", "partition", h.partition)
	}
	if cool == 0 {
		m.unlockCooled(ctx, false)
	}
}

// answerPoll is how often the manager looks whether the sends a released
// lease awaits have had their answers.
const answerPoll = 5 * time.Millisecond

// cooling is a lease that stopped counting at stopped and is unlocked at
// until, once the sends made before stopped have been answered.
type cooling struct {
	h              *held
	stopped, until time.Time
}

// unlockCooled unlocks the released leases whose wait has passed and whose
// sends have been answered (all of them when all is set).
func (m *Manager) unlockCooled(ctx context.Context, all bool) {
	now := time.Now()
	var (
		due     []*held
		stopped time.Time // the latest the leases due stopped counting
	)
	keep := m.cooling[:0]
	for _, c := range m.cooling {
		if all || !now.Before(c.until) && (m.cfg.Answered == nil || m.cfg.Answered(c.stopped)) {
			due = append(due, c.h)
			if c.stopped.After(stopped) {
				stopped = c.stopped
			}
		} else {
			keep = append(keep, c)
		}
	}
	m.cooling = keep
	if len(due) > 0 {
		var since time.Time
		if !all && len(keep) == 0 {
			since = m.handOverSince(now, stopped, len(due))
		}
		m.unlock(ctx, due, since)
		if !all {
			m.announceFreed(ctx)
		}
	}
}

// announceFreed tells the peers below their share that partitions were
// unlocked, so they try at once instead of at their next retry.
func (m *Manager) announceFreed(ctx context.Context) {
	m.each(ctx, func(ctx context.Context, _ int, c redis.UniversalClient) error {
		return c.Publish(ctx, m.keys.changes(), "f").Err()
	}, "lease_freed", "announcing freed partitions failed")
}

// unlock deletes the leases' keys, with one call per Redis
// (releaseScript), bounded by the operation timeout even when ctx is done.
// Callers stopped counting them. A key that no longer holds the lease's
// value (it expired, and maybe a peer took it) is left alone. With since
// set (a hand-over, see Config.HandOver), each lease's hand-over key is
// left to tell the next holder since when it may count the partition:
// it expires at since + handOverKeep as the server counts from now (a
// little later, the time the call takes). Otherwise the hand-over keys
// are deleted, so a next holder counts from its lock.
func (m *Manager) unlock(ctx context.Context, hs []*held, since time.Time) {
	if len(hs) == 0 {
		return
	}
	var px int64
	if !since.IsZero() {
		keep := m.handOverKeep()
		px = min(max(keep-time.Since(since), 0), keep).Milliseconds() // a since to come counts as now
	}
	keys := make([]string, 2*len(hs))
	args := make([]any, len(hs)+1)
	for i, h := range hs {
		keys[i], keys[len(hs)+i], args[i] = h.mutex.Name(), m.keys.handOver(h.partition), h.mutex.Value()
	}
	args[len(hs)] = px
	m.each(context.WithoutCancel(ctx), func(ctx context.Context, _ int, c redis.UniversalClient) error {
		return releaseScript.Run(ctx, c, keys, args...).Err()
	}, "lease_unlock", "lease unlock failed; the keys expire after their TTL")
}
