package bench

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sink"
)

// The pipeline settings of `sluice worker`'s defaults (cmd/sluice flags).
const (
	slice          = 200 * time.Millisecond
	sendGuard      = 20 * time.Millisecond
	requestTimeout = 2 * time.Second
	batchSize      = 100
	concurrency    = 16
)

// sluiceWorker is one sluice worker stack wired as cmd/sluice wires a pod:
// its own consumer (queue.Source), Redis client, lease manager and pacer,
// the ingest.Worker pipeline, and an HTTP sink to the emulator.
type sluiceWorker struct {
	id       string
	target   int64 // records to finish before the job is done
	mgr      *lease.Manager
	counters *ingest.Counters
	tally    *tally
	probe    *redisProbe
	client   *redis.Client
	stack    ingest.Runner
}

// workerSpec is one worker's backlog: its topic and consumer group, and how
// many records it must finish.
type workerSpec struct {
	topic, group string
	records      int64
	processor    ingest.Processor // e.g. a sink key rule; nil: none
}

// newSluiceWorker builds a worker. With start set the worker leases ahead
// and fetches once start is closed (as bulk-load's in-process workers do);
// otherwise it leases on demand (as a `sluice worker` pod does).
func (e *env) newSluiceWorker(ctx context.Context, spec workerSpec, pool lease.Pool, pricing ingest.Pricing, sinkURL string, epoch time.Time, start <-chan struct{}) (*sluiceWorker, error) {
	probe := new(redisProbe)
	client := e.redisClient(probe)
	if err := lease.EnsurePool(ctx, client, "", pool); err != nil {
		_ = client.Close()
		return nil, err
	}
	id := e.name("w")
	log := e.log.With("worker", id)
	src, err := queue.NewSource(queue.SourceConfig{Brokers: e.brokers, Topic: spec.topic, Group: spec.group, MaxWait: 50 * time.Millisecond, Logger: log})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	mgr, err := lease.New(lease.Config{Pool: pool, WorkerID: id, RequestTimeout: requestTimeout, Slice: slice, Logger: log}, client)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	pacer, err := pacing.New(pacing.Config{Slice: slice, Guard: sendGuard}, mgr)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	httpSink, err := sink.NewHTTP(sink.HTTPConfig{URL: sinkURL, Timeout: requestTimeout})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	dlq, err := e.deadLetters()
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	t := newTally(httpSink, epoch)
	counters := new(ingest.Counters)
	w, err := ingest.NewWorker(ingest.WorkerConfig{
		Pricing:       pricing,
		IDField:       "id",
		MaxBatch:      batchSize,
		Concurrency:   concurrency,
		MaxInFlight:   10_000,
		MaxRecordCost: int64(pool.Capacity),
		Grace:         10 * time.Second,
		LeaseAhead:    start != nil,
		Start:         start,
		Logger:        log,
		Counters:      counters,
		Processor:     spec.processor,
	}, ingest.Ports{
		Source:      src,
		DeadLetters: dlq,
		Sink:        t,
		Retry:       sink.Policy{MaxAttempts: 8},
		Pacer:       pacer,
		Capacity:    mgr,
	})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &sluiceWorker{
		id: id, target: spec.records, mgr: mgr, counters: counters, tally: t, probe: probe, client: client,
		stack: ingest.RunFunc(func(ctx context.Context) error { return ingest.RunStack(ctx, w, src, mgr) }),
	}, nil
}

func (w *sluiceWorker) run(ctx context.Context) error {
	defer w.client.Close()
	return w.stack.Run(ctx)
}

func (w *sluiceWorker) progress() progress {
	t := w.counters.Totals()
	return progress{finished: t.Finished(), attempts: t.Attempts, throttled: t.Throttled, requests: t.Requests, first: t.FirstFetch, last: t.LastDone}
}

func (w *sluiceWorker) redis() *redisProbe { return w.probe }
func (w *sluiceWorker) timeline() *tally   { return w.tally }
func (w *sluiceWorker) goal() int64        { return w.target }
