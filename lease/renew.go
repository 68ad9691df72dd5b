package lease

import (
	"context"
	"errors"
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
	m.unlock(ctx, gone)
}

// renewDue extends, concurrently, every lease whose renewal is due, each
// under a deadline at its counting end. A lease whose extend fails stops
// counting at once and is then unlocked.
func (m *Manager) renewDue(ctx context.Context) {
	m.mu.Lock()
	now := time.Now()
	var due []*held
	for _, h := range m.held {
		if !now.Before(h.renewedAt.Add(m.cfg.RenewEvery)) {
			due = append(due, h)
		}
	}
	m.mu.Unlock()
	var (
		wg     sync.WaitGroup
		lostMu sync.Mutex
		lost   []*held
	)
	for _, h := range due {
		wg.Go(func() {
			if !m.renew(ctx, h) {
				lostMu.Lock()
				lost = append(lost, h)
				lostMu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(lost) > 0 {
		m.unlock(ctx, lost)
	}
}

// renew extends h and updates its counting span; on failure it stops
// counting h at once and returns false.
func (m *Manager) renew(ctx context.Context, h *held) bool {
	m.mu.Lock()
	end := h.count.to
	m.mu.Unlock()
	rctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	start := time.Now()
	ok, err := h.mutex.ExtendContext(rctx)
	if ok && err == nil {
		if m.extended(h, start) {
			m.events.renewed.Add(1)
			return true
		}
		err = redsync.ErrExtendFailed
	}
	if err == nil {
		err = redsync.ErrExtendFailed
	}
	m.stopCounting([]*held{h})
	m.events.lost.Add(1)
	if ctx.Err() == nil {
		m.log.Warn("lease renewal failed; partition dropped", "partition", h.partition, "err", err)
	}
	return false
}

// extended moves h's counting end after a successful extend started at
// start; false when it can no longer count (its new end already passed, or
// it was dropped meanwhile).
func (m *Manager) extended(h *held, start time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	newEnd := m.countEnd(h.partition, h.mutex.Until().Add(-m.cfg.Margin), now)
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

// release gives up n leases: they stop counting, then are unlocked.
func (m *Manager) release(ctx context.Context, n int) {
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
	// Unlock a slice later: a pacer's sends just before it stopped counting
	// a partition were justified by credit that reaches back up to a slice
	// before any window it still sends in, so a peer must not start earning
	// on the partition until that slice has passed.
	until := time.Now().Add(m.cfg.Slice)
	for _, h := range hs {
		m.cooling = append(m.cooling, cooling{h, until})
		m.log.Debug("lease released", "partition", h.partition)
	}
}

// cooling is a lease that stopped counting and is unlocked at until.
type cooling struct {
	h     *held
	until time.Time
}

// unlockCooled unlocks the released leases whose slice has passed (all of
// them when all is set).
func (m *Manager) unlockCooled(ctx context.Context, all bool) {
	now := time.Now()
	var due []*held
	keep := m.cooling[:0]
	for _, c := range m.cooling {
		if all || !now.Before(c.until) {
			due = append(due, c.h)
		} else {
			keep = append(keep, c)
		}
	}
	m.cooling = keep
	if len(due) > 0 {
		m.unlock(ctx, due)
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

// unlock deletes the leases' keys, concurrently, each bounded by the
// operation timeout even when ctx is done. Callers stopped counting them.
func (m *Manager) unlock(ctx context.Context, hs []*held) {
	ctx = context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Go(func() {
			uctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
			defer cancel()
			if _, err := h.mutex.UnlockContext(uctx); err != nil && !errors.Is(err, redsync.ErrLockAlreadyExpired) {
				m.logErr("lease_unlock", "lease unlock failed; the key expires after its TTL", err, "partition", h.partition)
			}
		})
	}
	wg.Wait()
}
