package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/ingest"
)

// failure is a request of a Write that failed as a whole (refused
// credentials, a missing table or bucket, an endpoint that does not
// answer): recs are the batch indexes of the records it carried.
type failure struct {
	recs []int
	err  error
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
// name prefixes errors ("dynamodb", "s3"). Once ctx is done it returns
// context.Cause(ctx).
func settle(ctx context.Context, name string, sent []int, out []ingest.Result, fails []failure) ([]ingest.Result, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
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
