package ingest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkBatches asserts GroupBatches' promises for one input.
func checkBatches(t testing.TB, keys []string, sizes []int, lim BatchLimits) {
	batches := GroupBatches(len(keys), func(i int) string { return keys[i] }, func(i int) int { return sizes[i] }, lim)
	seen := make([]int, len(keys))
	for _, b := range batches {
		require.NotEmpty(t, b)
		total := 0
		for j, i := range b {
			seen[i]++
			total += sizes[i]
			require.Equal(t, keys[b[0]], keys[i], "one partition key per batch")
			if j > 0 {
				require.Less(t, b[j-1], i, "order kept within a batch")
			}
		}
		require.LessOrEqual(t, len(b), lim.MaxOps, "too many operations")
		if len(b) > 1 {
			require.LessOrEqual(t, total, lim.MaxBytes, "too many bytes")
		}
	}
	for i, n := range seen {
		require.Equal(t, 1, n, "operation %d in %d batches", i, n)
	}
}

func TestGroupBatchesProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 7))
	for range 200 {
		n := rng.IntN(600)
		lim := BatchLimits{MaxOps: 1 + rng.IntN(120), MaxBytes: 1 + rng.IntN(50_000)}
		keys, sizes := make([]string, n), make([]int, n)
		for i := range n {
			keys[i] = fmt.Sprintf("pk%d", rng.IntN(1+rng.IntN(20)))
			sizes[i] = rng.IntN(lim.MaxBytes/4 + 2)
			if rng.IntN(50) == 0 {
				sizes[i] = lim.MaxBytes + 1 // oversize: alone
			}
		}
		checkBatches(t, keys, sizes, lim)
	}
}

func TestGroupBatchesDefaultsAndOrder(t *testing.T) {
	t.Parallel()
	keys := []string{"b", "a", "b", "a", "c"}
	got := GroupBatches(len(keys), func(i int) string { return keys[i] }, func(int) int { return 1 }, BatchLimits{})
	require.Equal(t, [][]int{{0, 2}, {1, 3}, {4}}, got, "batches in first-appearance order of their key")

	many := make([]string, 250)
	for i := range many {
		many[i] = "p"
	}
	got = GroupBatches(len(many), func(i int) string { return many[i] }, func(int) int { return 1 << 10 }, BatchLimits{})
	require.Equal(t, []int{100, 100, 50}, []int{len(got[0]), len(got[1]), len(got[2])}, "100 operations by default")
	got = GroupBatches(10, func(int) string { return "p" }, func(int) int { return 1 << 20 }, BatchLimits{})
	require.Len(t, got, 3, "4 MiB by default: 4 + 4 + 2 records of 1 MiB")
	require.True(t, slices.Equal(got[2], []int{8, 9}))
}

func FuzzGroupBatches(f *testing.F) {
	f.Add([]byte("aabbaacb"), 3, 10)
	f.Add([]byte{0, 1, 2, 255}, 1, 1)
	f.Fuzz(func(t *testing.T, data []byte, maxOps, maxBytes int) {
		maxOps, maxBytes = 1+abs(maxOps%200), 1+abs(maxBytes%(1<<20))
		keys, sizes := make([]string, len(data)), make([]int, len(data))
		for i, b := range data {
			keys[i], sizes[i] = string(rune('a'+b%5)), int(b)
		}
		checkBatches(t, keys, sizes, BatchLimits{MaxOps: maxOps, MaxBytes: maxBytes})
	})
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
