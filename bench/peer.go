package bench

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sink"
)

// peer is an alternative to sluice that consumes the same topic with the
// same queue.Source (so commits are as safe) and writes with the same
// sink.HTTPSink, batch size and concurrency, but paces with admit instead
// of leases: nothing (naive), a local token bucket (static) or a Redis GCRA
// limiter (gcra). Rejected records are retried with the project's retry
// policy (exponential backoff with jitter, Retry-After honoured); every
// retry is admitted again, as sluice charges every attempt.
type peer struct {
	target  int64
	src     *queue.Source
	sink    ingest.Sink
	tally   *tally
	pricing ingest.Pricing
	admit   func(ctx context.Context, units int64) error // nil: no limit
	retry   sink.Policy
	probe   *redisProbe   // gcra only
	client  *redis.Client // gcra only

	finished, attempts, throttled, requests atomic.Int64
	first, last                             atomic.Int64 // unix ns
}

// newPeer builds a peer on spec's topic and group.
func (e *env) newPeer(spec workerSpec, pricing ingest.Pricing, sinkURL string, epoch time.Time, admit func(context.Context, int64) error) (*peer, error) {
	src, err := queue.NewSource(queue.SourceConfig{Brokers: e.brokers, Topic: spec.topic, Group: spec.group, MaxWait: 50 * time.Millisecond, Logger: e.log})
	if err != nil {
		return nil, err
	}
	httpSink, err := sink.NewHTTP(sink.HTTPConfig{URL: sinkURL, Timeout: requestTimeout})
	if err != nil {
		_ = src.Close()
		return nil, err
	}
	t := newTally(httpSink, epoch)
	return &peer{target: spec.records, src: src, sink: t, tally: t, pricing: pricing, admit: admit,
		retry: sink.Policy{MaxAttempts: 1000}}, nil
}

func (p *peer) run(ctx context.Context) error {
	if p.client != nil {
		defer p.client.Close()
	}
	return ingest.RunStack(ctx, ingest.RunFunc(p.loop), p.src)
}

// loop fetches batches, admits them and writes them, concurrency at a
// time, until ctx is done.
func (p *peer) loop(ctx context.Context) error {
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		batch, err := p.fill(ctx)
		if err != nil {
			return nil // ctx is done
		}
		if err := p.admitBatch(ctx, batch); err != nil {
			return nil
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		wg.Go(func() {
			defer func() { <-sem }()
			p.write(ctx, batch)
		})
	}
}

// fill fetches one record, waiting as long as it takes, then up to a full
// batch of those that arrive within 5 ms.
func (p *peer) fill(ctx context.Context) ([]ingest.Record, error) {
	rec, err := p.src.Fetch(ctx)
	if err != nil {
		return nil, err
	}
	p.first.CompareAndSwap(0, time.Now().UnixNano())
	batch := []ingest.Record{p.priced(rec)}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	for len(batch) < batchSize {
		rec, err := p.src.Fetch(fctx)
		if err != nil {
			break
		}
		batch = append(batch, p.priced(rec))
	}
	return batch, nil
}

func (p *peer) priced(rec ingest.Record) ingest.Record {
	if rec.ID == "" {
		rec.ID, _ = ingest.RecordID(rec.Value, "id")
	}
	rec.Cost = p.pricing.Price(rec.Value)
	return rec
}

func (p *peer) admitBatch(ctx context.Context, batch []ingest.Record) error {
	if p.admit == nil {
		return ctx.Err()
	}
	var units int64
	for _, r := range batch {
		units += r.Cost
	}
	return p.admit(ctx, units)
}

// write writes batch until every record is finished, retrying the
// rejected ones after the policy's backoff.
func (p *peer) write(ctx context.Context, batch []ingest.Record) {
	pending := batch
	for attempt := 1; ; attempt++ {
		p.requests.Add(1)
		p.attempts.Add(int64(len(pending)))
		res, err := p.sink.Write(ctx, pending)
		var again []ingest.Record
		var retryAfter time.Duration
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			again = pending
		} else {
			for i, r := range res {
				switch r.Outcome {
				case ingest.Retryable:
					again = append(again, pending[i])
					retryAfter = max(retryAfter, r.RetryAfter)
					if r.Throttled {
						p.throttled.Add(1)
					}
				default:
					p.done(pending[i])
				}
			}
		}
		if len(again) == 0 {
			return
		}
		wait, _ := p.retry.Backoff(attempt, retryAfter)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if p.admitBatch(ctx, again) != nil {
			return
		}
		pending = again
	}
}

func (p *peer) done(rec ingest.Record) {
	p.src.Done(rec)
	p.finished.Add(1)
	now := time.Now().UnixNano()
	for {
		old := p.last.Load()
		if old >= now || p.last.CompareAndSwap(old, now) {
			return
		}
	}
}

func (p *peer) progress() progress {
	return progress{finished: p.finished.Load(), attempts: p.attempts.Load(), throttled: p.throttled.Load(),
		requests: p.requests.Load(), first: unixTime(p.first.Load()), last: unixTime(p.last.Load())}
}

func (p *peer) redis() *redisProbe { return p.probe }
func (p *peer) timeline() *tally   { return p.tally }
func (p *peer) goal() int64        { return p.target }

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
