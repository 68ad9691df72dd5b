//go:build !race

// The budgets run without the race detector, whose instrumentation adds
// allocations and drops sync.Pool items at random; make test runs them
// on their own (go test -run Budget).

package pipeline_test

import (
	"runtime"
	"testing"

	"github.com/sluicehq/sluice/ingest/ingesttest"
)

// The hot path's allocation budget: at most 4 allocations per record from
// fetch to Done (pricing, ID, validation, batching, pacing, commit
// hand-off), into a sink that discards, counted over 20,000 records. A
// change that
// allocates per record again (85 before the path was made lean, 2.3 now
// without the race detector) fails here.
func TestBudgetHotPathAllocations(t *testing.T) {
	const n, budget = 20_000, 4
	for _, name := range []string{"id-field", "content-hash"} {
		run := newBenchPipeline(t, name, ingesttest.USGSRecords(t, n, 1024))
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		run()
		runtime.ReadMemStats(&after)
		perRecord := float64(after.Mallocs-before.Mallocs) / n
		t.Logf("%s: %.2f allocations and %.0f bytes per record", name, perRecord, float64(after.TotalAlloc-before.TotalAlloc)/n)
		if perRecord > budget {
			t.Errorf("%s: %.2f allocations per record, over the budget of %d", name, perRecord, budget)
		}
	}
}
