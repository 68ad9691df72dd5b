// Package sinktest is the conformance suite every sink passes against its
// real server: the outcomes the worker pipeline relies on, for ordinary,
// duplicate, retryable, throttled, permanent, partial, sink-wide failed and
// cancelled writes.
package sinktest

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// Suite is what every sink must pass against its real server. Each sink's
// test provides:
//   - Open: a fresh, empty sink (a new table, a new emulator) that stores
//     records whose value has a "mag" field and refuses for good those
//     without one (a CHECK constraint, the emulator's required fields);
//   - Retryable: arranges that the server answers writing the returned
//     batch with a retryable failure about some of its records, not
//     throttling (a lock held by another transaction past the statement
//     timeout, a 5xx for those records' requests, the emulator's injected
//     failure; a proxy in front of the server answering in its place, in
//     the service's own shape, where the server cannot be made to fail
//     so), and returns the batch with the sink to write it to (s, or one
//     through the proxy). Write must answer per record: at least one
//     Retryable, none Throttled or Permanent, the others Delivered; an
//     error of the whole write does not pass;
//   - Bad (optional): a record the sink refuses for good, for sinks that
//     have no schema to refuse a value without "mag" with;
//   - Throttled: arranges that the server throttles writing some records
//     of the returned batch (a queue made to overflow, the emulator's
//     spent bucket, a proxy answering the service's throttling answer
//     where the server cannot throttle), and returns it with the sink to
//     write it to. Write must answer per record: at least one Retryable
//     and Throttled, every Retryable one Throttled, none Permanent
//     (throttling never dead-letters), the others Delivered; an error of
//     the whole write does not pass, so a batch of which every record is
//     throttled (which such sinks answer as a whole) does not serve;
//   - NoThrottling, instead of Throttled, for a sink whose server has no
//     throttling answer at all: why (the throttled case is then not run);
//   - Down: a sink whose every request fails as a whole, as the
//     real server makes it fail (wrong credentials, a missing table or
//     bucket). Write must return an error, never per-record Permanent
//     results: a sink-wide failure pauses the worker and must not
//     dead-letter anything;
//   - Stopped (optional): a sink whose server does not answer at all
//     (nothing listens on its port); Write must fail as Down does.
type Suite struct {
	Open         func(t *testing.T) ingest.Sink
	Retryable    func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record)
	Bad          func(id string) ingest.Record
	Down         func(t *testing.T) ingest.Sink
	Stopped      func(t *testing.T) ingest.Sink
	Throttled    func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record)
	NoThrottling string
	// upsert: the sink overwrites and cannot tell a rewrite from a new
	// record, so a rewrite is Delivered instead of Duplicate.
	Upsert bool
}

// Run runs the suite as subtests of t.
func (c Suite) Run(t *testing.T) {
	good := func(id string) ingest.Record { return ingest.Record{ID: id, Value: []byte(`{"mag":1.5}`), Cost: 1} }
	bad := c.Bad
	if bad == nil {
		bad = func(id string) ingest.Record { return ingest.Record{ID: id, Value: []byte(`{"depth":3}`), Cost: 1} }
	}
	dup := ingest.Duplicate
	if c.Upsert {
		dup = ingest.Delivered
	}
	outcomes := func(res []ingest.Result) []ingest.Outcome {
		out := make([]ingest.Outcome, len(res))
		for i, r := range res {
			out[i] = r.Outcome
		}
		return out
	}

	t.Run("ok", func(t *testing.T) {
		s := c.Open(t)
		batch := make([]ingest.Record, 50)
		for i := range batch {
			batch[i] = good(fmt.Sprintf("ok-%d", i))
		}
		res, err := s.Write(t.Context(), batch)
		require.NoError(t, err)
		require.Len(t, res, len(batch))
		for i, r := range res {
			require.Equal(t, ingest.Delivered, r.Outcome, "record %d: %s", i, r.Reason)
		}
	})
	t.Run("duplicate", func(t *testing.T) {
		s := c.Open(t)
		_, err := s.Write(t.Context(), []ingest.Record{good("d1")})
		require.NoError(t, err)
		res, err := s.Write(t.Context(), []ingest.Record{good("d1"), good("d2")})
		require.NoError(t, err)
		require.Equal(t, []ingest.Outcome{dup, ingest.Delivered}, outcomes(res))
	})
	t.Run("retryable", func(t *testing.T) {
		s := c.Open(t)
		target, batch := c.Retryable(t, s)
		res, err := target.Write(t.Context(), batch)
		require.NoError(t, err, "the server's retryable answer about records is per record, not a failure of the whole write")
		require.Len(t, res, len(batch))
		retryable := 0
		for i, r := range res {
			switch r.Outcome {
			case ingest.Retryable:
				retryable++
				require.False(t, r.Throttled, "record %d: a failure that is not throttling is not reported as one: %s", i, r.Reason)
				require.NotEmpty(t, r.Reason, "record %d", i)
			case ingest.Delivered:
			default:
				require.Failf(t, "a record is neither retryable nor stored", "record %d: %v: %s", i, r.Outcome, r.Reason)
			}
		}
		require.Positive(t, retryable, "the server answered a record retryable")
	})
	require.True(t, c.Throttled != nil || c.NoThrottling != "", "a sink's suite says how its server throttles a record, or why it cannot")
	if c.Throttled != nil {
		t.Run("throttled", func(t *testing.T) {
			s := c.Open(t)
			target, batch := c.Throttled(t, s)
			res, err := target.Write(t.Context(), batch)
			require.NoError(t, err, "the server's throttling of records is answered per record, not as a failure of the whole write")
			require.Len(t, res, len(batch))
			throttled := 0
			for i, r := range res {
				switch r.Outcome {
				case ingest.Retryable:
					require.True(t, r.Throttled, "record %d: throttling is reported as throttling: %s", i, r.Reason)
					require.NotEmpty(t, r.Reason, "record %d", i)
					throttled++
				case ingest.Delivered:
				default:
					require.Failf(t, "a record is neither throttled nor stored (throttling never dead-letters)", "record %d: %v: %s", i, r.Outcome, r.Reason)
				}
			}
			require.Positive(t, throttled, "the server throttled a record")
		})
	}
	t.Run("permanent", func(t *testing.T) {
		s := c.Open(t)
		res, err := s.Write(t.Context(), []ingest.Record{bad("p1")})
		require.NoError(t, err)
		require.Equal(t, []ingest.Outcome{ingest.Permanent}, outcomes(res))
		require.NotEmpty(t, res[0].Reason)
	})
	t.Run("partial", func(t *testing.T) {
		s := c.Open(t)
		res, err := s.Write(t.Context(), []ingest.Record{good("a"), bad("b"), good("c"), {ID: "d", Value: []byte(`{not json`)}, good("e")})
		require.NoError(t, err)
		require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Delivered, ingest.Permanent, ingest.Delivered}, outcomes(res))
		res, err = s.Write(t.Context(), []ingest.Record{good("a"), good("c"), good("e")})
		require.NoError(t, err)
		require.Equal(t, []ingest.Outcome{dup, dup, dup}, outcomes(res), "the neighbours were stored")
	})
	down := func(t *testing.T, s ingest.Sink) {
		res, err := s.Write(t.Context(), []ingest.Record{good("x1"), good("x2")})
		require.Error(t, err, "a sink-wide failure is an error, not per-record verdicts")
		require.Nil(t, res)
	}
	t.Run("down", func(t *testing.T) { down(t, c.Down(t)) })
	if c.Stopped != nil {
		t.Run("stopped", func(t *testing.T) { down(t, c.Stopped(t)) })
	}
	t.Run("cancelled", func(t *testing.T) {
		s := c.Open(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		res, err := s.Write(ctx, []ingest.Record{good("c1")})
		require.Error(t, err)
		require.Nil(t, res)
	})
}
