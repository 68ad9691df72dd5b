// Package sinktest is the conformance suite every sink passes against its
// real server: the outcomes the worker pipeline relies on, for ordinary,
// duplicate, retryable, throttled, permanent, partial and cancelled writes.
package sinktest

import (
	"context"
	"errors"
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
//   - Retryable: arranges, with what the real server can produce, that
//     writing the returned batch fails in a retryable way (a lock held by
//     another transaction past the statement timeout, the emulator's
//     throttling, a stopped server), and returns it with the sink to write
//     it to (s, or one on the stopped server);
//   - Bad (optional): a record the sink refuses for good, for sinks that
//     have no schema to refuse a value without "mag" with;
//   - Throttled (optional): arranges that the server throttles writing
//     the returned batch (a queue made to overflow, a proxy answering 429
//     or 503 where the server cannot throttle), and returns it with the
//     sink to write it to. Write must answer an *ingest.SinkError with
//     Throttled set, or per-record results of which at least one is
//     Retryable and Throttled and none is Permanent: throttling never
//     dead-letters;
//   - Down: a sink whose every request fails as a whole, as the
//     real server makes it fail (wrong credentials, a missing table or
//     bucket, a stopped server). Write must return an error, never
//     per-record Permanent results: a sink-wide failure pauses the worker
//     and must not dead-letter anything.
type Suite struct {
	Open      func(t *testing.T) ingest.Sink
	Retryable func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record)
	Bad       func(id string) ingest.Record
	Down      func(t *testing.T) ingest.Sink
	Throttled func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record)
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
		if err != nil {
			return // the whole attempt failed: the worker retries it
		}
		require.Len(t, res, len(batch))
		for i, r := range res {
			require.Equal(t, ingest.Retryable, r.Outcome, "record %d", i)
			require.NotEmpty(t, r.Reason)
		}
	})
	if c.Throttled != nil {
		t.Run("throttled", func(t *testing.T) {
			s := c.Open(t)
			target, batch := c.Throttled(t, s)
			res, err := target.Write(t.Context(), batch)
			if err != nil {
				se := (*ingest.SinkError)(nil)
				require.True(t, errors.As(err, &se), "a failed throttled write is an *ingest.SinkError: %v", err)
				require.True(t, se.Throttled, "the write's error says it was throttled: %v", err)
				require.Nil(t, res)
				return
			}
			require.Len(t, res, len(batch))
			throttled := 0
			for i, r := range res {
				require.NotEqual(t, ingest.Permanent, r.Outcome, "record %d: throttling never dead-letters: %s", i, r.Reason)
				if r.Outcome == ingest.Retryable && r.Throttled {
					throttled++
					require.NotEmpty(t, r.Reason)
				}
			}
			require.Positive(t, throttled, "at least one record was throttled")
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
	t.Run("down", func(t *testing.T) {
		s := c.Down(t)
		res, err := s.Write(t.Context(), []ingest.Record{good("x1"), good("x2")})
		require.Error(t, err, "a sink-wide failure is an error, not per-record verdicts")
		require.Nil(t, res)
	})
	t.Run("cancelled", func(t *testing.T) {
		s := c.Open(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		res, err := s.Write(ctx, []ingest.Record{good("c1")})
		require.Error(t, err)
		require.Nil(t, res)
	})
}
