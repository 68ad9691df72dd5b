package bench

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/worker"
)

// The pipeline settings the peers share with sluice's defaults, so the
// alternatives run with the same slice, batch and concurrency.
const (
	slice          = ingest.DefaultSlice
	requestTimeout = ingest.DefaultRequestTimeout
	batchSize      = ingest.DefaultMaxBatch
	concurrency    = ingest.DefaultConcurrency
)

// sluiceWorker is one sluice worker built by worker.New as `sluice worker`
// builds a pod, with the defaults of the CLI, its own Redis client, and an
// HTTP sink to the emulator wrapped in a tally.
type sluiceWorker struct {
	group  string // its consumer group
	target int64  // records to finish before the job is done
	w      *worker.Worker
	tally  *tally
	probe  *redisProbe
	client *redis.Client
}

// workerSpec is one worker's backlog: its topic and consumer group, and how
// many records it must finish.
type workerSpec struct {
	topic, group string
	records      int64
	processor    ingest.Processor // e.g. a sink key rule; nil: none
	sink         ingest.Sink      // instead of the emulator over HTTP; nil: the emulator
	priority     lease.Priority   // the worker's class in the pool; default normal
}

// newSluiceWorker builds a worker. With start set the worker leases ahead
// and fetches once start is closed (as bulk-load's in-process workers do);
// otherwise it leases on demand (as a `sluice worker` pod does).
func (e *env) newSluiceWorker(ctx context.Context, spec workerSpec, pool lease.Pool, pricing ingest.Pricing, sinkURL string, epoch time.Time, start <-chan struct{}) (_ *sluiceWorker, err error) {
	probe := new(redisProbe)
	client := e.redisClient(probe)
	defer func() {
		if err != nil {
			_ = client.Close()
		}
	}()
	if _, err := lease.EnsurePool(ctx, client, "", pool); err != nil {
		return nil, err
	}
	var target ingest.Sink = spec.sink
	if target == nil {
		if target, err = sink.NewHTTP(sink.HTTPConfig{URL: sinkURL, Timeout: requestTimeout}); err != nil {
			return nil, err
		}
	}
	dlq, err := e.deadLetters()
	if err != nil {
		return nil, err
	}
	t := newTally(target, epoch)
	w, err := worker.New(worker.Config{
		Brokers:     e.brokers,
		Topic:       spec.topic,
		Group:       spec.group,
		Redis:       []redis.UniversalClient{client},
		Pool:        pool,
		Priority:    spec.priority,
		WorkerID:    e.name("w"),
		Pricing:     pricing,
		IDField:     "id",
		Processor:   spec.processor,
		LeaseAhead:  start != nil,
		Start:       start,
		Sink:        t,
		DeadLetters: dlq,
		Logger:      e.log,
	})
	if err != nil {
		return nil, err
	}
	if pool.Source.On() { // each worker as its own process: its own controller
		ctrl, err := worker.NewController(pool, []redis.UniversalClient{client}, nil, e.log, w)
		if err != nil {
			return nil, err
		}
		w.Attach(ctrl)
	}
	return &sluiceWorker{group: spec.group, target: spec.records, w: w, tally: t, probe: probe, client: client}, nil
}

func (w *sluiceWorker) run(ctx context.Context) error {
	defer w.client.Close()
	return w.w.Run(ctx)
}

func (w *sluiceWorker) progress() progress {
	t := w.w.Counters().Totals()
	return progress{finished: t.Finished(), attempts: t.Attempts, throttled: t.Throttled, requests: t.Requests, first: t.FirstFetch, last: t.LastDone,
		guardMin: t.GuardMin, guardFinal: t.GuardFinal}
}

func (w *sluiceWorker) redis() *redisProbe { return w.probe }
func (w *sluiceWorker) timeline() *tally   { return w.tally }
func (w *sluiceWorker) goal() int64        { return w.target }
