package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"

	"github.com/sluicehq/sluice/ingest"
)

// failure is a request of a Write that failed as a whole (refused
// credentials, a missing table or bucket, an endpoint that does not
// answer): recs are the batch indexes of the records it carried.
type failure struct {
	recs []int
	err  error
}

// fanOut runs do(k) for every k in [0, n), at most par at once, and waits
// for them. Once ctx is done it starts no more and returns the ks it did
// not start.
func fanOut(ctx context.Context, n, par int, do func(k int)) (unstarted []int) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, par)
	for k := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			for ; k < n; k++ {
				unstarted = append(unstarted, k)
			}
			return unstarted
		}
		wg.Go(func() {
			defer func() { <-sem }()
			do(k)
		})
	}
	wg.Wait()
	return nil
}

// settle turns the outcome of a Write that sent its records in several
// requests (sent: the batch indexes of the records sent) into its answer:
//
//   - the first failure's error when no record was stored (nor found a
//     duplicate): the whole Write failed, the worker pauses and retries it
//     whole, and nothing is dead-lettered;
//   - otherwise Retryable results for the records of failed requests, so
//     that the records stored next to them are not counted twice;
//   - an *ingest.SinkError with Throttled set when every record sent was
//     throttled, as a request throttled as a whole is.
//
// Once ctx is done (the request deadline) it returns context.Cause(ctx)
// when no record had an answer; otherwise the answers that came in stand,
// and the records without one (their requests unanswered or never sent)
// are Retryable and Throttled: the server did not keep up with the pool's
// rate, so they are retried without using up their attempts while the
// worker slows down, and the stored ones are not written again as
// duplicates. name prefixes errors ("dynamodb", "s3").
func settle(ctx context.Context, name string, sent []int, out []ingest.Result, fails []failure) ([]ingest.Result, error) {
	failed := map[int]bool{}
	for _, f := range fails {
		for _, i := range f.recs {
			failed[i] = true
		}
	}
	stored, throttled := 0, 0
	for _, i := range sent {
		switch {
		case failed[i]:
			// no answer about the record (its result is still zero)
		case out[i].Outcome == ingest.Delivered || out[i].Outcome == ingest.Duplicate:
			stored++
		case out[i].Outcome == ingest.Retryable && out[i].Throttled:
			throttled++
		}
	}
	if err := context.Cause(ctx); err != nil {
		if len(failed) == len(sent) {
			return nil, err
		}
		for i := range failed {
			out[i] = ingest.Result{Outcome: ingest.Retryable, Throttled: true,
				Reason: name + ": no answer within the request deadline (the server is slower than the pool's rate)"}
		}
		return out, nil
	}
	if len(fails) > 0 && stored == 0 {
		return nil, fmt.Errorf("sink: %s: %w", name, fails[0].err)
	}
	for _, f := range fails {
		for _, i := range f.recs {
			out[i] = ingest.Result{Outcome: ingest.Retryable, Reason: name + ": " + f.err.Error()}
		}
	}
	if len(fails) == 0 && len(sent) > 0 && throttled == len(sent) {
		se := &ingest.SinkError{Throttled: true, Err: errors.New(out[sent[0]].Reason)}
		for _, i := range sent {
			se.RetryAfter = max(se.RetryAfter, out[i].RetryAfter)
		}
		return nil, se
	}
	return out, nil
}

// maxUnanswered bounds the writes an unanswered set remembers: beyond it,
// a retry that finds its record stored counts as a duplicate.
const maxUnanswered = 1 << 16

// unanswered remembers the keys (item keys, object names) of this
// process's writes that got no answer (a request deadline, a connection
// lost): such a write may have been stored. When a retry then finds the
// key stored (a failed condition, 412), the record counts as delivered,
// not as a duplicate: its first write most likely stored it. The one
// miscount left is a record stored before by someone else whose write
// here also went unanswered. Safe for concurrent use.
type unanswered struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

// add remembers key, unless the set is full.
func (u *unanswered) add(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.keys == nil {
		u.keys = map[string]struct{}{}
	}
	if len(u.keys) < maxUnanswered {
		u.keys[key] = struct{}{}
	}
}

// take forgets key and reports whether it was remembered.
func (u *unanswered) take(key string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.keys[key]
	delete(u.keys, key)
	return ok
}

// hasAnswer reports whether err carries the server's answer (an HTTP
// response); a transport error or an ended context does not, and the
// write may have been stored all the same.
func hasAnswer(err error) bool {
	re, ok := errors.AsType[*awshttp.ResponseError](err)
	return ok && re.HTTPStatusCode() != 0
}
