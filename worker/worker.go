// Package worker assembles one sluice worker: a Kafka consumer in the
// topic's consumer group (queue.Source), leases on a capacity pool in Redis
// (lease.Manager), the slice pacer over them (pacing.Pacer) and the
// pipeline that drains the one into the sink at the other's rate
// (pipeline.Pipeline), from one Config whose defaults are filled and checked
// in one place. The CLI, the benchmarks and the tests all build workers
// here.
//
// A Worker runs as a stack and stops in dependency order: the pipeline
// stops fetching and drains within its grace period, then the source
// commits what the sink acknowledged and leaves the group, then the lease
// manager stops counting its leases and unlocks them.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/pipeline"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sink"
)

// DefaultGroup is the consumer group of the workers of topic that do not
// name one: "sluice-<topic>".
func DefaultGroup(topic string) string { return "sluice-" + topic }

// ErrConfig is wrapped by New's errors about the Config.
var ErrConfig = errors.New("worker: invalid config")

// ConfigError is an invalid Config field; it wraps ErrConfig. Field names
// the Config field (several, comma-separated, when the rule binds them), so
// that a caller can name its own setting for it.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("%v: %s: %v", ErrConfig, e.Field, e.Err) }

func (e *ConfigError) Unwrap() []error { return []error{ErrConfig, e.Err} }

// Config is everything a worker is built from. Zero fields take the
// documented default; the shared parts (Redis, Sink, DeadLetters) are
// required and are not closed by the worker.
type Config struct {
	// Source, when set, is where the worker takes its records instead of a
	// Kafka consumer of Topic (Brokers, Kafka, Topic and Group are then
	// unused): an in-memory queue for simulations and tests. It runs as a
	// layer of the worker's stack, after the pipeline, when it is an
	// ingest.Runner; its Lag is reported when it is an ingest.Lagger.
	Source ingest.Source
	// Brokers are the Kafka bootstrap brokers, "host:port"; required
	// without Source.
	Brokers []string
	// Kafka is the TLS and SASL setup of the connections; zero: plaintext.
	Kafka queue.Conn
	// Topic is the record type's topic; required without Source.
	Topic string
	// Group is the consumer group. Defaults to DefaultGroup(Topic),
	// "sluice-<Topic>".
	Group string

	// Redis are the clients of the Redis masters holding the pool (several
	// make a Redlock quorum); required.
	Redis []redis.UniversalClient
	// Pool is the capacity pool; required (see lease.Pool for its own
	// defaults). It should have been stored with lease.EnsurePool.
	Pool lease.Pool
	// Reserved is how many partitions the worker holds for its lifetime.
	// Default 0.
	Reserved int
	// Priority is the worker's class in the pool: the pool serves a
	// higher class's demand first and lower classes share what is left
	// (see lease.Priority). Default lease.PriorityNormal; `sluice
	// bulk-load` runs its workers at lease.PriorityLow.
	Priority lease.Priority
	// Weight is the worker's weight inside its class (weighted max-min).
	// Default lease.DefaultWeight (1); must be ≥ 1.
	Weight int
	// WorkerID names the worker in the pool. Defaults to
	// "<hostname>-<pid>-<random hex>".
	WorkerID string

	// Pricing prices each record in the pool's unit. Defaults to 1 per
	// record.
	Pricing ingest.Pricing
	// IDField names the JSON field holding a record's ID. Default: a
	// content hash.
	IDField string
	// Processor applies the record type's rules. Default: none.
	Processor ingest.Processor
	// Slice is the pacing slice. Defaults to ingest.DefaultSlice (200 ms).
	Slice time.Duration
	// Guard is the least time a send stays in the pacer's account beyond
	// one second. Defaults to pacing.DefaultGuard (0: the measured answer
	// bounds it).
	Guard time.Duration
	// RequestTimeout is the deadline of every sink write; the lease margin
	// covers it, and the sink's own timeouts must fit inside it. Defaults to
	// ingest.DefaultRequestTimeout (2 s).
	RequestTimeout time.Duration
	// MaxRetryAfter caps how long a sink's Retry-After holds writes back:
	// a paused sink, a throttled key range, a retried record. Defaults to
	// ingest.DefaultMaxRetryAfter (30 s).
	MaxRetryAfter time.Duration
	// Grace is how long in-flight writes may finish at shutdown. Defaults
	// to ingest.DefaultGrace (10 s).
	Grace time.Duration
	// ReadyAfter is how long a failure lasts before the worker reports
	// itself not ready. Defaults to ingest.DefaultReadyAfter (30 s).
	ReadyAfter time.Duration
	// StallTimeout makes Run return an *pipeline.StalledError when a failure
	// lasts this long. Default 0: never.
	StallTimeout time.Duration
	// MaxBatch is the most records per sink request. Defaults to
	// ingest.DefaultMaxBatch (100).
	MaxBatch int
	// Concurrency is the most sink requests in flight. Defaults to
	// ingest.DefaultConcurrency (16).
	Concurrency int
	// MaxInFlightBytes bounds memory: the most bytes of records fetched
	// and not finished (see pipeline.Config.MaxInFlightBytes).
	// Defaults to ingest.DefaultMaxInFlightBytes (64 MiB).
	MaxInFlightBytes int64
	// MaxInFlight, when > 0, also bounds the records fetched and not
	// finished by their number. Default 0: the byte bound alone.
	MaxInFlight int
	// MaxAttempts is the write attempts per record answered retryable
	// (throttling and failures of whole requests do not count). Defaults to
	// sink.DefaultMaxAttempts (8).
	MaxAttempts int
	// LeaseAhead takes leases before the first record arrives and Start,
	// when not nil, holds the first fetch until it is closed (bulk loads).
	LeaseAhead bool
	Start      <-chan struct{}

	// Sink receives the records; required.
	Sink ingest.Sink
	// DeadLetters receives the records that can never be written;
	// required.
	DeadLetters ingest.DeadLetters
	// Counters receives the running totals (several workers may share
	// one). Default: the worker's own.
	Counters *ingest.Counters
	// Metrics, when set, reports the worker to Prometheus.
	Metrics *metrics.Collector
	// Logger receives the worker's logs. Default: slog.Default().
	Logger *slog.Logger
}

// withDefaults fills the zero fields of c and checks it; errors name the
// field.
func (c Config) withDefaults() (Config, error) {
	c.Group = cmp.Or(c.Group, DefaultGroup(c.Topic))
	c.Slice = cmp.Or(c.Slice, ingest.DefaultSlice)
	c.Guard = cmp.Or(c.Guard, pacing.DefaultGuard)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, ingest.DefaultRequestTimeout)
	c.Grace = cmp.Or(c.Grace, ingest.DefaultGrace)
	c.MaxRetryAfter = cmp.Or(c.MaxRetryAfter, ingest.DefaultMaxRetryAfter)
	c.ReadyAfter = cmp.Or(c.ReadyAfter, ingest.DefaultReadyAfter)
	c.MaxBatch = cmp.Or(c.MaxBatch, ingest.DefaultMaxBatch)
	c.Concurrency = cmp.Or(c.Concurrency, ingest.DefaultConcurrency)
	c.MaxInFlightBytes = cmp.Or(c.MaxInFlightBytes, ingest.DefaultMaxInFlightBytes)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, sink.DefaultMaxAttempts)
	c.Weight = cmp.Or(c.Weight, lease.DefaultWeight)
	c.Counters = cmp.Or(c.Counters, new(ingest.Counters))
	c.Logger = cmp.Or(c.Logger, slog.Default())
	invalid := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
	}
	switch {
	case c.Source == nil && len(c.Brokers) == 0:
		return c, invalid("Brokers", "at least one host:port is required")
	case c.Source == nil && c.Topic == "":
		return c, invalid("Topic", "a topic is required")
	case c.Slice < 10*time.Millisecond:
		return c, invalid("Slice", "must be ≥ 10ms, got %s", c.Slice)
	case c.MaxBatch < 1:
		return c, invalid("MaxBatch", "must be ≥ 1, got %d", c.MaxBatch)
	case c.Concurrency < 1:
		return c, invalid("Concurrency", "must be ≥ 1, got %d", c.Concurrency)
	case c.MaxInFlight < 0:
		return c, invalid("MaxInFlight", "must not be negative, got %d", c.MaxInFlight)
	case c.MaxInFlightBytes < ingest.RecordOverhead:
		return c, invalid("MaxInFlightBytes", "must be ≥ %d (one record's overhead), got %d", ingest.RecordOverhead, c.MaxInFlightBytes)
	case c.MaxAttempts < 1:
		return c, invalid("MaxAttempts", "must be ≥ 1, got %d", c.MaxAttempts)
	case c.Guard < 0 || c.Guard >= c.Slice:
		return c, invalid("Guard", "must be within [0, Slice %s), got %s", c.Slice, c.Guard)
	case c.RequestTimeout < 0 || c.Grace < 0 || c.ReadyAfter < 0 || c.StallTimeout < 0:
		return c, invalid("RequestTimeout, Grace, ReadyAfter, StallTimeout", "must not be negative")
	case c.MaxRetryAfter < time.Second:
		return c, invalid("MaxRetryAfter", "must be ≥ 1s, got %s", c.MaxRetryAfter)
	case !c.Priority.Valid():
		return c, invalid("Priority", "unknown priority class %v (want high, normal or low)", c.Priority)
	case c.Weight < 1:
		return c, invalid("Weight", "must be a positive integer, got %d", c.Weight)
	case c.Reserved < 0 || c.Reserved > c.Pool.Partitions:
		return c, invalid("Reserved", "must be within 0..%d (the pool's partitions), got %d", c.Pool.Partitions, c.Reserved)
	}
	if err := c.Pool.Validate(); err != nil {
		if pe := (*lease.PoolError)(nil); errors.As(err, &pe) {
			return c, &ConfigError{Field: "Pool." + pe.Field, Err: err}
		}
		return c, err
	}
	return c, nil
}

// Validate fills c's defaults and checks its settings (the shared parts
// aside) without building anything; it returns the *ConfigError New would.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// Worker is one assembled worker. Create it with New, run it with Run.
type Worker struct {
	cfg      Config
	layers   []ingest.Runner // in the order they stop
	close    func() error    // releases the source of a worker that will not run
	once     sync.Once       // Run or Close: the source is released once
	lease    *lease.Manager
	pacer    *pacing.Pacer
	pipeline *pipeline.Pipeline
	lag      func() int64
}

// New checks cfg, fills its defaults and builds the worker. The consumer
// joins the group when Run starts; call Run (or Close) so that it is
// closed. Errors about cfg wrap ErrConfig, lease.ErrInvalidPool or
// lease.ErrInvalidConfig and name the field.
func New(cfg Config) (_ *Worker, err error) {
	cfg, err = cfg.withDefaults()
	switch {
	case err != nil:
		return nil, err
	case len(cfg.Redis) == 0:
		return nil, &ConfigError{Field: "Redis", Err: errors.New("at least one client is required")}
	case cfg.Sink == nil || cfg.DeadLetters == nil:
		return nil, &ConfigError{Field: "Sink, DeadLetters", Err: errors.New("both are required")}
	}
	log := cfg.Logger
	var pacer *pacing.Pacer // the lease manager asks it before giving capacity back
	mgr, err := lease.New(lease.Config{
		Pool: cfg.Pool, WorkerID: cfg.WorkerID, RequestTimeout: cfg.RequestTimeout, Slice: cfg.Slice,
		Reserved: cfg.Reserved, Priority: cfg.Priority, Weight: cfg.Weight, Logger: log,
		Releasable: func(now time.Time, rate float64, most time.Duration) (time.Duration, bool) {
			return pacer.Releasable(now, rate, most)
		},
		Answered: func(before time.Time) bool { return pacer.Answered(before) },
		HandOver: func(now, stopped time.Time, freed float64) (time.Time, bool) {
			return pacer.HandOver(now, stopped, freed)
		},
	}, cfg.Redis...)
	if err != nil {
		return nil, err
	}
	log = log.With("worker", mgr.WorkerID())
	pacer, err = pacing.New(pacing.Config{Slice: cfg.Slice, Guard: cfg.Guard}, mgr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	src, closeSource := cfg.Source, func() error { return nil }
	if src == nil {
		consumer, err := queue.NewSource(queue.SourceConfig{
			Brokers: cfg.Brokers, Conn: cfg.Kafka, Topic: cfg.Topic, Group: cfg.Group, Logger: log,
		})
		if err != nil {
			return nil, err
		}
		src, closeSource = consumer, consumer.Close
	}
	defer func() {
		if err != nil {
			_ = closeSource() // its reader's goroutines would outlive the caller
		}
	}()
	var observe func(int, time.Duration)
	if cfg.Metrics != nil {
		observe = cfg.Metrics.ObserveWrite(cfg.Pool.Name)
	}
	pl, err := pipeline.New(pipeline.Config{
		Pricing:          cfg.Pricing,
		IDField:          cfg.IDField,
		MaxBatch:         cfg.MaxBatch,
		Concurrency:      cfg.Concurrency,
		MaxInFlight:      cfg.MaxInFlight,
		MaxInFlightBytes: cfg.MaxInFlightBytes,
		MaxRecordCost:    maxRecordCost(cfg.Pool),
		Slice:            cfg.Slice,
		RequestTimeout:   cfg.RequestTimeout,
		MaxRetryAfter:    cfg.MaxRetryAfter,
		Grace:            cfg.Grace,
		ReadyAfter:       cfg.ReadyAfter,
		StallTimeout:     cfg.StallTimeout,
		LeaseAhead:       cfg.LeaseAhead,
		Start:            cfg.Start,
		Logger:           log,
		Counters:         cfg.Counters,
		ObserveWrite:     observe,
		Processor:        cfg.Processor,
	}, pipeline.Ports{
		Source:      src,
		DeadLetters: cfg.DeadLetters,
		Sink:        cfg.Sink,
		Retry:       sink.Policy{MaxAttempts: cfg.MaxAttempts, MaxRetryAfter: cfg.MaxRetryAfter},
		Pacer:       pacer,
		Capacity:    mgr,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	w := &Worker{cfg: cfg, layers: []ingest.Runner{pl}, close: closeSource, lease: mgr, pacer: pacer, pipeline: pl,
		lag: func() int64 { return -1 }}
	if r, ok := src.(ingest.Runner); ok {
		w.layers = append(w.layers, r)
	}
	w.layers = append(w.layers, mgr)
	if l, ok := src.(ingest.Lagger); ok {
		w.lag = l.Lag
	}
	if cfg.Metrics != nil {
		cfg.Metrics.Add(metrics.Worker{Pool: cfg.Pool.Name, Lease: mgr, Pacer: pacer, Lag: w.lag, Sink: w}, cfg.Counters)
	}
	return w, nil
}

// maxRecordCost is one second of the pool's capacity, the most a record
// may cost; for a pool whose capacity comes from a source (and may grow),
// its ceiling, or no bound without one.
func maxRecordCost(p lease.Pool) int64 {
	if p.Source.On() {
		return int64(p.Source.Ceiling)
	}
	return int64(p.Capacity)
}

// Lag returns the worker's consumer lag in records (-1 unknown).
func (w *Worker) Lag() int64 { return w.lag() }

// Attach adds r to the worker's stack (it runs while the worker runs and
// stops after its other layers): a pool's capacity controller runs so
// beside the first worker of a process. Call it before Run.
func (w *Worker) Attach(r ingest.Runner) { w.layers = append(w.layers, r) }

// Run runs the worker until ctx is done or the pipeline gives up (see
// Config.StallTimeout), then stops it in dependency order. It returns the
// pipeline's *pipeline.StalledError, or the errors of stopping, joined.
func (w *Worker) Run(ctx context.Context) error {
	ran := false
	w.once.Do(func() { ran = true })
	if !ran {
		return errors.New("worker: Run after Run or Close")
	}
	return ingest.RunStack(ctx, w.layers...)
}

// Close releases a worker that will not Run (its Kafka consumer's
// connections); Run releases them itself, and Close after Run does
// nothing.
func (w *Worker) Close() (err error) {
	w.once.Do(func() { err = w.close() })
	return err
}

// Rate returns the rate, in units/s, the worker's valid leases allow at
// now.
func (w *Worker) Rate(now time.Time) float64 { return w.lease.Rate(now) }

// ErrRedisUnreachable is wrapped by Ready's error once the worker's Redis
// has been unreachable for Config.ReadyAfter.
var ErrRedisUnreachable = errors.New("worker: Redis unreachable")

// Ready returns nil while the worker can make progress, and an error
// naming the failure once one has lasted Config.ReadyAfter: the sink
// paused, the dead-letter topic or the queue unreachable
// (pipeline.Pipeline.Ready), or Redis unreachable (its leases then stop
// counting as they near expiry, and no new one can be taken).
func (w *Worker) Ready() error {
	if d := w.lease.RedisUnreachable(time.Now()); d >= w.cfg.ReadyAfter {
		return fmt.Errorf("%w for %s", ErrRedisUnreachable, d.Round(time.Second))
	}
	return w.pipeline.Ready()
}

// SinkPaused reports whether the worker paused its sink after a failure
// of a whole request, and since when (pipeline.Pipeline.SinkPaused).
func (w *Worker) SinkPaused() (paused bool, since time.Time) { return w.pipeline.SinkPaused() }

// SinkPausedTotal returns how long the sink has been paused in all.
func (w *Worker) SinkPausedTotal() time.Duration { return w.pipeline.SinkPausedTotal() }

// Lease returns the worker's lease manager.
func (w *Worker) Lease() *lease.Manager { return w.lease }

// Pacer returns the worker's pacer.
func (w *Worker) Pacer() *pacing.Pacer { return w.pacer }

// Pipeline returns the worker's pipeline.
func (w *Worker) Pipeline() *pipeline.Pipeline { return w.pipeline }

// Waiting returns what the worker's pipeline holds that is not done yet,
// by where it waits (pipeline.Pipeline.Waiting).
func (w *Worker) Waiting() pipeline.Waiting { return w.pipeline.Waiting() }

// Counters returns the running totals the worker adds to.
func (w *Worker) Counters() *ingest.Counters { return w.cfg.Counters }
