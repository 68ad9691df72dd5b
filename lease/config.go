package lease

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/sluicehq/sluice/ingest"
)

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
	// While below its share with nothing free, the loop tries again when a
	// peer unlocks partitions, or after Tick/5 doubling up to KeepAlive.
	Tick time.Duration
	// RenewEvery is how long after its last lock or extend a lease is
	// extended. Default TTL/3. Margin + RenewEvery must be at most 90 % of
	// the TTL, so a renewal has time to complete before the lease stops
	// counting.
	RenewEvery time.Duration
	// MemberTTL is how long the worker's announcement stays live without
	// a keep-alive; a worker that vanishes without withdrawing stops being
	// counted in the fair share at most a KeepAlive after it. Default
	// max(4 × Tick, RenewEvery) (5 s with the default 15 s TTL).
	MemberTTL time.Duration
	// KeepAlive is how often the worker refreshes an announcement whose
	// fair-share fields have not changed (a change is announced at once),
	// and so how often it confirms that neither the members nor the pool
	// definition changed unseen. Default min(MemberTTL, RenewEvery)/3;
	// must be < MemberTTL and ≤ RenewEvery/3, so a single failed keep-alive
	// is retried before the definition counts as unread (RenewEvery/2).
	KeepAlive time.Duration
	// Reserved is how many partitions the worker holds for its lifetime,
	// whatever its demand: acquired at start, renewed, never released for
	// lack of demand (a failed renewal still drops one at once, and it is
	// taken again). The rest of the pool is shared on demand. While fewer
	// than Reserved are free the worker logs it and keeps trying; see
	// ReservedShort. Default 0; at most the pool's partitions.
	Reserved int
	// Releasable, when set, is asked before the worker gives capacity back
	// of its own will (a share that shrank, a turn that ended, a demand
	// that fell): whether its rate may drop to rate units/s at now without
	// its recent sends ending up beyond its credit, its current rate still
	// counting for a grace after now, and the least such grace up to most
	// (pacing.Pacer's Releasable). The manager asks with most = Slice;
	// while the answer is no, it asks about fewer leases, and the rest
	// wait for a later tick. The leases released are unlocked for their
	// peers once the grace returned has passed (and Answered says so). A
	// yes is taken as the release it asked about: the pacer holds the
	// sends that follow to the lower rate. Lost and expiring leases stop
	// counting whatever it says. Called without the manager's lock held.
	// Default: every release waits a Slice before the unlock.
	Releasable func(now time.Time, rate float64, most time.Duration) (grace time.Duration, ok bool)
	// HandOver, when set, is asked when the worker unlocks released
	// leases and nothing else is cooling: since when a peer that takes
	// one of them over may count it as its own, rather than from its lock
	// (pacing.Pacer's HandOver, which says yes only to a worker whose rate
	// is 0: one that gave up all it held). The unlock leaves that
	// instant beside each lease for handOverKeep (2 s, at most half the
	// TTL), and a worker that locks the partition while it is there counts
	// the partition from it: the next worker in a turn of costly records
	// sends at once what the last one left unspent. ok false, or no
	// HandOver: the taker counts from its lock. A yes is taken as the
	// hand-over: the pacer counts none of its credit from since on for a
	// Window. Called without the manager's lock held.
	HandOver func(now, stopped time.Time, freed float64) (since time.Time, ok bool)
	// Answered, when set, reports whether every send the worker made
	// before the given instant has had its answer (pacing.Pacer's
	// Answered). A released lease is unlocked only once the sends made
	// before it stopped counting are answered, since the sink may accept
	// a request until its answer; the manager looks again every 5 ms
	// until they are. Default: sends count as answered.
	Answered func(before time.Time) bool
	// Priority is the worker's class in the pool (see Priority): the pool
	// serves the demand of a higher class first. Default PriorityNormal.
	Priority Priority
	// Weight is the worker's weight inside its class: members of one class
	// with backlogs split what the class gets in proportion to their
	// weights (weighted max-min). Default DefaultWeight (1); must be ≥ 1.
	Weight int
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
		c.MemberTTL = max(4*c.Tick, c.RenewEvery)
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = min(c.MemberTTL, c.RenewEvery) / 3
	}
	if c.Weight == 0 {
		c.Weight = DefaultWeight
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
	if !c.Priority.Valid() {
		return invalid("Priority %d must be PriorityHigh, PriorityNormal or PriorityLow", int(c.Priority))
	}
	if c.Weight < 1 {
		return invalid("Weight %d must be a positive integer", c.Weight)
	}
	if strings.ContainsAny(c.Prefix, " \t\r\n") {
		return invalid("Prefix %q must not contain whitespace", c.Prefix)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"RequestTimeout", c.RequestTimeout}, {"Slice", c.Slice}, {"Drift", c.Drift}, {"Margin", c.Margin}, {"Tick", c.Tick}, {"RenewEvery", c.RenewEvery}, {"MemberTTL", c.MemberTTL}, {"KeepAlive", c.KeepAlive}} {
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
	if c.KeepAlive >= c.MemberTTL || c.KeepAlive > c.RenewEvery/3 {
		return invalid("KeepAlive %v must be < MemberTTL %v and ≤ RenewEvery/3 (%v)", c.KeepAlive, c.MemberTTL, c.RenewEvery/3)
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

// holderOf returns the worker ID in a lock value ("<worker ID>/<random>").
func holderOf(value string) string {
	if i := strings.LastIndexByte(value, '/'); i >= 0 {
		return value[:i]
	}
	return value
}
