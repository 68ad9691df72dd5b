package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

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

// wokenFor is how many ticks after its want rises from nothing a worker
// takes no more than an equal split of the members: long enough for peers
// woken by the same backlog to announce theirs.
const wokenFor = 3

// changeAtOnce is how many partitions a new want must differ from an
// announced want of want by to be announced at once rather than at the
// next keep-alive: an eighth of it, and at least 2.
func changeAtOnce(want int) int { return max(2, want/8) }

func abs(n int) int { return max(n, -n) }

// errReservedShort is logged while the worker holds fewer partitions than
// it reserves.
var errReservedShort = errors.New("lease: reserved partitions not free")

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
	errLogs   sync.Map // log key → *rate.Sometimes
	opTimeout time.Duration
	wake      chan struct{}
	started   atomic.Bool
	announced int       // the want of the last step (Run loop only)
	wokeAt    time.Time // when the want last rose from nothing (Run loop only)
	cooling   []cooling // released leases waiting a slice to be unlocked (Run loop only)

	// Change feed (Run loop only, but for the flags the watchers set).
	freed        atomic.Bool             // a peer unlocked partitions since the last acquire
	acquireWait  time.Duration           // the wait before trying again while below share
	acquireAt    time.Time               // when to try again while below share
	rank, rankOf int                     // this worker's index among the members by worker ID, and their number
	membersDirty atomic.Bool             // the members may have changed since they were read
	outranks     atomic.Bool             // outranksAPeer as of the members last read (set by readMembers)
	defDirty     atomic.Bool             // the definition may have changed since it was read
	peers        map[string]announcement // the members as last read; nil until read
	lastAnn      announcement            // the announcement last published
	annAt        time.Time               // when it was published; zero: never
	annEvery     time.Duration           // the keep-alive period it was published with
	stored       []string                // per client, the encoded announcement it stores; "" unknown
	earliest     []time.Time             // per client, the earliest member expiry its last sweep saw; zero: sweep at the next announcement
	writtenAt    time.Time               // when an announcement was last written whole
	keysAt       time.Time               // when the membership keys' TTLs were last refreshed
	seenMembers  []int64                 // per client, the members version peers were read at; -1 unknown
	seenDef      []int64                 // per client, the definition version last read; -1 unknown
	reportedDef  []int64                 // per client, the definition version its last answer reported
	membersRead  time.Time               // last successful read of the members
	defReadAt    time.Time               // last instant the definition was known current: read, or its version confirmed
	nextRead     time.Time               // when to read the definition again whatever the feed says
	events       Events
	redisHealth  redisHealth // whether announcements reach a quorum (observe.go)

	mu        sync.Mutex
	demand    float64       // units/s, from SetDemand
	need      float64       // units/s, from SetNeed
	needSince time.Time     // when need last rose from nothing, or the worker's turn ended
	needMet   time.Time     // since when the worker has held its need; zero while it has not
	backlog   float64       // units, from SetBacklog; -1 unknown
	held      map[int]*held // partition → lease
	ledger    ledger        // leases that stopped counting
	sched     schedule      // the pool's effective rate over time, as last read from Redis
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
	Failed   int64 // lock calls to a Redis that failed, and locks that did not become leases (short of a quorum, or too late to count)
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
	k, err := poolKeys(cfg.Prefix, cfg.Pool.Name, clients)
	if err != nil {
		return nil, err
	}
	pools := make([]redsyncredis.Pool, len(clients))
	for i, c := range clients {
		pools[i] = goredis.NewPool(c)
	}
	return &Manager{
		cfg:         cfg,
		keys:        k,
		clients:     clients,
		rs:          redsync.New(pools...),
		log:         cfg.Logger.With("pool", cfg.Pool.Name, "worker_id", cfg.WorkerID),
		opTimeout:   min(cfg.RequestTimeout, max(cfg.Pool.TTL/10, 100*time.Millisecond)),
		wake:        make(chan struct{}, 1),
		held:        make(map[int]*held),
		sched:       schedule{pool: cfg.Pool},
		backlog:     -1,
		seenMembers: unknownVersions(len(clients)),
		stored:      make([]string, len(clients)),
		earliest:    make([]time.Time, len(clients)),
		seenDef:     unknownVersions(len(clients)),
		reportedDef: unknownVersions(len(clients)),
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
// live change by SetPool shows here at once, or within KeepAlive without
// the change feed).
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

// Priority returns the worker's class in the pool (Config.Priority).
func (m *Manager) Priority() Priority { return m.cfg.Priority }

// Weight returns the worker's weight inside its class (Config.Weight).
func (m *Manager) Weight() int { return m.cfg.Weight }

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
// counting), a lease taken over with a hand-over counting from the
// instant it gave (see Config.HandOver). It is exact for windows that
// start at most HistoryKeep ago, and never shrinks for instants already
// past; it grows for them only when a lease is taken over so.
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

// Backlogged reports whether the demand last announced with SetDemand
// is a backlog (+Inf): the worker could use more than it has.
func (m *Manager) Backlogged() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return math.IsInf(m.demand, 1)
}

// SetDemand announces how many units/s the worker could use (+Inf with a
// backlog, 0 when idle). The worker then aims at ceil(demand /
// PartitionRate) partitions, within its fair share. A rise in the wanted
// partitions wakes the loop at once, and so does a fall to nothing or a
// fall of a worker that outranks a peer (a lower class waits for what it
// gives back); any other fall is applied at the next tick.
func (m *Manager) SetDemand(unitsPerSecond float64) {
	m.mu.Lock()
	before := m.wantLocked()
	m.demand = unitsPerSecond
	after := m.wantLocked()
	m.mu.Unlock()
	// A rise is served at once; so is a drop to nothing, or any drop of a
	// worker whose partitions a lower class waits for, so that peers with
	// a backlog get the partitions without waiting for the next tick.
	if after > before || (after < before && (after == 0 || m.outranks.Load())) {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

// SetNeed announces the least rate, in units/s, at which the worker can
// send the record at the head of its line at all: a pacer whose one-second
// account holds at most its rate × 1 s can send a record costing c only at
// c units/s or more. A worker whose need exceeds its fair share is given
// the partitions for it whole, longest-waiting first, or none beyond its
// reservation while it waits its turn; after holding them for one lease
// TTL it goes to the back of the line, so costly records from several
// workers take turns instead of each worker holding a useless part. 0: any
// rate will do. Safe for concurrent use; pacing.Pacer calls it every slice.
func (m *Manager) SetNeed(unitsPerSecond float64) {
	m.mu.Lock()
	before := m.needLocked(time.Now())
	if !(unitsPerSecond > 0) || math.IsInf(unitsPerSecond, 0) {
		unitsPerSecond = 0
	}
	if m.need == 0 && unitsPerSecond > 0 {
		m.needSince, m.needMet = time.Now(), time.Time{}
	}
	m.need = unitsPerSecond
	after := m.needLocked(time.Now())
	m.mu.Unlock()
	if after > before {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

// needLocked is the need in partitions at now. m.mu is held.
func (m *Manager) needLocked(now time.Time) int {
	return wantPartitions(m.need, m.sched.partitionRate(now), m.sched.partitions(now))
}

// takeTurn notes whether the worker holds its need at now and, once it has
// held it for a lease TTL, sends it to the back of the line. m.mu is held.
func (m *Manager) takeTurn(now time.Time, need, holding int) {
	switch {
	case need <= 1 || holding < need:
		m.needMet = time.Time{}
	case m.needMet.IsZero():
		m.needMet = now
	case now.Sub(m.needMet) >= m.cfg.Pool.TTL:
		m.needSince, m.needMet = now, time.Time{}
	}
}

func (m *Manager) wantLocked() int {
	now := time.Now()
	parts := m.sched.partitions(now)
	want := max(wantPartitions(m.demand, m.sched.partitionRate(now), parts), m.cfg.Reserved)
	if want > 0 {
		want = max(want, m.needLocked(now))
	}
	return min(want, parts)
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
	var watchers sync.WaitGroup
	defer watchers.Wait()
	for _, c := range m.clients {
		watchers.Go(func() { m.watch(ctx, c) })
	}
	// The first announcement finds the versions unknown, so the members
	// and the definition are read at the first step.
	m.membersDirty.Store(true)
	m.defDirty.Store(true)
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

// step runs one iteration of the loop and returns the wait until the next.
func (m *Manager) step(ctx context.Context) time.Duration {
	m.unlockCooled(ctx, false)
	m.dropExpired(ctx)
	m.renewDue(ctx)
	if ctx.Err() != nil {
		return 0
	}

	m.mu.Lock()
	now := time.Now()
	need := m.needLocked(now)
	m.takeTurn(now, need, len(m.held))
	me := announcement{Want: m.wantLocked(), Demand: m.demand, Reserved: m.cfg.Reserved, Backlog: m.backlog,
		Need: need, NeedSince: m.needSince.UnixMilli(), Priority: m.cfg.Priority, Weight: m.cfg.Weight}
	m.ledger.prune(now.Add(-HistoryKeep))
	m.mu.Unlock()

	keepAlive := !m.annAt.IsZero() && !now.Before(m.annAt.Add(m.annEvery))
	if me.Want > 0 && m.lastAnn.Want > 0 && me.Want != m.lastAnn.Want && abs(me.Want-m.lastAnn.Want) < changeAtOnce(m.lastAnn.Want) &&
		!m.annAt.IsZero() && !keepAlive && !m.outranks.Load() {
		// A small change of the want waits for the keep-alive (one from
		// or to nothing, or by changeAtOnce, does not): a demand that
		// wavers around a value, as a worker's rate-based demand does,
		// costs no announcement, no read by every peer and no partition
		// handed back and forth each time it moves. Until then the worker
		// keeps the share of the want it announced, as its peers compute.
		// A large change (a backlog, or one drained) is announced at once:
		// a lower class yields to a rise, and gets its capacity back
		// after a fall, without waiting. So is any change of a worker
		// that outranks a peer: a lower class yields within a slice of a
		// rise, and gets a fall back as soon, whatever its size, at the
		// cost of an announcement for each change in pools that mix
		// classes.
		me.Want = m.lastAnn.Want
	}
	// The first announcement changes the peers' shares only if it wants
	// partitions (m.lastAnn is the zero announcement until then).
	if changed := !me.sameShare(m.lastAnn); changed || keepAlive || m.annAt.IsZero() {
		m.announce(ctx, me, changed)
	}
	m.checkDefinition(ctx, now)
	if !now.Before(m.membersRead.Add(resyncEvery)) {
		m.membersDirty.Store(true) // a safety net under the change feed
	}
	if m.membersDirty.Swap(false) {
		if !m.readMembers(ctx) {
			m.membersDirty.Store(true) // again at the next tick
		}
	}
	share := min(me.Want, len(m.Held())) // if the members cannot be read
	if m.peers != nil {
		list := make([]member, 0, len(m.peers)+1)
		list = append(list, me.member(m.cfg.WorkerID))
		classmates := 1 // members of this worker's class, itself included
		for w, a := range m.peers {
			if w != m.cfg.WorkerID {
				list = append(list, a.member(w))
				if a.Priority == me.Priority {
					classmates++
				}
			}
		}
		parts := m.partitionsNow()
		share = fairShare(parts, list)[m.cfg.WorkerID]
		m.rank, m.rankOf = 0, len(list)
		for _, w := range list {
			if w.Worker < m.cfg.WorkerID {
				m.rank++
			}
		}
		if m.announced == 0 && me.Want > 0 {
			m.wokeAt = now
		}
		if now.Sub(m.wokeAt) < wokenFor*m.cfg.Tick {
			// Just woken: idle peers of its class that woke at the same
			// time may not have announced yet, so take no more than an
			// equal split among the class's members for a few ticks, and
			// grow to the fair share after. Workers that start on one
			// backlog together split it at once instead of one taking
			// every partition and handing most back a tick later. (Peers
			// of a lower class yield to it whatever it takes; those of a
			// higher class take from it.)
			share = min(share, max((parts+classmates-1)/classmates, m.cfg.Reserved))
		}
	}
	m.announced = me.Want

	holding := len(m.Held())
	freed := m.freed.Swap(false)
	switch {
	case holding > share:
		m.release(ctx, holding-share)
	case holding < share && (freed || !now.Before(m.acquireAt)):
		// Below share: try now, and if nothing was free, again when a peer
		// says it unlocked partitions, or after Tick/5 doubling up to
		// KeepAlive, or when the first lease of a vanished worker expires
		// if that is sooner (they free themselves silently).
		got, orphanExpiry := m.acquire(ctx, share-holding)
		if got > 0 || freed {
			m.acquireWait = m.cfg.Tick / 5
		} else {
			m.acquireWait = min(2*max(m.acquireWait, m.cfg.Tick/10), m.cfg.KeepAlive)
		}
		m.acquireAt = time.Now().Add(m.acquireWait)
		if !orphanExpiry.IsZero() && orphanExpiry.Before(m.acquireAt) {
			m.acquireAt = orphanExpiry.Add(time.Millisecond)
		}
	}
	if holding >= share {
		m.acquireWait, m.acquireAt = 0, time.Time{}
	}
	if short := m.ReservedShort(); short > 0 && ctx.Err() == nil {
		m.logErr("lease_reserved", "fewer reserved partitions free than asked; still trying", errReservedShort,
			"reserved", m.cfg.Reserved, "missing", short)
	}
	return m.nextWait(share)
}

// outranksAPeer reports whether a member of the pool, as last read, is in
// a lower class than this worker's and wants partitions it could yield
// (Run loop only).
func (m *Manager) outranksAPeer() bool {
	for w, a := range m.peers {
		if w != m.cfg.WorkerID && a.Priority < m.cfg.Priority && a.Want > a.Reserved {
			return true
		}
	}
	return false
}

// nextWait is Tick, or sooner when an acquire attempt, a renewal, an
// unlock, a keep-alive or a definition read is due.
func (m *Manager) nextWait(share int) time.Duration {
	wait := m.cfg.Tick
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.held) < share && !m.acquireAt.IsZero() {
		wait = min(wait, time.Until(m.acquireAt))
	}
	now := time.Now()
	for _, h := range m.held {
		wait = min(wait, h.renewedAt.Add(m.cfg.RenewEvery).Sub(now), h.count.to.Sub(now))
	}
	for _, c := range m.cooling {
		if d := c.until.Sub(now); d > 0 {
			wait = min(wait, d)
		} else {
			wait = min(wait, answerPoll) // its sends' answers are awaited
		}
	}
	if !m.annAt.IsZero() {
		wait = min(wait, m.annAt.Add(m.annEvery).Sub(now))
	}
	if !m.nextRead.IsZero() {
		wait = min(wait, m.nextRead.Sub(now))
	}
	return max(wait, time.Millisecond)
}

// each runs f on every client concurrently, each under the operation
// timeout, logs failures, and returns how many succeeded.
func (m *Manager) each(ctx context.Context, f func(ctx context.Context, i int, c redis.UniversalClient) error, key, msg string) int {
	var (
		wg sync.WaitGroup
		ok atomic.Int32
	)
	for i, c := range m.clients {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, m.opTimeout)
			defer cancel()
			if err := f(cctx, i, c); err != nil {
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
	m.unlock(ctx, hs, time.Time{})
	m.unlockCooled(ctx, true)
	m.each(ctx, func(ctx context.Context, _ int, c redis.UniversalClient) error {
		return withdraw(ctx, c, m.keys, m.cfg.WorkerID, m.lastAnn)
	}, "lease_withdraw", "member withdrawal failed")
	m.log.Info("leases released", "partitions", len(hs))
}

// logErr logs err at warning level, at most once per 10 s per key, never
// for context.Canceled.
func (m *Manager) logErr(key, msg string, err error, attrs ...any) {
	if errors.Is(err, context.Canceled) {
		return
	}
	s, _ := m.errLogs.LoadOrStore(key, &rate.Sometimes{Interval: 10 * time.Second})
	s.(*rate.Sometimes).Do(func() { m.log.Warn(msg, append(attrs, "err", err)...) })
}
