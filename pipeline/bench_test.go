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
	for _, tc := range []struct {
		name    string
		idField string
		http    bool
	}{
		{"id-field", "id", false},
		{"content-hash", "", false},
		{"id-field-http", "id", true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var out ingest.Sink = discardSink{}
			if tc.http {
				sim, err := sinksim.New(sinksim.Config{Capacity: sinksim.MaxCapacity})
				require.NoError(b, err)
				srv := httptest.NewServer(sim.Handler())
				defer srv.Close()
				hs, err := sink.NewHTTP(sink.HTTPConfig{URL: srv.URL})
				require.NoError(b, err)
				defer hs.Close()
				out = hs
			}
			values := ingesttest.USGSRecords(b, b.N, 1024)
			src := &sliceSource{values: values, finished: make(chan struct{})}
			capa := &fixedRate{rate: 1e9}
			pacer, err := pacing.New(pacing.Config{}, capa)
			require.NoError(b, err)
			dlq := &nopDLQ{}
			p, err := pipeline.New(pipeline.Config{IDField: tc.idField}, pipeline.Ports{
				Source: src, DeadLetters: dlq, Sink: out, Retry: sink.Policy{}, Pacer: pacer, Capacity: capa,
			})
			require.NoError(b, err)
			ctx, cancel := context.WithCancel(b.Context())
			done := make(chan error, 1)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { done <- p.Run(ctx) }()
			<-src.finished
			b.StopTimer()
			cancel()
			require.NoError(b, <-done)
			require.Zero(b, dlq.n, "dead letters")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
