package ingest_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
)

// usgsRows returns the rows of the USGS sample as JSON objects (a column
// that parses as a number is a number, an empty one null), the way
// bulk-load produces them.
func usgsRows(tb testing.TB) [][]byte {
	tb.Helper()
	data, err := os.ReadFile("../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(tb, err)
	all, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	require.NoError(tb, err)
	header := all[0]
	out := make([][]byte, 0, len(all)-1)
	for _, row := range all[1:] {
		var b bytes.Buffer
		b.WriteByte('{')
		for i, v := range row {
			if i > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(header[i])
			b.Write(k)
			b.WriteByte(':')
			if v == "" {
				b.WriteString("null")
			} else if _, err := strconv.ParseFloat(v, 64); err == nil {
				b.WriteString(v)
			} else {
				s, _ := json.Marshal(v)
				b.Write(s)
			}
		}
		b.WriteByte('}')
		out = append(out, b.Bytes())
	}
	return out
}

// usgsRecords returns n records made of the USGS rows, repeated with fresh
// IDs ("<id>-<k>" for the k-th repetition), each padded with a "pad" field
// to about size bytes when size > 0.
func usgsRecords(tb testing.TB, n, size int) [][]byte {
	tb.Helper()
	rows := usgsRows(tb)
	out := make([][]byte, n)
	for i := range out {
		row := rows[i%len(rows)]
		v := bytes.Clone(row[:len(row)-1])
		if k := i / len(rows); k > 0 {
			// A fresh ID: the id field comes before any other "id".
			at := bytes.Index(v, []byte(`"id":"`)) + len(`"id":"`)
			end := at + bytes.IndexByte(v[at:], '"')
			v = append(v[:end:end], append([]byte("-"+strconv.Itoa(k)), v[end:]...)...)
		}
		if pad := size - len(v) - len(`,"pad":""}`); size > 0 && pad > 0 {
			v = append(v, `,"pad":"`...)
			v = append(v, strings.Repeat("x", pad)...)
			v = append(v, '"')
		}
		out[i] = append(v, '}')
	}
	return out
}

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
			values := usgsRecords(b, b.N, 1024)
			src := &sliceSource{values: values, finished: make(chan struct{})}
			capa := &fixedRate{rate: 1e9}
			pacer, err := pacing.New(pacing.Config{}, capa)
			require.NoError(b, err)
			dlq := &nopDLQ{}
			p, err := ingest.NewPipeline(ingest.PipelineConfig{IDField: tc.idField}, ingest.Ports{
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
