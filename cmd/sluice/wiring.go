package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/recordtype"
	"github.com/sluicehq/sluice/sink"
)

// settings are the validated flags shared by worker and bulk-load.
type settings struct {
	log        *slog.Logger
	brokers    []string
	redisAddrs []string
	sinkURL    string

	pool      lease.Pool
	reserved  int
	pricing   ingest.Pricing
	processor ingest.Processor                    // the --type's validation and enrichment, then the sink key rule; nil without either
	sinkKeyOf func(ingest.Record) (string, error) // the sink key rule applied to a record; nil without a rule

	topic, group, idField        string
	typeName                     string // the --type, "" without
	slice, guard, requestTimeout time.Duration
	grace                        time.Duration
	batch, concurrency           int
	maxInFlight, maxAttempts     int
}

// readSettings validates the flags and the --type's values; its errors name
// the flag.
func readSettings(c *cli.Context) (settings, error) {
	t, err := oneType(c)
	if err != nil {
		return settings{}, err
	}
	return settingsFor(c, t)
}

// workerSettings reads the settings of each --type a worker serves (one
// settings without --type). With several types each type's pool comes from
// the types file, so the pool and queue flags must not be given; each type
// gets its own consumer group, <group>-<type> when --group is set.
func workerSettings(c *cli.Context) ([]settings, error) {
	types, err := recordTypes(c)
	if err != nil || len(types) < 2 {
		s, err := readSettings(c)
		return []settings{s}, err
	}
	for _, flag := range []string{"topic", "id-field", "pool", "capacity", "unit", "cost", "partitions", "lease-ttl", "reserved-partitions"} {
		if c.IsSet(flag) {
			return nil, fmt.Errorf("--%s: with several --type each type's value comes from %s", flag, c.String("types"))
		}
	}
	out := make([]settings, 0, len(types))
	topics := map[string]string{}
	for _, t := range types {
		if t.PoolSpec == nil {
			return nil, fmt.Errorf("--type %q: pool %q is not defined under \"pools\" in %s (several types need their pools there)", t.Name, t.Pool, c.String("types"))
		}
		if other, dup := topics[t.Topic]; dup {
			return nil, fmt.Errorf("--type: %q and %q share topic %q", other, t.Name, t.Topic)
		}
		topics[t.Topic] = t.Name
		s, err := settingsFor(c, t)
		if err != nil {
			return nil, fmt.Errorf("--type %q: %w", t.Name, err)
		}
		if c.IsSet("group") {
			s.group = c.String("group") + "-" + t.Name
		}
		out = append(out, s)
	}
	return out, nil
}

// settingsFor validates the flags, with t's values for those not given (t
// may be nil); its errors name the flag.
func settingsFor(cc *cli.Context, t *recordtype.Type) (settings, error) {
	c := typedFlags(cc, t)
	log, err := newLogger(cc)
	if err != nil {
		return settings{}, err
	}
	unit, err := ingest.ParseUnit(c.String("unit"))
	if err != nil {
		return settings{}, fmt.Errorf("--unit: %w", err)
	}
	pricing, err := ingest.ParseCost(unit, c.String("cost"))
	if err != nil {
		return settings{}, fmt.Errorf("--cost: %w", err)
	}
	s := settings{
		log:            log,
		brokers:        splitList(c.String("brokers")),
		redisAddrs:     splitList(c.String("redis-addr")),
		sinkURL:        c.String("sink"),
		pool:           lease.Pool{Name: c.String("pool"), Capacity: c.Float64("capacity"), Unit: unit, Partitions: c.Int("partitions"), TTL: c.Duration("lease-ttl")},
		pricing:        pricing,
		topic:          c.String("topic"),
		group:          c.String("group"),
		idField:        c.String("id-field"),
		slice:          c.Duration("slice"),
		guard:          c.Duration("send-guard"),
		requestTimeout: c.Duration("request-timeout"),
		grace:          c.Duration("grace"),
		batch:          c.Int("batch-size"),
		concurrency:    c.Int("concurrency"),
		maxInFlight:    c.Int("max-in-flight"),
		maxAttempts:    c.Int("max-attempts"),
	}
	if s.group == "" {
		s.group = "sluice-" + s.topic
	}
	if t != nil {
		s.processor = t.Processor()
		s.typeName = t.Name
	}
	if template := c.String("sink-key"); template != "" {
		sk, err := recordtype.NewSinkKey(template, c.String("sink-key-strategy"))
		if err != nil {
			return s, fmt.Errorf("--sink-key, --sink-key-strategy: %w", err)
		}
		s.processor = ingest.Chain(s.processor, sk.Processor())
		s.sinkKeyOf = func(rec ingest.Record) (string, error) { return sk.Key(rec.Value) }
	} else if cc.IsSet("sink-key-strategy") {
		return s, errors.New("--sink-key-strategy: needs --sink-key TEMPLATE")
	}
	if s.pool.Ramp, err = readRamp(cc); err != nil {
		return s, err
	}
	s.reserved = c.Int("reserved-partitions")
	if s.reserved < 0 || s.reserved > s.pool.Partitions {
		return s, fmt.Errorf("--reserved-partitions: must be within 0..%d (--partitions), got %d", s.pool.Partitions, s.reserved)
	}
	switch {
	case len(s.brokers) == 0:
		return s, errors.New("--brokers: at least one host:port is required")
	case len(s.redisAddrs) == 0:
		return s, errors.New("--redis-addr: at least one host:port is required")
	case s.topic == "":
		return s, errors.New("--topic: a topic is required")
	case s.pool.Capacity <= 0 || math.IsInf(s.pool.Capacity, 0) || math.IsNaN(s.pool.Capacity):
		return s, fmt.Errorf("--capacity: the pool's capacity in %s/s is required and must be > 0 (got %v)", unit, s.pool.Capacity)
	case s.pool.Partitions < 1:
		return s, fmt.Errorf("--partitions: must be ≥ 1 (got %d)", s.pool.Partitions)
	case s.slice < 10*time.Millisecond:
		return s, fmt.Errorf("--slice: must be ≥ 10ms (got %s)", s.slice)
	case s.batch < 1 || s.concurrency < 1 || s.maxInFlight < 1 || s.maxAttempts < 1:
		return s, errors.New("--batch-size, --concurrency, --max-in-flight and --max-attempts must be ≥ 1")
	}
	if err := sink.CheckURL(s.sinkURL); err != nil {
		return s, err
	}
	return s, nil
}

// readRamp reads --ramp and the --ramp-* flags; a preset's fields are
// overridden by the flags given.
func readRamp(c *cli.Context) (lease.Ramp, error) {
	var r lease.Ramp
	switch preset := c.String("ramp"); preset {
	case "":
	case "gcs":
		r = lease.RampGCS
	case "firestore":
		r = lease.RampFirestore
	default:
		return r, fmt.Errorf("--ramp: unknown preset %q (want gcs or firestore)", preset)
	}
	if c.IsSet("ramp-start") {
		r.Start = c.Float64("ramp-start")
	}
	if c.IsSet("ramp-factor") {
		r.Factor = c.Float64("ramp-factor")
	}
	if c.IsSet("ramp-period") {
		r.Period = c.Duration("ramp-period")
	}
	if r.On() {
		r.IdleReset = c.Duration("ramp-idle-reset")
	}
	return r, nil
}

func redisClients(addrs []string) []redis.UniversalClient {
	out := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		out[i] = redis.NewClient(&redis.Options{Addr: a})
	}
	return out
}

func closeAll(clients []redis.UniversalClient) {
	for _, c := range clients {
		_ = c.Close()
	}
}

// ensurePool stores the pool definition in every Redis master or refuses a
// different one (a usage error).
func ensurePool(ctx context.Context, s settings, clients []redis.UniversalClient) error {
	for _, c := range clients {
		if err := lease.EnsurePool(ctx, c, "", s.pool); err != nil {
			if errors.Is(err, lease.ErrPoolMismatch) || errors.Is(err, lease.ErrInvalidPool) {
				return usageError(err)
			}
			return err
		}
	}
	return nil
}

// shared are the parts several in-process workers use together.
type shared struct {
	sink     ingest.Sink
	dlq      ingest.DeadLetters
	counters *ingest.Counters
	metrics  *metrics.Collector // nil without --metrics-addr
}

// workerStack builds one worker as a separate pod would run it: its own
// consumer, lease manager and pacer. A bulk load's workers take their
// leases at once and fetch once start is closed; a pod's (start nil) lease
// on demand. Stopping it stops fetching, drains,
// commits, then releases the leases.
func workerStack(s settings, clients []redis.UniversalClient, sh shared, workerID string, start <-chan struct{}) (_ ingest.Runner, _ *lease.Manager, err error) {
	log := s.log.With("worker", workerID)
	src, err := queue.NewSource(queue.SourceConfig{Brokers: s.brokers, Topic: s.topic, Group: s.group, MaxWait: 50 * time.Millisecond, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			_ = src.Close() // its reader's goroutines would outlive the command
		}
	}()
	mgr, err := lease.New(lease.Config{
		Pool: s.pool, WorkerID: workerID, RequestTimeout: s.requestTimeout, Slice: s.slice, Logger: log, Reserved: s.reserved,
	}, clients...)
	if err != nil {
		return nil, nil, usageError(err)
	}
	pacer, err := pacing.New(pacing.Config{Slice: s.slice, Guard: s.guard}, mgr)
	if err != nil {
		return nil, nil, usageError(err)
	}
	var observe func(int, time.Duration)
	if sh.metrics != nil {
		sh.metrics.Add(metrics.Worker{Pool: s.pool.Name, Lease: mgr, Pacer: pacer, Lag: src.Lag}, sh.counters)
		observe = sh.metrics.ObserveWrite(s.pool.Name)
	}
	w, err := ingest.NewWorker(ingest.WorkerConfig{
		Pricing:       s.pricing,
		IDField:       s.idField,
		MaxBatch:      s.batch,
		Concurrency:   s.concurrency,
		MaxInFlight:   s.maxInFlight,
		MaxRecordCost: int64(s.pool.Capacity),
		Grace:         s.grace,
		LeaseAhead:    start != nil,
		Start:         start,
		Logger:        log,
		Counters:      sh.counters,
		ObserveWrite:  observe,
		Processor:     s.processor,
	}, ingest.Ports{
		Source:      src,
		DeadLetters: sh.dlq,
		Sink:        sh.sink,
		Retry:       sink.Policy{MaxAttempts: s.maxAttempts},
		Pacer:       pacer,
		Capacity:    mgr,
	})
	if err != nil {
		return nil, nil, err
	}
	stack := ingest.RunFunc(func(ctx context.Context) error { return ingest.RunStack(ctx, w, src, mgr) })
	return stack, mgr, nil
}

// ensureTopics creates the record type's topic with partitions partitions
// and its dead-letter topic with one, unless they exist.
func ensureTopics(ctx context.Context, brokers []string, topic string, partitions int) error {
	for t, parts := range map[string]int{topic: partitions, queue.DeadLetterTopic(topic): 1} {
		if err := queue.EnsureTopic(ctx, brokers, t, parts); err != nil {
			return err
		}
	}
	return nil
}
