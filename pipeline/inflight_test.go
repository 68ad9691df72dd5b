package pipeline_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/pipeline"
	"github.com/sluicehq/sluice/sink"
)

// countingSource counts the bytes and records fetched and not yet Done, as
// the in-flight bound counts them, and the most of each at any instant.
type countingSource struct {
	*fakeSource
	mu                   sync.Mutex
	bytes, records       int64
	maxBytes, maxRecords int64
}

func (s *countingSource) Fetch(ctx context.Context) (ingest.Record, error) {
	rec, err := s.fakeSource.Fetch(ctx)
	if err == nil {
		s.mu.Lock()
		s.bytes += int64(len(rec.Value)) + ingest.RecordOverhead
		s.records++
		s.maxBytes, s.maxRecords = max(s.maxBytes, s.bytes), max(s.maxRecords, s.records)
		s.mu.Unlock()
	}
	return rec, err
}

func (s *countingSource) Done(rec ingest.Record) {
	s.mu.Lock()
	s.bytes -= int64(len(rec.Value)) + ingest.RecordOverhead
	s.records--
	s.mu.Unlock()
	s.fakeSource.Done(rec)
}

// paddedRecords are n JSON records of size bytes each.
func paddedRecords(n, size int) []string {
	out := make([]string, n)
	for i := range out {
		head := fmt.Sprintf(`{"id":"r%07d","pad":"`, i)
		out[i] = head + strings.Repeat("x", size-len(head)-2) + `"}`
	}
	return out
}

// With 100 records in flight at most, a 200 ms slice used to send at most
// 100 records, so the pipeline could not pass 500 records/s at any rate.
// A slice now goes on taking records as they are fetched while its budget
// lasts: at 20,000 records/s and 2 ms answers, 10,000 records take well
// under the old 20 s, and the sink's second still holds.
func TestPipelineIsNotBoundByWhatIsInFlightPerSlice(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, pipeline.Config{IDField: "id", MaxInFlight: 100}, 20_000, records(10_000)...)
		r.sink.latency = func(int) time.Duration { return 2 * time.Millisecond }
		took, err := r.run(t, time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 10_000)
		t.Logf("took %s (ceiling per slice: 20 s); busiest second %d", took, r.sink.maxIn(time.Second, 0))
		require.Less(t, took, 750*time.Millisecond, "≥ 2/3 of the rate with 100 records in flight")
		require.LessOrEqual(t, r.sink.maxIn(time.Second, 0), int64(20_000))
	})
}

// The byte bound holds what is in flight, a record over it at most,
// whatever the rate and backlog: 1 KiB records, room for 20 of them, a
// sink answering in 50 ms.
func TestPipelineBoundsBytesInFlight(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const size = 1024
		per := int64(size + ingest.RecordOverhead)
		bound := 20 * per
		r := newRig(t, pipeline.Config{IDField: "id", MaxInFlightBytes: bound}, 100_000, paddedRecords(2000, size)...)
		src := &countingSource{fakeSource: r.src}
		r.sink.latency = func(int) time.Duration { return 50 * time.Millisecond }
		p := newPipelineWith(t, r, src, pipeline.Config{IDField: "id", MaxInFlightBytes: bound})
		took, err := runPipeline(t, p, r.src, time.Minute)
		require.NoError(t, err)
		require.Len(t, r.sink.stored, 2000)
		t.Logf("took %s; most in flight %d records, %d bytes (bound %d)", took, src.maxRecords, src.maxBytes, bound)
		require.LessOrEqual(t, src.maxBytes, bound+per, "the bound, one record over at most")
		require.GreaterOrEqual(t, src.maxBytes, bound, "the bound is used")
	})
}

// newPipelineWith builds a pipeline like r's over source src and cfg.
func newPipelineWith(t *testing.T, r *rig, src ingest.Source, cfg pipeline.Config) *pipeline.Pipeline {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(syncWriter{w: r.log}, nil))
	p, err := pipeline.New(cfg, pipeline.Ports{
		Source: src, DeadLetters: r.dlq, Sink: r.sink, Retry: sink.Policy{MaxAttempts: 3}, Pacer: r.pacer, Capacity: r.capa,
	})
	require.NoError(t, err)
	return p
}

// runPipeline runs p until every record of src is finished (or limit
// passes) and returns how long it took and Run's error.
func runPipeline(t *testing.T, p *pipeline.Pipeline, src *fakeSource, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	for src.doneCount() < len(src.recs) && time.Since(start) < limit {
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	cancel()
	return took, <-done
}
