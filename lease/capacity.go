package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// CapacityReader is a sink that can tell its capacity (Source kind
// SourceSink). The sink package's DynamoDB and REST sinks implement it.
type CapacityReader interface {
	// SinkCapacity returns the sink's capacity in the pool's unit per
	// second and where it was read, e.g. "from DynamoDB table quakes: 200
	// WCU". A capacity of 0 with a nil error means not known yet (a REST
	// API that has not answered). An error means the sink did not answer
	// the query; the pool then keeps its last value.
	SinkCapacity(ctx context.Context) (perSecond float64, from string, err error)
}

// Observation is what a process's workers of one pool have done so far,
// cumulative since they started (Backlog is the state now). A probing
// pool's controller adds the differences to the pool's shared account in
// Redis, so that the step is decided on what all the workers saw.
type Observation struct {
	// Units is the units sent, retries included.
	Units float64
	// Attempts is the record attempts sent; Throttled those answered
	// throttled.
	Attempts, Throttled int64
	// Latency is the send→answer latencies summed over Answers answers.
	Latency time.Duration
	Answers int64
	// Backlog is whether the workers have records waiting beyond what
	// they fetched.
	Backlog bool
}

// ControllerConfig configures a Controller.
type ControllerConfig struct {
	// Pool is the pool as defined (DefinePool): its Name, Unit and Source
	// are used. Required, with a Source.
	Pool Pool
	// Prefix starts every Redis key. Default DefaultPrefix.
	Prefix string
	// WorkerID names this process in the pool's capacity state. Default:
	// a random ID.
	WorkerID string
	// Reader reads the sink's capacity; required for SourceSink.
	Reader CapacityReader
	// Observe returns the workers' observation; required for
	// SourceProbe.
	Observe func() Observation
	// Lead is how far ahead a raise switches. Default ProbeLead. A
	// decrease switches at once (DecreaseLead).
	Lead time.Duration
	// Tick is how often observations are added to the shared account and
	// the reader is looked at. Default 250 ms.
	Tick time.Duration
	// Logger receives decisions and failures. Default: discard.
	Logger *slog.Logger
}

// ProbeLead is how far ahead a raised capacity switches when a capacity
// source raised it: 500 ms. A raise of the capacity alone is safe however
// late a worker learns of it (it uses less meanwhile), so the lead only
// lets the workers switch together.
const ProbeLead = 500 * time.Millisecond

// obsBucket is the width of the shared observation account's buckets.
const obsBucket = 500 * time.Millisecond

// obsKeep is how long an observation bucket lives in Redis.
const obsKeep = 2 * time.Minute

// Controller decides a pool's capacity from its Source once per interval
// for all the pool's workers, through Redis, and writes each decision as
// a live change (UpdatePool) that every worker's Manager follows: a
// decrease before the next second, a raise at a switch instant.
//
// Every process that runs workers of the pool runs one Controller. Every
// Source.Every one of them, whichever asks first, takes the pool's turn (a
// script that compares the last decision's time with the interval and
// records the new one atomically) and decides:
//
//   - SourceSink: it reads the sink (CapacityReader), bounded by the floor
//     and the ceiling, and stores a value that differs. A sink that does
//     not answer keeps the last value: the controller logs a warning
//     (rate-limited), counts it (ReadFailures) and says so in the pool's
//     From. A reader that learns of a new value by itself (a REST API's
//     answer headers) asks for a turn at once, at most once a second.
//   - SourceProbe: see probeStep. Every process adds what its workers
//     sent, how many attempts were throttled, their latencies and whether
//     they have a backlog to the pool's account in Redis, in buckets of
//     500 ms; the turn's holder decides on the sum over the buckets since
//     the last switch.
//
// Run returns when ctx is done.
type Controller struct {
	cfg     ControllerConfig
	keys    keys
	clients []redis.UniversalClient
	log     *slog.Logger
	errLog  rate.Sometimes

	last      Observation // the observation already added to the account
	nextTurn  time.Time   // when the next turn is due, by the last answer
	failures  atomic.Int64
	failingAt time.Time // since when the sink has not answered; zero while it does

	mu       sync.Mutex
	decision Decision
}

// Decision is a controller's latest decision, for logs and tests.
type Decision struct {
	At       time.Time
	Capacity float64
	Reason   string
}

// NewController checks cfg and returns a Controller over clients (the
// first that answers decides; the decision is written to every one).
func NewController(cfg ControllerConfig, clients ...redis.UniversalClient) (*Controller, error) {
	cfg.Pool = cfg.Pool.withDefaults()
	switch {
	case len(clients) == 0:
		return nil, fmt.Errorf("%w: at least one Redis client is required", ErrInvalidConfig)
	case !cfg.Pool.Source.On():
		return nil, fmt.Errorf("%w: pool %q: a capacity controller needs a capacity source", ErrInvalidConfig, cfg.Pool.Name)
	case cfg.Pool.Source.Kind == SourceSink && cfg.Reader == nil:
		return nil, fmt.Errorf("%w: pool %q: capacity from the sink needs a sink that can tell it", ErrInvalidConfig, cfg.Pool.Name)
	case cfg.Pool.Source.Kind == SourceProbe && cfg.Observe == nil:
		return nil, fmt.Errorf("%w: pool %q: a probe needs the workers' observations", ErrInvalidConfig, cfg.Pool.Name)
	}
	if err := cfg.Pool.Validate(); err != nil {
		return nil, err
	}
	cfg.Prefix = cmp.Or(cfg.Prefix, DefaultPrefix)
	cfg.WorkerID = cmp.Or(cfg.WorkerID, defaultWorkerID())
	cfg.Lead = cmp.Or(cfg.Lead, ProbeLead)
	cfg.Tick = cmp.Or(cfg.Tick, 250*time.Millisecond)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Controller{cfg: cfg, keys: keysOn(clients[0], cfg.Prefix, cfg.Pool.Name), clients: clients,
		log: cfg.Logger.With("pool", cfg.Pool.Name), errLog: rate.Sometimes{Interval: 10 * time.Second}}, nil
}

// ReadFailures returns how many times the sink did not answer a capacity
// query.
func (c *Controller) ReadFailures() int64 { return c.failures.Load() }

// Last returns the controller's latest decision (zero before any).
func (c *Controller) Last() Decision {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.decision
}

// Run decides the pool's capacity, when it is this process's turn, and
// adds the workers' observations to the pool's account until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Tick)
	defer t.Stop()
	if c.cfg.Observe != nil {
		c.last = c.cfg.Observe()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		if c.cfg.Pool.Source.Kind == SourceProbe {
			c.report(ctx, now)
		}
		force := false
		if c.cfg.Pool.Source.Kind == SourceSink {
			force = c.sinkMoved(ctx)
		}
		if !force && now.Before(c.nextTurn) {
			continue
		}
		won, wait, err := c.takeTurn(ctx, force)
		if err != nil {
			c.warn("capacity turn failed", err)
			c.nextTurn = now.Add(time.Second)
			continue
		}
		c.nextTurn = now.Add(wait)
		if !won {
			continue
		}
		if err := c.decide(ctx); err != nil && ctx.Err() == nil {
			c.warn("capacity decision failed", err)
		}
	}
}

func (c *Controller) warn(msg string, err error, attrs ...any) {
	if errors.Is(err, context.Canceled) {
		return
	}
	c.errLog.Do(func() { c.log.Warn(msg, append(attrs, "err", err)...) })
}

// sinkMoved reports whether a passive reader (one that needs no request,
// like a REST API's answer headers) already shows a value other than the
// one in force. Readers that query the sink are only read at a turn.
func (c *Controller) sinkMoved(ctx context.Context) bool {
	p, ok := c.cfg.Reader.(interface{ Passive() bool })
	if !ok || !p.Passive() {
		return false
	}
	v, _, err := c.cfg.Reader.SinkCapacity(ctx)
	if err != nil || v <= 0 {
		return false
	}
	pool, err := c.pool(ctx)
	if err != nil {
		return false
	}
	return c.cfg.Pool.Source.clamp(v) != pool.Capacity
}

// turnScript takes the pool's capacity turn: when at least ARGV[2] ms
// passed since the last decision by the clock of the process asking
// (ARGV[4], Unix ms; TIME is not among the commands a sluice ACL user may
// run), it records this one by worker ARGV[1] and returns 1; it also
// returns the ms until the next turn is due by ARGV[3], the interval. A
// clock that differs between hosts only shifts the cadence: every
// decision is written with a compare-and-set (UpdatePool).
var turnScript = newScript(`
local now = tonumber(ARGV[4])
local last = tonumber(redis.call('HGET', KEYS[1], 'decided') or '0')
local gap = tonumber(ARGV[2])
if now - last < gap then
  return {0, last + tonumber(ARGV[3]) - now}
end
redis.call('HSET', KEYS[1], 'decided', now, 'by', ARGV[1])
return {1, tonumber(ARGV[3])}
`)

// takeTurn asks for the pool's turn; force asks for one a second after the
// last instead of an interval after it.
func (c *Controller) takeTurn(ctx context.Context, force bool) (bool, time.Duration, error) {
	every := c.cfg.Pool.Source.Every
	gap := every - every/20 // a tick's jitter must not skip an interval
	if force {
		gap = time.Second
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, err := turnScript.Run(rctx, c.clients[0], []string{c.keys.capacityState()}, c.cfg.WorkerID, gap.Milliseconds(), every.Milliseconds(), time.Now().UnixMilli()).Int64Slice()
	if err != nil {
		return false, 0, err
	}
	if len(res) != 2 {
		return false, 0, fmt.Errorf("lease: capacity turn: unexpected answer %v", res)
	}
	wait := max(time.Duration(res[1])*time.Millisecond, c.cfg.Tick)
	return res[0] == 1, wait, nil
}

// pool reads the definition in force.
func (c *Controller) pool(ctx context.Context) (Pool, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	p, err := loadPool(rctx, c.clients[0], c.keys.def())
	if errors.Is(err, redis.Nil) {
		return p, fmt.Errorf("%w: pool %q", ErrNoPool, c.cfg.Pool.Name)
	}
	p.Name = c.cfg.Pool.Name
	return p, err
}

// decide takes one decision for the pool, at its turn.
func (c *Controller) decide(ctx context.Context) error {
	p, err := c.pool(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	if sw := p.Switch; sw != nil && sw.At.After(now) {
		return nil // the last change has not switched yet
	}
	if p.Source != c.cfg.Pool.Source {
		return nil // the pool's source changed since this process started: its peers decide
	}
	var (
		next   float64
		from   string
		reason string
	)
	switch p.Source.Kind {
	case SourceSink:
		next, from, reason, err = c.readSink(ctx, p, now)
		if err != nil {
			return err
		}
	case SourceProbe:
		var st probeState
		if next, st, reason, err = c.probe(ctx, p, now); err != nil {
			return err
		}
		from = "probed"
		if err := c.saveProbe(ctx, st); err != nil {
			return err
		}
	}
	if next <= 0 || (next == p.Capacity && from == p.From) {
		c.log.Debug("pool capacity kept", "capacity", p.Capacity, "unit", p.Unit, "reason", reason)
		return nil
	}
	u := Update{Capacity: next, From: &from, Lead: c.cfg.Lead}
	var out Pool
	for _, rc := range c.clients {
		if out, err = UpdatePool(ctx, rc, c.cfg.Prefix, p.Name, u, now); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.decision = Decision{At: now, Capacity: next, Reason: reason}
	c.mu.Unlock()
	if next != p.Capacity {
		attrs := []any{"capacity", next, "capacity_before", p.Capacity, "unit", p.Unit, "reason", reason}
		if out.Switch != nil {
			attrs = append(attrs, "at", out.Switch.At)
		}
		c.log.Info("pool capacity changed", attrs...)
	}
	return nil
}

// readSink reads the sink's capacity. A failure keeps the value in force
// and says so in From (once).
func (c *Controller) readSink(ctx context.Context, p Pool, now time.Time) (float64, string, string, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, from, err := c.cfg.Reader.SinkCapacity(rctx)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", "", ctx.Err()
		}
		c.failures.Add(1)
		if c.failingAt.IsZero() {
			c.failingAt = now
		}
		c.log.Warn("the sink does not answer its capacity query; the pool keeps its last value",
			"capacity", p.Capacity, "unit", p.Unit, "since", c.failingAt, "err", err)
		stale := staleFrom(p.From, c.failingAt)
		return p.Capacity, stale, "the sink does not answer; last value kept", nil
	}
	c.failingAt = time.Time{}
	if v <= 0 {
		return 0, "", "", nil // not known yet
	}
	next := p.Source.clamp(v)
	if next != v {
		from += fmt.Sprintf(", bounded to %s/s", formatRate(next))
	}
	return next, from, "read from the sink", nil
}

// staleSuffix marks a From whose sink stopped answering.
const staleSuffix = "; the sink does not answer since "

// staleFrom is from marked as kept since when the sink stopped answering.
func staleFrom(from string, since time.Time) string {
	if strings.Contains(from, staleSuffix) {
		return from
	}
	return from + staleSuffix + since.UTC().Format(time.RFC3339) + ", last value kept"
}

// report adds the observation made since the last report to the pool's
// account, in the bucket of now.
func (c *Controller) report(ctx context.Context, now time.Time) {
	o := c.cfg.Observe()
	d := Observation{
		Units: o.Units - c.last.Units, Attempts: o.Attempts - c.last.Attempts, Throttled: o.Throttled - c.last.Throttled,
		Latency: o.Latency - c.last.Latency, Answers: o.Answers - c.last.Answers,
	}
	if d.Units == 0 && d.Attempts == 0 && !o.Backlog {
		c.last = o
		return
	}
	key := c.keys.observations(now.UnixMilli() / obsBucket.Milliseconds())
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := c.clients[0].TxPipelined(rctx, func(p redis.Pipeliner) error {
		p.HIncrByFloat(rctx, key, "u", d.Units)
		p.HIncrBy(rctx, key, "a", d.Attempts)
		p.HIncrBy(rctx, key, "t", d.Throttled)
		p.HIncrBy(rctx, key, "l", d.Latency.Microseconds())
		p.HIncrBy(rctx, key, "n", d.Answers)
		if o.Backlog {
			p.HSet(rctx, key, "b", 1)
		}
		p.PExpire(rctx, key, obsKeep)
		return nil
	})
	if err != nil {
		c.warn("capacity observation not reported", err)
		return // the next report carries it
	}
	c.last = o
}
