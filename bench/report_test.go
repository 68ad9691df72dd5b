package bench

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEntryJSONRoundTrip(t *testing.T) {
	in := Entry{Alternative: "sluice", Reps: 3, Cols: []Col{
		{Name: "rows_per_s", Value: 225267},
		{Name: "ratio", Ideal: "≥ 0.70", Value: 0.551, Digits: 3},
		{Name: "missing", Value: math.NaN()},
	}, Extra: map[string]any{"series": []any{1.5, 2.0}}}
	data, err := json.Marshal(in)
	require.NoError(t, err)
	var out Entry
	require.NoError(t, json.Unmarshal(data, &out))
	again, err := json.Marshal(out)
	require.NoError(t, err)
	require.JSONEq(t, string(data), string(again))
	require.Equal(t, "≥ 0.70", out.Cols[1].Ideal)
	require.Equal(t, 3, out.Cols[1].Digits)
	require.Error(t, json.Unmarshal([]byte(`[1]`), &out))
}

// TestKeepHoldsTheOtherScenariosFigures writes a report, then keeps it
// under a report of another scenario: the first scenario's figures stay.
func TestKeepHoldsTheOtherScenariosFigures(t *testing.T) {
	path := filepath.Join(t.TempDir(), "results.json")
	old := Report{Commit: "abc", Scenarios: []Scenario{{ID: "9", Entries: []Entry{{Alternative: "load", Reps: 1, Cols: []Col{{Name: "peak_rss_mib", Ideal: "≤ 128", Value: 108.1, Digits: 1}}}}}}}
	data, err := json.Marshal(old)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, data, 0o600))

	rep := Report{Scenarios: []Scenario{{ID: "7"}}}
	rep.keep(path)
	require.Len(t, rep.Scenarios, 2)
	kept := rep.Scenarios[1]
	require.Equal(t, "abc", kept.Commit)
	require.Equal(t, old.Scenarios[0].Entries, kept.Entries)
}
