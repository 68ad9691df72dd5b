package bulkload

import (
	"context"
	"encoding/csv"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// usgsGenerator is a CSV of n rows made of the USGS rows with fresh IDs
// (the k-th copy of id X is X-k), written as it is read: the input never
// exists whole, in memory or on disk.
type usgsGenerator struct {
	header        string
	before, after []string // each row's text around its ID
	ids           []string
	n, i          int
	pending       []byte
	bytes         int64
}

func newUSGSGenerator(t *testing.T, n int) *usgsGenerator {
	t.Helper()
	f, err := os.Open("../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	idCol := slices.Index(rows[0], "id")
	g := &usgsGenerator{header: strings.Join(rows[0], ",") + "\n", n: n}
	for _, row := range rows[1:] {
		var b strings.Builder
		w := csv.NewWriter(&b)
		marked := slices.Clone(row)
		marked[idCol] = "\x00"
		require.NoError(t, w.Write(marked))
		w.Flush()
		before, after, _ := strings.Cut(b.String(), "\x00")
		g.before, g.after, g.ids = append(g.before, before), append(g.after, after), append(g.ids, row[idCol])
	}
	g.pending = []byte(g.header)
	return g
}

func (g *usgsGenerator) Read(p []byte) (int, error) {
	for len(g.pending) < len(p) && g.i < g.n {
		j, k := g.i%len(g.ids), g.i/len(g.ids)
		g.pending = append(g.pending, g.before[j]...)
		g.pending = append(g.pending, g.ids[j]...)
		if k > 0 {
			g.pending = append(g.pending, '-')
			g.pending = strconv.AppendInt(g.pending, int64(k), 10)
		}
		g.pending = append(g.pending, g.after[j]...)
		g.i++
	}
	if len(g.pending) == 0 {
		return 0, io.EOF
	}
	c := copy(p, g.pending)
	g.pending = g.pending[:copy(g.pending, g.pending[c:])]
	g.bytes += int64(c)
	return c, nil
}

// heapSampler passes rows through and records the heap in use (after a
// collection) every every rows.
type heapSampler struct {
	rows    Rows
	every   int
	n       int
	samples []uint64
}

func (h *heapSampler) Next() (ingest.Record, error) {
	rec, err := h.rows.Next()
	if err == nil {
		if h.n++; h.n%h.every == 0 {
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			h.samples = append(h.samples, m.HeapInuse)
		}
	}
	return rec, err
}

// answeringProducer acknowledges each chunk from a goroutine of its own,
// a few chunks behind, as a broker would.
type answeringProducer struct {
	chunks chan func()
	done   chan struct{}
}

func newAnsweringProducer() *answeringProducer {
	p := &answeringProducer{chunks: make(chan func(), 20), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for answer := range p.chunks {
			answer()
		}
	}()
	return p
}

func (p *answeringProducer) Produce(context.Context, string, []ingest.Record) error {
	panic("Produce is not used: ProduceAsync is")
}

func (p *answeringProducer) ProduceAsync(ctx context.Context, _ string, recs []ingest.Record, done func([]error)) error {
	select {
	case p.chunks <- func() { done(nil) }:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (p *answeringProducer) close() { close(p.chunks); <-p.done }

type dropDLQ struct{}

func (dropDLQ) DeadLetter(context.Context, ...ingest.DeadLetter) error { return nil }

// The heap's budget: memory does not grow with the input. Streaming a
// generated CSV of 1,000,000 USGS rows (about 200 MB) from standard input
// through Produce with the default ID table (DefaultIDMemory, whose last
// growth comes at 262,144 IDs), the heap in use, sampled after a
// collection at every tenth of the input, stays under 32 MiB, and once
// the IDs remembered stop growing it stays flat: the last three samples
// are within 2 MiB of the three from 40 % on. make test runs it without
// the race detector (go test -run Budget); under it, 250,000 rows with a
// table of a fifth of them.
func TestBudgetProduceMemory(t *testing.T) {
	n, ids := 1_000_000, 0 // 0: DefaultIDMemory
	if raceEnabled {
		n, ids = 250_000, 50_000
	}
	gen := newUSGSGenerator(t, n)
	in, err := Open([]string{Stdin}, InputConfig{Format: "csv", IDField: "id", Stdin: gen})
	require.NoError(t, err)
	defer in.Close()
	sampler := &heapSampler{rows: in, every: n / 10}
	p := newAnsweringProducer()
	defer p.close()
	// The ID table is at its largest by a third of the input; the rest of
	// it must not add to the heap.
	out, err := Produce(t.Context(), sampler, p, dropDLQ{}, ProduceConfig{Topic: "t", IDField: "id", IDMemory: ids})
	require.NoError(t, err)
	require.EqualValues(t, n, out.Produced)
	require.EqualValues(t, n, out.Done)
	require.Zero(t, out.DuplicateIDs)
	require.Len(t, sampler.samples, 10)
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	for i, s := range sampler.samples {
		t.Logf("heap in use after %d rows: %.1f MiB", (i+1)*n/10, mib(s))
	}
	t.Logf("input: %d rows, %.0f MB", n, float64(gen.bytes)/1e6)
	require.Greater(t, gen.bytes, int64(n)*150, "the input is as large as its rows")
	require.Less(t, mib(slices.Max(sampler.samples)), 32.0, "the heap is bounded")
	mean := func(s []uint64) float64 {
		var sum uint64
		for _, v := range s {
			sum += v
		}
		return mib(sum) / float64(len(s))
	}
	require.Less(t, mean(sampler.samples[7:])-mean(sampler.samples[3:6]), 2.0,
		"the heap does not grow with the rows read: %v", sampler.samples)
}
