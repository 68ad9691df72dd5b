package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
)

var _ ingest.Capacity = (*Manager)(nil)

// HistoryKeep is how long a lease that stopped counting is remembered for
// Credit. Windows reaching further back undercount (the safe direction).
const HistoryKeep = 10 * time.Second

// errReservedShort is logged while the worker holds fewer partitions than
// it reserves.
var errReservedShort = errors.New("lease: reserved partitions not free")

// ErrInvalidConfig is wrapped by New's errors about the Config.
var ErrInvalidConfig = errors.New("lease: invalid config")

// Config configures a Manager. Durations are wall-clock durations.
type Config struct {
	// Pool is the pool to take leases in; see Pool for its defaults. It
	// should have been stored with EnsurePool.
	Pool Pool
	// Prefix starts every Redis key of the pool. Default DefaultPrefix
	// ("sluice").
	Prefix string
	// WorkerID names this process in Redis (membership key, lock values);
	// unique per process, no whitespace or '/', at most 200 bytes. Default
	// "<hostname>-<pid>-<random hex>".
	WorkerID string
	// RequestTimeout is the longest a sink request may take after the
	// pacer released it; the margin covers it. Default 2 s.
	RequestTimeout time.Duration
	// Slice is the pacer's slice; the margin covers one. Default 200 ms.
	Slice time.Duration
	// Drift is the clock-drift allowance between this host and Redis over
	// one TTL, on top of redsync's own 1 % of the TTL. Default 2 ms + TTL/100
	// (the Redlock paper's drift term).
	Drift time.Duration
	// Margin is the safety margin: a lease counts toward Rate and Credit
	// only while time.Until(Until()) > Margin. Default and minimum
	// RequestTimeout + Slice + Drift, so that a request released at the last
	// counting instant completes before the lease can expire in Redis and be
	// taken by a peer.
	Margin time.Duration
	// Tick is the period of the acquire / fair-share loop. Default 100 ms.
	// While below its share with nothing free, the loop retries at Tick/5.
	Tick time.Duration
	// RenewEvery is how long after its last lock or extend a lease is
	// extended. Default TTL/3. Margin + RenewEvery must be at most 90 % of
	// the TTL, so a renewal has time to complete before the lease stops
	// counting.
	RenewEvery time.Duration
	// MemberTTL is the TTL of the worker's membership key, refreshed every
	// tick; a worker that vanishes without withdrawing stops being counted
	// in the fair share after it. Default max(4 × Tick, 1 s).
	MemberTTL time.Duration
	// Reserved is how many partitions the worker holds for its lifetime,
	// whatever its demand: acquired at start, renewed, never released for
	// lack of demand (a failed renewal still drops one at once, and it is
	// taken again). The rest of the pool is shared on demand. While fewer
	// than Reserved are free the worker logs it and keeps trying; see
	// ReservedShort. Default 0; at most the pool's partitions.
	Reserved int
	// Logger receives lease events and errors. Default: discard.
	Logger *slog.Logger
}

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	c.Pool = c.Pool.withDefaults()
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.WorkerID == "" {
		c.WorkerID = defaultWorkerID()
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = ingest.DefaultRequestTimeout
	}
	if c.Slice == 0 {
		c.Slice = ingest.DefaultSlice
	}
	if c.Drift == 0 {
		c.Drift = 2*time.Millisecond + c.Pool.TTL/100
	}
	if c.Margin == 0 {
		c.Margin = c.minMargin()
	}
	if c.Tick == 0 {
		c.Tick = 100 * time.Millisecond
	}
	if c.RenewEvery == 0 {
		c.RenewEvery = c.Pool.TTL / 3
	}
	if c.MemberTTL == 0 {
		c.MemberTTL = max(4*c.Tick, time.Second)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

func (c Config) minMargin() time.Duration { return c.RequestTimeout + c.Slice + c.Drift }

// validate checks a defaulted config; errors name the field.
func (c Config) validate() error {
	if err := c.Pool.Validate(); err != nil {
		return err
	}
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if strings.ContainsFunc(c.WorkerID, func(r rune) bool { return unicode.IsSpace(r) || r == '/' || !unicode.IsPrint(r) }) || len(c.WorkerID) > 200 {
		return invalid("WorkerID %q must be at most 200 printable bytes without whitespace or '/'", c.WorkerID)
	}
	if c.Reserved < 0 || c.Reserved > c.Pool.Partitions {
		return invalid("Reserved %d must be within 0..%d (the pool's partitions)", c.Reserved, c.Pool.Partitions)
	}
	if strings.ContainsAny(c.Prefix, " \t\r\n") {
		return invalid("Prefix %q must not contain whitespace", c.Prefix)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RequestTimeout", c.RequestTimeout}, {"Slice", c.Slice}, {"Drift", c.Drift}, {"Margin", c.Margin}, {"Tick", c.Tick}, {"RenewEvery", c.RenewEvery}, {"MemberTTL", c.MemberTTL}} {
		if d.v <= 0 {
			return invalid("%s must be > 0, got %v", d.name, d.v)
		}
	}
	if c.Margin < c.minMargin() {
		return invalid("Margin %v must be ≥ RequestTimeout + Slice + Drift = %v + %v + %v = %v",
			c.Margin, c.RequestTimeout, c.Slice, c.Drift, c.minMargin())
	}
	if limit := c.Pool.TTL * 9 / 10; c.Margin+c.RenewEvery > limit {
		return invalid("Margin %v + RenewEvery %v must be ≤ 90%% of the pool %q lease TTL %v (%v), so a renewal completes before the lease stops counting; lengthen the TTL or shorten RequestTimeout, Slice or RenewEvery",
			c.Margin, c.RenewEvery, c.Pool.Name, c.Pool.TTL, limit)
	}
	if c.MemberTTL <= c.Tick {
		return invalid("MemberTTL %v must be > Tick %v, or members flicker", c.MemberTTL, c.Tick)
	}
	return nil
}

func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	host = strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) || r == '/' {
			return '_'
		}
		return r
	}, host)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), randomHex(4))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// holderOf returns the worker ID in a lock value made by lockValue.
func holderOf(value string) string {
	if i := strings.LastIndexByte(value, '/'); i >= 0 {
		return value[:i]
	}
	return value
}

// Manager holds leases on a pool's partitions for one worker: it acquires
// up to the worker's fair share, renews, releases, and reports the rate
// its provably valid leases allow (ingest.Capacity). Rate, Credit and
// SetDemand are safe for concurrent use; Run must be called once.
type Manager struct {
	cfg       Config
	keys      keys
	clients   []redis.UniversalClient
	rs        *redsync.Redsync
	log       *slog.Logger
	errs      errLimiter
	opTimeout time.Duration
	wake      chan struct{}
	started   atomic.Bool
	announced int       // the want of the last step (Run loop only)
	cooling   []cooling // released leases waiting a slice to be unlocked (Run loop only)

	defReadAt time.Time // last successful read of the definition (Run loop only)
	nextRead  time.Time // when to read it again (Run loop only)
	events    Events

	mu      sync.Mutex
	demand  float64       // units/s, from SetDemand
	backlog float64       // units, from SetBacklog; -1 unknown
	held    map[int]*held // partition → lease
	ledger  ledger        // leases that stopped counting
	sched   schedule      // the pool's effective rate over time, as last read from Redis
}

// held is one lease. mutex is used only by the Run loop (and the renewal
// goroutines it waits for); count is read under Manager.mu.
type held struct {
	partition int
	mutex     *redsync.Mutex
	count     span      // [acquired or re-counted, Until − Margin)
	renewedAt time.Time // start of the last successful lock or extend
}

// Events counts a Manager's lease events since it was created. Safe for
// concurrent use; read it with Snapshot.
type Events struct {
	acquired, renewed, lost, released, failed atomic.Int64
}

// EventCounts is a snapshot of Events.
type EventCounts struct {
	Acquired int64 // leases taken
	Renewed  int64 // successful extends
	Lost     int64 // leases dropped because an extend failed or came too late
	Released int64 // leases given back (lower demand, shutdown)
	Failed   int64 // acquire attempts that did not get the partition
}

// Events returns the lease event counts so far.
func (m *Manager) Events() EventCounts {
	e := &m.events
	return EventCounts{e.acquired.Load(), e.renewed.Load(), e.lost.Load(), e.released.Load(), e.failed.Load()}
}

// New returns a Manager for cfg over clients, one per independent Redis
// master (several make a Redlock quorum of len/2+1). It returns an error
// wrapping ErrInvalidPool or ErrInvalidConfig naming the bad field.
func New(cfg Config, clients ...redis.UniversalClient) (*Manager, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(clients) == 0 {
		return nil, fmt.Errorf("%w: at least one Redis client is required", ErrInvalidConfig)
	}
	pools := make([]redsyncredis.Pool, len(clients))
	for i, c := range clients {
		pools[i] = goredis.NewPool(c)
	}
	return &Manager{
		cfg:       cfg,
		keys:      keysFor(cfg.Prefix, cfg.Pool.Name),
		clients:   clients,
		rs:        redsync.New(pools...),
		log:       cfg.Logger.With("pool", cfg.Pool.Name, "worker_id", cfg.WorkerID),
		errs:      errLimiter{every: 10 * time.Second},
		opTimeout: min(cfg.RequestTimeout, max(cfg.Pool.TTL/10, 100*time.Millisecond)),
		wake:      make(chan struct{}, 1),
		held:      make(map[int]*held),
		sched:     schedule{pool: cfg.Pool},
		backlog:   -1,
	}, nil
}

// WorkerID returns the worker ID the Manager announces itself with.
func (m *Manager) WorkerID() string { return m.cfg.WorkerID }

// PartitionRate returns the rate one lease is worth now, in units/s: the
// pool's effective (ramped) rate divided by its partitions.
func (m *Manager) PartitionRate() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sched.partitionRate(time.Now())
}

// Pool returns the pool definition in force, as last read from Redis (a
// live change by SetPool shows here within RenewEvery/2).
func (m *Manager) Pool() Pool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sched.pool
}

// Effective returns the pool's effective rate at now in units/s: its
// capacity, or less while a ramp is climbing.
func (m *Manager) Effective(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sched.effective(now)
}

// Margin returns the safety margin in effect.
func (m *Manager) Margin() time.Duration { return m.cfg.Margin }

// Rate returns the rate, in units/s, of the leases counting at now: each
// lease counts PartitionRate from the instant it was acquired until it is
// released or dropped, or until Until() − Margin, whichever comes first.
func (m *Manager) Rate(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.ledger.count(now)
	for _, h := range m.held {
		if h.count.contains(now) {
			n++
		}
	}
	return float64(n) * m.sched.partitionRate(now)
}

// Credit returns the integral of Rate over [from, to), in units: for each
// lease, PartitionRate × the length of [from, to) ∩ [acquired, stopped
// counting). It is exact for windows that start at most HistoryKeep ago,
// and never changes for instants already past.
func (m *Manager) Credit(from, to time.Time) float64 {
	if !to.After(from) {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	credit := m.ledger.credit(from, to, m.sched.partitionCredit)
	for _, h := range m.held {
		if lo, hi, ok := h.count.clip(from, to); ok {
			credit += m.sched.partitionCredit(lo, hi)
		}
	}
	return credit
}

// SetBacklog announces how many units wait for the worker (its queue lag
// and what it fetched), for the pool's ETA in `sluice pool status`; -1 when
// unknown.
func (m *Manager) SetBacklog(units float64) {
	m.mu.Lock()
	m.backlog = units
	m.mu.Unlock()
}

// SetDemand announces how many units/s the worker could use (+Inf with a
// backlog, 0 when idle). The worker then aims at ceil(demand /
// PartitionRate) partitions, within its fair share. A rise in the wanted
// partitions wakes the loop at once; a fall is applied at the next tick.
func (m *Manager) SetDemand(unitsPerSecond float64) {
	m.mu.Lock()
	before := m.wantLocked()
	m.demand = unitsPerSecond
	after := m.wantLocked()
	m.mu.Unlock()
	// A rise is served at once; so is a drop to nothing, so that peers with
	// a backlog get the partitions without waiting for the next tick.
	if after > before || (after == 0 && before > 0) {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

func (m *Manager) wantLocked() int {
	now := time.Now()
	parts := m.sched.partitions(now)
	return min(max(wantPartitions(m.demand, m.sched.partitionRate(now), parts), m.cfg.Reserved), parts)
}

// ReservedShort returns how many of the worker's reserved partitions it
// does not hold (0 once it holds at least Config.Reserved).
func (m *Manager) ReservedShort() int {
	return max(m.cfg.Reserved-len(m.Held()), 0)
}

// Held returns the partitions the worker currently holds, counting or not,
// in no particular order.
func (m *Manager) Held() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]int, 0, len(m.held))
	for p := range m.held {
		out = append(out, p)
	}
	return out
}

// Run takes and keeps leases until ctx is done: every Tick it announces
// the worker's demand, computes its fair share, releases partitions above
// it and acquires free ones up to it; each lease is extended RenewEvery
// after its last lock or extend. On exit it stops counting every lease,
// unlocks them (each bounded by RequestTimeout) and withdraws the worker
// from the members. Redis errors are logged (rate-limited) and retried; Run
// returns nil once ctx is done, and an error only when called twice.
func (m *Manager) Run(ctx context.Context) error {
	if !m.started.CompareAndSwap(false, true) {
		return errors.New("lease: Manager.Run called twice")
	}
	defer m.shutdown(context.WithoutCancel(ctx))
	// The definition was checked when the worker started (EnsurePool); it
	// is read again every RenewEvery/2, first after that long.
	m.nextRead = time.Now().Add(m.cfg.RenewEvery / 2)
	m.reclaim(ctx)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-m.wake:
		}
		timer.Reset(m.step(ctx))
	}
}

// reclaimScript deletes KEYS[1] if it holds a lock of the worker ARGV[1]
// ("<worker>/<token>").
var reclaimScript = redis.NewScript(`
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
	m.each(ctx, func(ctx context.Context, c redis.UniversalClient) error {
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

// step runs one iteration of the loop and returns the wait until the next.
func (m *Manager) step(ctx context.Context) time.Duration {
	m.unlockCooled(ctx, false)
	m.dropExpired(ctx)
	m.renewDue(ctx)
	if ctx.Err() != nil {
		return 0
	}

	m.mu.Lock()
	me := announcement{Want: m.wantLocked(), Demand: m.demand, Reserved: m.cfg.Reserved, Backlog: m.backlog}
	m.ledger.prune(time.Now().Add(-HistoryKeep))
	m.mu.Unlock()

	m.announce(ctx, me)
	share := min(me.Want, len(m.Held())) // if the members cannot be read
	if members, ok := m.members(ctx); ok {
		members[m.cfg.WorkerID] = me
		list := make([]member, 0, len(members))
		for w, a := range members {
			list = append(list, member{Worker: w, Want: a.Want, Reserved: a.Reserved})
		}
		parts := m.partitionsNow()
		share = fairShare(parts, list)[m.cfg.WorkerID]
		if m.announced == 0 {
			// Just woken: idle peers that woke at the same time have not
			// announced yet, so take no more than an equal split of the
			// members now, and grow to the fair share at the next step.
			// Workers that start on one backlog together split it at once.
			share = min(share, max((parts+len(list)-1)/len(list), m.cfg.Reserved))
		}
	}
	m.announced = me.Want

	holding := len(m.Held())
	if holding > share {
		m.release(ctx, holding-share)
	} else if holding < share {
		m.acquire(ctx, share-holding)
	}
	if short := m.ReservedShort(); short > 0 && ctx.Err() == nil {
		m.logErr("lease_reserved", "fewer reserved partitions free than asked; still trying", errReservedShort,
			"reserved", m.cfg.Reserved, "missing", short)
	}
	if !time.Now().Before(m.nextRead) {
		m.refreshPool(ctx)
	}
	return m.nextWait(share)
}

// nextWait is Tick, Tick/5 while below share, or sooner when a renewal is
// due.
func (m *Manager) nextWait(share int) time.Duration {
	wait := m.cfg.Tick
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.held) < share {
		wait = m.cfg.Tick / 5
	}
	now := time.Now()
	for _, h := range m.held {
		wait = min(wait, h.renewedAt.Add(m.cfg.RenewEvery).Sub(now), h.count.to.Sub(now))
	}
	for _, c := range m.cooling {
		wait = min(wait, c.until.Sub(now))
	}
	return max(wait, time.Millisecond)
}

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
	}
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

// acquire tries to lock up to n partitions this worker does not hold,
// those that look free first, in random order, n at a time, one try each.
func (m *Manager) acquire(ctx context.Context, n int) {
	cands := m.candidates(ctx)
	for n > 0 && len(cands) > 0 && ctx.Err() == nil {
		batch := cands[:min(n, len(cands))]
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
}

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
	h := &held{partition: p, mutex: mu, renewedAt: start}
	m.mu.Lock()
	now := time.Now()
	h.count = span{from: now, to: m.countEnd(p, mu.Until().Add(-m.cfg.Margin), now)}
	ok := now.Before(h.count.to)
	if ok {
		m.held[p] = h
	}
	m.mu.Unlock()
	if !ok { // too slow to be worth anything
		m.unlock(ctx, []*held{h})
		return nil
	}
	m.events.acquired.Add(1)
	m.log.Debug("lease acquired", "partition", p)
	return h
}

func (m *Manager) lockValue() (string, error) {
	return m.cfg.WorkerID + "/" + randomHex(16), nil
}

// candidates returns the partitions not held, shuffled, those that look
// free in the first Redis first; those that look taken are left out unless
// the lookup failed.
func (m *Manager) candidates(ctx context.Context) []int {
	m.mu.Lock()
	var all []int
	for p := range m.sched.partitions(time.Now()) {
		if _, ok := m.held[p]; !ok {
			all = append(all, p)
		}
	}
	m.mu.Unlock()
	mrand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	names := make([]string, len(all))
	for i, p := range all {
		names[i] = m.keys.partition(p)
	}
	if len(names) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, m.opTimeout)
	defer cancel()
	vals, err := m.clients[0].MGet(cctx, names...).Result()
	if err != nil {
		if ctx.Err() == nil {
			m.logErr("lease_lookup", "partition lookup failed", err)
		}
		return all
	}
	free := all[:0]
	for i, p := range all {
		if vals[i] == nil {
			free = append(free, p)
		}
	}
	return free
}

// announce publishes the worker's demand to every Redis.
func (m *Manager) announce(ctx context.Context, a announcement) {
	m.each(ctx, func(ctx context.Context, c redis.UniversalClient) error {
		return announce(ctx, c, m.keys, m.cfg.WorkerID, a, m.cfg.MemberTTL)
	}, "lease_announce", "demand announcement failed")
}

// members returns the union of the live members of every Redis that
// answered (the larger want wins); ok is false when none answered.
func (m *Manager) members(ctx context.Context) (map[string]announcement, bool) {
	var (
		mu  sync.Mutex
		out = map[string]announcement{}
	)
	n := m.each(ctx, func(ctx context.Context, c redis.UniversalClient) error {
		got, err := readMembers(ctx, c, m.keys, true)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for w, a := range got {
			if b, ok := out[w]; !ok || a.Want > b.Want {
				out[w] = a
			}
		}
		return nil
	}, "lease_members", "member lookup failed")
	return out, n > 0
}

// each runs f on every client concurrently, each under the operation
// timeout, logs failures, and returns how many succeeded.
func (m *Manager) each(ctx context.Context, f func(context.Context, redis.UniversalClient) error, key, msg string) int {
	var (
		wg sync.WaitGroup
		ok atomic.Int32
	)
	for i, c := range m.clients {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, m.opTimeout)
			defer cancel()
			if err := f(cctx, c); err != nil {
				if ctx.Err() == nil {
					m.logErr(key, msg, err, "redis", i)
				}
				return
			}
			ok.Add(1)
		})
	}
	wg.Wait()
	return int(ok.Load())
}

// shutdown stops counting every lease, unlocks them and withdraws the
// worker.
func (m *Manager) shutdown(ctx context.Context) {
	m.mu.Lock()
	hs := make([]*held, 0, len(m.held))
	for h := range maps.Values(m.held) {
		hs = append(hs, h)
	}
	m.mu.Unlock()
	m.stopCounting(hs)
	m.events.released.Add(int64(len(hs)))
	// As for a release: a slice between the last counted instant and the
	// unlock, so no peer earns on these partitions while the last slice's
	// credit can still reach into a sink-side window.
	time.Sleep(m.cfg.Slice)
	m.unlock(ctx, hs)
	m.unlockCooled(ctx, true)
	m.each(ctx, func(ctx context.Context, c redis.UniversalClient) error {
		return withdraw(ctx, c, m.keys, m.cfg.WorkerID)
	}, "lease_withdraw", "member withdrawal failed")
	m.log.Info("leases released", "partitions", len(hs))
}

// logErr logs err at warning level, at most once per 10 s per key, never
// for context.Canceled.
func (m *Manager) logErr(key, msg string, err error, attrs ...any) {
	if errors.Is(err, context.Canceled) {
		return
	}
	if suppressed, ok := m.errs.allow(key, time.Now()); ok {
		m.log.Warn(msg, append(attrs, "err", err, "suppressed", suppressed)...)
	}
}

// errLimiter lets one log line per key through every `every`.
type errLimiter struct {
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time
	count map[string]int
}

// allow reports whether to log now, and how many were suppressed since the
// last one.
func (l *errLimiter) allow(key string, now time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.count = map[string]time.Time{}, map[string]int{}
	}
	if t, seen := l.last[key]; seen && now.Sub(t) < l.every {
		l.count[key]++
		return 0, false
	}
	suppressed = l.count[key]
	l.last[key], l.count[key] = now, 0
	return suppressed, true
}
