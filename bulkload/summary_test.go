package bulkload_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/ingest"
)

// The summary tells both sides of the rate promise and the guard in
// effect, and explains a sink-side second over capacity instead of leaving
// it to the reader.
func TestSummaryTellsBothSides(t *testing.T) {
	t.Parallel()
	s := bulkload.Summary{
		RecordsTotal: 9366, RecordsDelivered: 9366, SinkRequests: 480, SinkRecordAttempts: 9366,
		Workers: 2, Unit: "records", CapacityUnitsPerS: 2000, CostTotal: 9366, UnitsSent: 9366, ElapsedS: 4.8, IdealS: 4.683, Utilization: 0.976,
		SendMaxUnits1s: 1996, LatencyP99MS: 4.2, LatencyMaxMS: 9.1, GuardMinMS: 2.1, GuardFinalMS: 3.4,
		MaxUnits1sWindow: 1997, MaxUnits200msWindow: 420, SinkStats: &ingest.SinkStats{}, SinkStatsScope: bulkload.ScopeRun,
	}
	var b strings.Builder
	s.WriteText(&b)
	out := b.String()
	require.Contains(t, out, "at most 1996 records in a 1 s window (0.998 of capacity)")
	require.Contains(t, out, "planned for 3.4 ms at the end (2.1 ms at least)")
	require.Contains(t, out, "peak at sink 1997 records in a 1 s window (0.999 of capacity), 420 in a 200 ms window (this run)")
	require.NotContains(t, out, "over capacity")

	s.MaxUnits1sWindow = 2300 // another client shared the sink
	b.Reset()
	s.WriteText(&b)
	require.Contains(t, b.String(), "over capacity at the sink although at most 1996 were sent in any second")
	require.Contains(t, b.String(), "another client of the sink")
}
