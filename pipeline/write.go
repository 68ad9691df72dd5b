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
	explained, refused := false, false // see keyRanges.observe
	if err == nil && len(results) == len(recs) {
		explained, refused = p.ranges.observe(now, began, u.items, results)
	}
	switch {
	case err == nil && refused:
		p.refused(u, results, now)
		return
	case err == nil && !explained && !p.isolated(u):
		err = wholeFailure(results, len(recs))
	case errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("no answer within the request timeout (%s): %w", p.cfg.RequestTimeout, err)
	}
	if err != nil {
		p.failed(u, err, now)
		return
	}
	if judged(results) {
		p.breaker.success(now, true)
		p.acquit(now)
	} else {
		p.breaker.success(now, false)
	}
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

// judged reports whether the sink gave a verdict on a record of an
// answer (stored, a duplicate, refused for good): it works, whatever it
// said of the others.
func judged(results []ingest.Result) bool {
	for _, r := range results {
		if r.Outcome != ingest.Retryable {
			return true
		}
	}
	return false
}

// refused handles an answer whose throttles are the sink's as a whole, not
// a key range's (keyRanges.observe): the records it judged are routed, the
// throttled ones wait, their attempts untouched, for the probe that ends a
// pause of the sink, which is paused as for any failure of a whole request
// (a Retry-After capped at MaxRetryAfter, probes, readiness, the stall
// timeout).
func (p *Pipeline) refused(u *batch, results []ingest.Result, now time.Time) {
	p.c.Count(ingest.EventFailedWrites, 1)
	se := &ingest.SinkError{Throttled: true}
	var waiting []*item
	for i, it := range u.items {
		res := results[i]
		if res.Outcome != ingest.Retryable || !res.Throttled {
			p.route(it, res, now)
			continue
		}
		p.c.Count(ingest.EventThrottled, 1)
		se.RetryAfter = max(se.RetryAfter, res.RetryAfter)
		if se.Err == nil {
			se.Err = fmt.Errorf("every key throttled: %s", res.Reason)
		}
		waiting = append(waiting, it)
	}
	due, _ := p.pause(now, se)
	for _, it := range waiting {
		p.c.Count(ingest.EventRetried, 1)
		b := newBatch([]*item{it})
		b.due = due
		p.pushRetry(b)
	}
}

// isolated reports whether an answer with every record Retryable is about
// u's records rather than the sink: another request was answered with a
// verdict since u was sent, so the sink works. Without that evidence the
// answer is taken for a failure of the sink, however often it comes: a
// record's attempts are never used up by an outage.
func (p *Pipeline) isolated(u *batch) bool {
	return p.breaker.successes() > u.epoch
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
// the batch is kept, whole, for the probe that ends the pause (its
// idempotency key stays the same). An answer with every record Retryable
// said that none was stored: its records wait one by one instead, so that
// the probe mixes them with others, and a record the sink keeps refusing
// is told apart from an outage once another is stored. No record's
// attempts are used up.
func (p *Pipeline) failed(u *batch, err error, now time.Time) {
	p.c.Count(ingest.EventFailedWrites, 1)
	if se := (*ingest.SinkError)(nil); errors.As(err, &se) && se.Throttled {
		p.c.Count(ingest.EventThrottled, int64(len(u.items)))
	}
	due, first := p.pause(now, err)
	if ae := (*ambiguousError)(nil); errors.As(err, &ae) {
		p.suspect(u.items, first, ae.Error())
		return
	}
	u.due, u.keep = due, true
	p.pushRetry(u)
}

// pause pauses the sink after err, a failure of a whole write
// (breaker.failure), and returns when the probe may go and whether the
// pause starts here. A throttle cuts the pacer's throttle ceiling when it
// starts the pause, not again for each probe the sink refuses: those cuts
// would compound over a long throttle (0.7 ^ 8 after 240 s of probes every
// 30 s), and the load would climb back from nearly nothing for 10 s once
// the sink takes writes again.
func (p *Pipeline) pause(now time.Time, err error) (due time.Time, first bool) {
	due, first = p.breaker.failure(now, err)
	if se := (*ingest.SinkError)(nil); first && errors.As(err, &se) && se.Throttled {
		p.throttleFeedback()
	}
	return due, first
}

// suspect is a record of an answer with every record Retryable: the sink
// may be down, or refuse this record alone. It waits for evidence: the
// next answer with a verdict on another record shows the sink works, and
// then the refusal counts as one of the record's attempts — when it was
// the first failure since the sink last answered (countable), not one in
// the middle of an outage. Until then probes go with other records, and
// with suspects only when nothing else is left.
type suspect struct {
	it        *item
	countable bool
	reason    string
}

// suspect holds items back as suspects.
func (p *Pipeline) suspect(items []*item, countable bool, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, it := range items {
		p.suspects = append(p.suspects, suspect{it: it, countable: countable, reason: reason})
	}
}

// acquit acts on the evidence of an answer with a verdict: each suspect's
// refusal is its own (one attempt, or a dead letter when none is left) if
// it was countable, and it is retried.
func (p *Pipeline) acquit(now time.Time) {
	p.mu.Lock()
	suspects := p.suspects
	p.suspects = nil
	p.mu.Unlock()
	for _, s := range suspects {
		if s.countable {
			p.route(s.it, ingest.Result{Outcome: ingest.Retryable, Reason: s.reason}, now)
			continue
		}
		p.retryItem(s.it, now)
	}
}

// releaseSuspects queues the suspects for a probe that has nothing else to
// send; they stay suspects until an answer judges a record.
func (p *Pipeline) releaseSuspects(now time.Time) bool {
	p.mu.Lock()
	suspects := p.suspects
	p.suspects = nil
	p.mu.Unlock()
	for _, s := range suspects {
		b := newBatch([]*item{s.it})
		b.due = now
		p.pushRetry(b)
	}
	return len(suspects) > 0
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
			if p.ranges.requeue(now, it, min(res.RetryAfter, p.cfg.MaxRetryAfter)) {
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
