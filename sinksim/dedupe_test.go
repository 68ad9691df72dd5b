package sinksim

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/sinkwire"
)

// storeIDs stores n records with fresh IDs through the admission path, in
// requests of 1,000, and returns the heap the emulator kept per record.
func storeIDs(tb testing.TB, n int) float64 {
	tb.Helper()
	s, err := New(Config{Capacity: MaxCapacity})
	require.NoError(tb, err)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	batch := make([]incoming, 1000)
	for i := 0; i < n; i += len(batch) {
		for j := range batch {
			id := "nc" + strconv.Itoa(10_000_000+i+j)
			batch[j] = incoming{id: id, key: id, cost: 1}
		}
		results, _ := s.admitBatch(batch)
		require.Equal(tb, sinkwire.StatusStored, results[0].Status)
	}
	after := heap()
	require.EqualValues(tb, n, s.Stats().Accepted)
	// The set still tells a stored ID from a new one.
	results, _ := s.admitBatch([]incoming{{id: "nc10000042", cost: 1}, {id: "never-stored", cost: 1}})
	require.Equal(tb, sinkwire.StatusDuplicate, results[0].Status)
	require.Equal(tb, sinkwire.StatusStored, results[1].Status)
	runtime.KeepAlive(s)
	return float64(after-before) / float64(n)
}

// The dedupe set costs at most 40 bytes per record stored, so a rehearsal
// of 100 million records fits in a few GiB (heap measured, not time).
func TestDedupeCostsAtMost40BytesPerRecord(t *testing.T) {
	for _, n := range []int{500_000} {
		perRecord := storeIDs(t, n)
		t.Logf("%d records: %.1f bytes per record", n, perRecord)
		require.LessOrEqual(t, perRecord, 40.0, "%d records", n)
	}
}

// BenchmarkDedupeMemory reports the heap the dedupe set keeps per record
// stored, at 1, 3 and 10 million records.
func BenchmarkDedupeMemory(b *testing.B) {
	for _, n := range []int{1_000_000, 3_000_000, 10_000_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var perRecord float64
			for range b.N {
				perRecord = storeIDs(b, n)
			}
			b.ReportMetric(perRecord, "B/record")
		})
	}
}

func TestHashIDIsStable(t *testing.T) {
	t.Parallel()
	require.Equal(t, HashID("nc75191211"), HashID("nc75191211"))
	require.NotEqual(t, HashID("nc75191211"), HashID("nc75191212"))
	require.Equal(t, "e3b0c44298fc1c149afbf4c8", fmt.Sprintf("%x", HashID("")), "the first 96 bits of SHA-256")
}
