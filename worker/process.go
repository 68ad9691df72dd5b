package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sink"
)

// connectTimeout bounds each start-up check of a service: the brokers
// answering, a Redis quorum answering with the credentials given.
const connectTimeout = 10 * time.Second

// Job is one record type a process drains: the Config its workers are
// built from, where its records go, and how many workers drain it here.
type Job struct {
	// Config is the workers' configuration. Start fills in Redis, Sink,
	// DeadLetters and Metrics, and Pool with the definition in force
	// (see Setup).
	Config Config
	// SinkURL and Sink say where the records go (sink.Open); jobs with the
	// same URL share one opened sink.
	SinkURL string
	Sink    sink.OpenConfig
	// Workers is how many workers drain the topic in this process; 0
	// builds none (a bulk load that only produces, for pods to drain).
	Workers int
	// TopicPartitions is how many partitions the topic gets when Start
	// creates it; at least Workers, so that every worker has one.
	TopicPartitions int
	// WorkerID names worker i; nil: Config.WorkerID for every worker
	// (its default, a random ID, when that is empty too).
	WorkerID func(i int) string
}

// Setup is what Start builds a process from.
type Setup struct {
	// Redis says how to reach the Redis masters holding the pools.
	Redis lease.RedisConfig
	// Jobs are the record types the process drains, at least one. They
	// share the first job's Brokers and Kafka setup.
	Jobs []Job
	// DeadLetterCopy, when set, receives every dead letter too, after the
	// dead-letter topic has it (bulk-load's file of dead letters).
	DeadLetterCopy ingest.DeadLetters
	// Preflight checks, before any worker is built, that each sink answers
	// within its job's request timeout, opening the connections the
	// workers will use (bulk loads produce only once the sink works).
	Preflight bool
	// DryRun checks the setup the way Start brings it up, without
	// changing anything: the brokers and a Redis quorum answer, each
	// job's pool agrees with the definition stored in Redis (none is
	// stored), its topic exists or would be created (none is), each sink
	// opens and answers its preflight (nothing is written); no
	// dead-letter writer and no worker is built. Process.Plans says what
	// a run would do.
	DryRun bool
	// Definition says what to do when a job's pool is defined differently
	// in Redis (lease.DefinitionMode). Default lease.DefinitionAdopt.
	Definition lease.DefinitionMode
	// Metrics, when set, reports every worker to Prometheus.
	Metrics *metrics.Collector
	// Logger receives the start-up's and the workers' logs. Default:
	// slog.Default().
	Logger *slog.Logger
}

// Process is what a sluice process shares between its workers — the Redis
// clients, the Kafka admin, the dead-letter writer, one sink per URL — and
// the workers built on them. Start builds it; Close releases it.
type Process struct {
	// Redis are the clients of the Redis masters holding the pools.
	Redis []redis.UniversalClient
	// Admin reads and creates topics and reads consumer groups.
	Admin queue.Admin
	// Jobs are the jobs as they run: each Config with the pool definition
	// in force and the shared parts filled in.
	Jobs []Job
	// Workers are each job's workers, in the order of Jobs.
	Workers [][]*Worker
	// DeadLetters stores what the workers dead-letter: the dead-letter
	// topic, and Setup.DeadLetterCopy when set.
	DeadLetters ingest.DeadLetters
	// Plans are, after a dry run, what a run would do with each job.
	Plans []Plan

	log     *slog.Logger
	letters *queue.DeadLetterWriter
	sinks   map[string]sink.Opened
}

// Plan is what a dry run found for a job.
type Plan struct {
	// PoolStored says Redis holds the pool's definition (Job.Config.Pool
	// is the one in force); false: a run would store it.
	PoolStored bool
	// TopicPartitions is how many partitions the topic has; 0: a run
	// would create it with CreatePartitions.
	TopicPartitions, CreatePartitions int
}

// Start brings a process up in the order its parts depend on each other:
// the brokers answer; a quorum of Redis masters answers; each job's sink
// is opened (and, with Preflight, answers); its pool definition is stored,
// or the stored one adopted or changed live as Setup.Definition says (a
// pool whose capacity comes from the sink is defined with what the sink
// says); the topics and their dead-letter topics exist; the dead-letter
// writer is ready; the workers are built, with a capacity controller
// beside the first worker of each job whose pool has a capacity source. Errors about the
// setup (an invalid Redis or pool setting, a pool defined differently in
// Redis) wrap ErrConfig, lease.ErrInvalidConfig, lease.ErrInvalidPool or
// lease.ErrPoolMismatch; others say which service failed. On an error
// everything built so far is released.
func Start(ctx context.Context, s Setup) (_ *Process, err error) {
	if len(s.Jobs) == 0 {
		return nil, &ConfigError{Field: "Jobs", Err: errors.New("at least one job is required")}
	}
	p := &Process{log: cmp.Or(s.Logger, slog.Default()), sinks: map[string]sink.Opened{}}
	defer func() {
		if err != nil {
			_ = p.Close()
		}
	}()
	first := s.Jobs[0].Config
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	err = queue.Check(cctx, first.Brokers, first.Kafka)
	cancel()
	if err != nil {
		return nil, err
	}
	if p.Redis, err = lease.Connect(ctx, s.Redis, p.log); err != nil {
		return nil, err
	}
	p.Admin = queue.Admin{Brokers: first.Brokers, Conn: first.Kafka}
	if s.DryRun {
		return p, p.check(ctx, s.Jobs, cmp.Or(s.Definition, lease.DefinitionAdopt))
	}
	for _, job := range s.Jobs {
		// The sink first: a pool whose capacity comes from the sink is
		// defined with what it says.
		if err := p.openSink(ctx, job, s.Preflight); err != nil {
			return nil, err
		}
		if job.Config.Pool, err = p.ensurePool(ctx, job, cmp.Or(s.Definition, lease.DefinitionAdopt)); err != nil {
			return nil, err
		}
		if err := p.Admin.EnsureTopics(ctx, job.Config.Topic, max(job.TopicPartitions, job.Workers, 1)); err != nil {
			return nil, err
		}
		p.Jobs = append(p.Jobs, job)
	}
	letters := make([]string, len(p.Jobs))
	for i, job := range p.Jobs {
		letters[i] = queue.DeadLetterTopic(job.Config.Topic)
	}
	if p.letters, err = queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: first.Brokers, Conn: first.Kafka, Topics: letters, Logger: p.log}); err != nil {
		return nil, err
	}
	p.DeadLetters = p.letters
	if s.DeadLetterCopy != nil {
		p.DeadLetters = teeDeadLetters{p.letters, s.DeadLetterCopy}
	}
	for i := range p.Jobs {
		job := &p.Jobs[i]
		job.Config.Logger = cmp.Or(job.Config.Logger, p.log)
		cfg := &job.Config
		cfg.Redis, cfg.Sink, cfg.DeadLetters, cfg.Metrics = p.Redis, p.sinks[job.SinkURL], p.DeadLetters, s.Metrics
		cfg.Logger = cmp.Or(cfg.Logger, p.log)
		var built []*Worker
		for n := range job.Workers {
			wc := *cfg
			if job.WorkerID != nil {
				wc.WorkerID = job.WorkerID(n)
			}
			w, err := New(wc)
			if err != nil {
				return nil, err
			}
			built = append(built, w)
		}
		p.Workers = append(p.Workers, built)
		if err := p.attachController(job, built, s.Metrics); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// check is Start's dry run: each job's pool, topic and sink as Start
// would find them, nothing stored, created or written.
func (p *Process) check(ctx context.Context, jobs []Job, mode lease.DefinitionMode) error {
	for _, job := range jobs {
		var plan Plan
		for _, c := range p.Redis {
			pool, stored, err := lease.CheckPool(ctx, c, "", job.Config.Pool, mode)
			if err != nil {
				return err
			}
			job.Config.Pool, plan.PoolStored = pool, plan.PoolStored || stored
		}
		ends, err := p.Admin.EndOffsets(ctx, job.Config.Topic)
		switch {
		case errors.Is(err, queue.ErrUnknownTopic):
			plan.CreatePartitions = max(job.TopicPartitions, job.Workers, 1)
		case err != nil:
			return err
		default:
			plan.TopicPartitions = len(ends)
		}
		if err := p.openSink(ctx, job, true); err != nil {
			return err
		}
		p.Jobs, p.Plans = append(p.Jobs, job), append(p.Plans, plan)
	}
	return nil
}

// ensurePool defines job's pool in every Redis master (lease.DefinePool)
// and returns the definition in force, saying what it did. A pool whose
// capacity comes from the sink is defined with the sink's reading (its
// floor, or 1 unit/s, while a REST API has not answered yet); a probe
// starts at its floor. With lease.DefinitionApply a pending live change is
// waited for (at most a lease TTL) and the definition applied after it.
func (p *Process) ensurePool(ctx context.Context, job Job, mode lease.DefinitionMode) (lease.Pool, error) {
	pool := job.Config.Pool
	switch pool.Source.Kind {
	case lease.SourceSink:
		reader, ok := p.sinks[job.SinkURL].(lease.CapacityReader)
		if !ok {
			return pool, &ConfigError{Field: "Pool.Source", Err: fmt.Errorf("sink %s cannot tell its capacity: give a number or probe", sink.Redact(job.SinkURL))}
		}
		rctx, cancel := context.WithTimeout(ctx, connectTimeout)
		v, from, err := reader.SinkCapacity(rctx)
		cancel()
		if err != nil {
			return pool, fmt.Errorf("read the capacity of sink %s: %w", sink.Redact(job.SinkURL), err)
		}
		pool.Capacity, pool.From = max(pool.Source.Floor, 1), ""
		if v > 0 {
			pool.Capacity, pool.From = v, from
			if pool.Source.Ceiling > 0 {
				pool.Capacity = min(pool.Capacity, pool.Source.Ceiling)
			}
			pool.Capacity = max(pool.Capacity, pool.Source.Floor)
		}
	case lease.SourceProbe:
		pool.Capacity = pool.Source.Floor
		if pool.Capacity == 0 {
			pool.Capacity = lease.DefaultProbeFloor
		}
	}
	by := job.Config.WorkerID
	if by == "" && job.WorkerID != nil {
		by = job.WorkerID(0)
	}
	if by == "" {
		by, _ = os.Hostname()
	}
	lead := max(cmp.Or(pool.TTL, lease.DefaultTTL)/3, time.Second)
	given := pool
	for _, c := range p.Redis {
		var (
			stored  lease.Pool
			outcome lease.Defined
			err     error
		)
		for deadline := time.Now().Add(cmp.Or(pool.TTL, lease.DefaultTTL)); ; {
			stored, outcome, err = lease.DefinePool(ctx, c, "", given, mode, by, lead, time.Now())
			if !errors.Is(err, lease.ErrSwitchPending) || time.Now().After(deadline) {
				break
			}
			select { // an earlier change switches within its lead
			case <-ctx.Done():
				return pool, context.Cause(ctx)
			case <-time.After(100 * time.Millisecond):
			}
		}
		if err != nil {
			return pool, err
		}
		switch outcome {
		case lease.Adopted:
			p.log.Info("pool defined differently in Redis; running with the stored definition",
				"pool", stored.Name, "stored", stored.String(), "given", given.String())
		case lease.Applied:
			attrs := []any{"pool", stored.Name, "definition", stored.String()}
			if sw := stored.Switch; sw != nil {
				attrs = append(attrs, "switch_at", sw.At, "capacity_before", sw.Capacity, "partitions_before", sw.Partitions)
			}
			p.log.Info("pool definition applied as a live change", attrs...)
		}
		pool = stored
	}
	return pool, nil
}

// attachController runs the capacity controller of a job whose pool's
// capacity comes from a source beside its first worker.
func (p *Process) attachController(job *Job, built []*Worker, col *metrics.Collector) error {
	pool := job.Config.Pool
	if !pool.Source.On() || len(built) == 0 {
		return nil
	}
	var reader lease.CapacityReader
	if pool.Source.Kind == lease.SourceSink {
		r, ok := p.sinks[job.SinkURL].(lease.CapacityReader)
		if !ok {
			return &ConfigError{Field: "Pool.Source", Err: fmt.Errorf("sink %s cannot tell its capacity: give a number or probe", sink.Redact(job.SinkURL))}
		}
		reader = r
	}
	ctrl, err := NewController(pool, p.Redis, reader, job.Config.Logger, built...)
	if err != nil {
		return err
	}
	built[0].Attach(ctrl)
	if col != nil && pool.Source.Kind == lease.SourceSink {
		col.AddCapacityReads(pool.Name, ctrl.ReadFailures)
	}
	return nil
}

// openSink opens job's sink unless a job before it uses the same URL and,
// with preflight, checks that it answers.
func (p *Process) openSink(ctx context.Context, job Job, preflight bool) error {
	if p.sinks[job.SinkURL] != nil {
		return nil
	}
	opened, err := sink.Open(ctx, job.SinkURL, job.Sink)
	if err != nil {
		return err
	}
	if sink.RESTUnseenID(job.SinkURL, job.Sink.REST, job.Config.IDField) {
		p.log.Warn("the REST API never sees a record's ID, so it cannot tell a record it has already: a rerun or a redelivery stores it again",
			"sink", sink.Redact(job.SinkURL), "fix", sink.RESTUnseenIDFix)
	}
	p.sinks[job.SinkURL] = opened
	w, ok := opened.(ingest.Warmer)
	if !preflight || !ok {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, cmp.Or(job.Config.RequestTimeout, ingest.DefaultRequestTimeout))
	defer cancel()
	if err := w.Warm(wctx, max(job.Config.Concurrency, 1)); err != nil {
		return fmt.Errorf("sink %s: %w", sink.Redact(job.SinkURL), err)
	}
	return nil
}

// Sink returns the opened sink of job i.
func (p *Process) Sink(i int) ingest.Sink { return p.sinks[p.Jobs[i].SinkURL] }

// SinkError returns the latest failure of a whole write to job i's sink
// among its workers (a transport error, a throttle, a 5xx), "" before any:
// why a paused sink is paused.
func (p *Process) SinkError(i int) string {
	for _, w := range p.Workers[i] {
		if paused, _ := w.SinkPaused(); paused {
			return w.pipeline.SinkError()
		}
	}
	return ""
}

// All returns every worker of every job.
func (p *Process) All() []*Worker {
	var all []*Worker
	for _, ws := range p.Workers {
		all = append(all, ws...)
	}
	return all
}

// Ready returns nil while every worker can make progress and the brokers
// answer; else the first failure.
func (p *Process) Ready(ctx context.Context) error {
	for _, w := range p.All() {
		if err := w.Ready(); err != nil {
			return err
		}
	}
	return p.Admin.Ping(ctx)
}

// Run runs every worker until ctx is done or one of them gives up, and
// returns their errors joined (see Worker.Run).
func (p *Process) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, w := range p.All() {
		g.Go(func() error { return w.Run(ctx) })
	}
	return g.Wait()
}

// Close releases what Start built: the workers that did not run, the
// sinks, the dead-letter writer and the Redis clients.
func (p *Process) Close() error {
	var errs []error
	for _, w := range p.All() {
		errs = append(errs, w.Close())
	}
	for _, s := range p.sinks {
		errs = append(errs, s.Close())
	}
	if p.letters != nil {
		errs = append(errs, p.letters.Close())
	}
	p.Admin.Close()
	for _, c := range p.Redis {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// teeDeadLetters stores every dead letter in each of its stores, in order;
// it fails when one fails (the pipeline then writes them all again, so a
// letter may be in a store twice, never in none).
type teeDeadLetters []ingest.DeadLetters

func (t teeDeadLetters) DeadLetter(ctx context.Context, letters ...ingest.DeadLetter) error {
	for _, d := range t {
		if err := d.DeadLetter(ctx, letters...); err != nil {
			return err
		}
	}
	return nil
}
