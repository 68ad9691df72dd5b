package pipeline_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/ingest/ingesttest"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/pipeline"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
)

// sliceSource serves values once each and closes finished when all are
// Done.
type sliceSource struct {
	values   [][]byte
	next     atomic.Int64
	done     atomic.Int64
	finished chan struct{}
}

func (s *sliceSource) Fetch(ctx context.Context) (ingest.Record, error) {
	i := s.next.Add(1) - 1
	if i >= int64(len(s.values)) {
		<-ctx.Done()
		return ingest.Record{}, ctx.Err()
	}
	return ingest.Record{Value: s.values[i], Pos: ingest.Position{Topic: "t", Offset: i}}, nil
}

func (s *sliceSource) Done(ingest.Record) {
	if s.done.Add(1) == int64(len(s.values)) {
		close(s.finished)
	}
}

// discardSink stores nothing and answers Delivered.
type discardSink struct{}

func (discardSink) Write(_ context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	return make([]ingest.Result, len(batch)), nil // the zero Result is Delivered
}

type nopDLQ struct {
	mu sync.Mutex
	n  int
}

func (d *nopDLQ) DeadLetter(_ context.Context, letters ...ingest.DeadLetter) error {
	d.mu.Lock()
	d.n += len(letters)
	d.mu.Unlock()
	return nil
}

// BenchmarkPipeline runs the worker's pipeline at an unbounded rate into a
// sink that discards, per record: the hot path from fetch to Done
// (pricing, ID, validation, batching, pacing, commit hand-off) without
// Kafka or the network. Allocations per op are per record.
func BenchmarkPipeline(b *testing.B) {
	for _, name := range []string{"id-field", "content-hash", "id-field-http"} {
		b.Run(name, func(b *testing.B) { benchmarkPipeline(b, name) })
	}
}

// benchmarkPipeline runs one case of BenchmarkPipeline: "id-field" and
// "content-hash" into a sink that discards, "id-field-http" into the
// emulator over HTTP.
func benchmarkPipeline(b *testing.B, name string) {
	run := newBenchPipeline(b, name, ingesttest.USGSRecords(b, b.N, 1024))
	b.ReportAllocs()
	b.ResetTimer()
	run()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// newBenchPipeline builds the pipeline of a BenchmarkPipeline case over
// values and returns run, which drains them all and stops it.
func newBenchPipeline(tb testing.TB, name string, values [][]byte) (run func()) {
	idField := "id"
	if name == "content-hash" {
		idField = ""
	}
	var out ingest.Sink = discardSink{}
	if name == "id-field-http" {
		sim, err := sinksim.New(sinksim.Config{Capacity: sinksim.MaxCapacity})
		require.NoError(tb, err)
		srv := httptest.NewServer(sim.Handler())
		tb.Cleanup(srv.Close)
		hs, err := sink.NewHTTP(sink.HTTPConfig{URL: srv.URL})
		require.NoError(tb, err)
		tb.Cleanup(func() { _ = hs.Close() })
		out = hs
	}
	src := &sliceSource{values: values, finished: make(chan struct{})}
	capa := &fixedRate{rate: 1e9}
	pacer, err := pacing.New(pacing.Config{}, capa)
	require.NoError(tb, err)
	dlq := &nopDLQ{}
	p, err := pipeline.New(pipeline.Config{IDField: idField}, pipeline.Ports{
		Source: src, DeadLetters: dlq, Sink: out, Retry: sink.Policy{}, Pacer: pacer, Capacity: capa,
	})
	require.NoError(tb, err)
	return func() {
		ctx, cancel := context.WithCancel(tb.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		<-src.finished
		cancel()
		require.NoError(tb, <-done)
		require.Zero(tb, dlq.n, "dead letters")
	}
}
