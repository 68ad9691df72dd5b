package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// maxThrottleStep caps the attempt number a throttled record's backoff is
// computed for: throttling never uses up attempts, and its waits stop
// growing here (with the default policy, 1.2–1.8 s), or at the sink's
// Retry-After.
const maxThrottleStep = 4

// write makes one attempt at a batch under the request deadline and routes
// every record by its result. answered tells the pacer the answer is in.
func (p *Pipeline) write(ctx context.Context, u *batch, answered func()) {
	recs := make([]ingest.Record, len(u.items))
	for i, it := range u.items {
		recs[i] = it.rec
	}
	p.c.Count(ingest.EventRequests, 1)
	p.c.Count(ingest.EventAttempts, int64(len(recs)))
	began := time.Now()
	wctx, cancel := context.WithTimeout(ctx, p.cfg.RequestTimeout)
	results, err := p.p.Sink.Write(wctx, recs)
	cancel()
	answered()
	took := time.Since(began)
	p.c.NoteLatency(took)
	if p.cfg.ObserveWrite != nil {
		p.cfg.ObserveWrite(len(recs), took)
	}
	if ctx.Err() != nil {
		return // shutting down: the records are redelivered later
	}
	now := time.Now()
	explained := false // every record throttled by a range known to be hot
	if err == nil && len(results) == len(recs) {
		explained = p.ranges.observe(now, began, u.items, results)
	}
	if err == nil && !explained && !p.isolated(u) {
		err = wholeFailure(results, len(recs))
	} else if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no answer within the request timeout (%s): %w", p.cfg.RequestTimeout, err)
	}
	if err != nil {
		p.failed(u, err, now)
		return
	}
	p.breaker.success(now)
	nearLimit := false
	for i, it := range u.items {
		p.route(it, results[i], now)
		nearLimit = nearLimit || results[i].NearLimit
	}
	if nearLimit {
		// The sink's own rate limit is nearly used up: the worker as a
		// whole slows down. A throttled record slows only its key range.
		p.throttleFeedback()
	}
}

// maxAmbiguous is how many times a batch whose every record came back
// Retryable is taken for a sink-wide failure before its records' attempts
// start to count (see isolated).
const maxAmbiguous = 5

// isolated reports whether an answer with every record Retryable is about
// u's records rather than the sink: another request succeeded since u was
// sent (the sink works), or each of its records has been answered so
// maxAmbiguous times (a poison record at the end of the queue).
func (p *Pipeline) isolated(u *batch) bool {
	if p.breaker.successes() > u.epoch {
		return true
	}
	for _, it := range u.items {
		if it.ambiguous < maxAmbiguous {
			return false
		}
	}
	return true
}

// wholeFailure returns the error of an answer that is a failure of the
// whole request although Write returned no error: results that do not
// match the batch, or every record Retryable (an outage or throttling
// answered record by record).
func wholeFailure(results []ingest.Result, n int) error {
	if len(results) != n {
		return fmt.Errorf("sink: answer not understood: %d results for %d records", len(results), n)
	}
	se := &ingest.SinkError{Throttled: true}
	for _, r := range results {
		if r.Outcome != ingest.Retryable {
			return nil
		}
		se.Throttled = se.Throttled && r.Throttled
		se.RetryAfter = max(se.RetryAfter, r.RetryAfter)
	}
	if n == 0 {
		return nil
	}
	se.Err = errors.New(results[0].Reason)
	return &ambiguousError{se}
}

// ambiguousError is a failure of a whole request that the pipeline inferred
// from an answer with every record Retryable, which the sink did not say.
type ambiguousError struct{ *ingest.SinkError }

func (e *ambiguousError) Unwrap() error { return e.SinkError }

// failed handles a write that failed as a whole: the sink is paused and
// the batch is kept, whole, for the probe that ends the pause. No record's
// attempts are used up.
func (p *Pipeline) failed(u *batch, err error, now time.Time) {
	p.c.Count(ingest.EventFailedWrites, 1)
	if ae := (*ambiguousError)(nil); errors.As(err, &ae) {
		for _, it := range u.items {
			it.ambiguous++
		}
	}
	if se := (*ingest.SinkError)(nil); errors.As(err, &se) && se.Throttled {
		p.c.Count(ingest.EventThrottled, int64(len(u.items)))
		p.throttleFeedback()
	}
	u.due, u.keep = p.breaker.failure(now, err), true
	p.pushRetry(u)
}

// route acts on one record's result. A throttled record waits in its key
// range (see keyRanges), or, when its key is in none, for a backoff.
func (p *Pipeline) route(it *item, res ingest.Result, now time.Time) {
	switch res.Outcome {
	case ingest.Delivered, ingest.Duplicate:
		if res.Charge > 0 {
			p.charges.observe(it.base, res.Charge)
		}
		if res.Charge > it.rec.Cost {
			p.owed.Add(res.Charge - it.rec.Cost)
		}
		if res.Outcome == ingest.Duplicate {
			p.c.Count(ingest.EventDuplicates, 1)
		} else {
			p.c.Count(ingest.EventDelivered, 1)
			p.c.Count(ingest.EventUnitsDelivered, it.rec.Cost)
		}
		p.finish(it, now)
	case ingest.Retryable:
		if res.Throttled {
			p.c.Count(ingest.EventThrottled, 1)
			it.throttles++
			if p.ranges.requeue(now, it, res.RetryAfter) {
				p.c.Count(ingest.EventRetried, 1)
				return
			}
			wait, _ := p.p.Retry.Backoff(min(it.throttles, maxThrottleStep), res.RetryAfter)
			p.retryItem(it, now.Add(wait))
			return
		}
		p.c.Count(ingest.EventRetryable, 1)
		it.attempts++
		wait, ok := p.p.Retry.Backoff(it.attempts, res.RetryAfter)
		if !ok {
			p.deadLetter(it, fmt.Sprintf("%s: gave up after %d attempts: %s", describe(it.rec), it.attempts, res.Reason))
			return
		}
		p.retryItem(it, now.Add(wait))
	default:
		p.c.Count(ingest.EventPermanent, 1)
		p.deadLetter(it, fmt.Sprintf("%s: %s", describe(it.rec), res.Reason))
	}
}

// retryItem schedules one record for another attempt at due.
func (p *Pipeline) retryItem(it *item, due time.Time) {
	p.c.Count(ingest.EventRetried, 1)
	u := newBatch([]*item{it})
	u.due = due
	p.pushRetry(u)
}

// throttleFeedback tells the pacer the sink throttled although the worker
// kept to its leases.
func (p *Pipeline) throttleFeedback() {
	if fb, ok := p.p.Pacer.(ingest.ThrottleFeedback); ok {
		fb.Throttled()
	}
}
