package stress

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
)

// Stress against a range-partitioned emulator over HTTP finds the range's
// limit: all its keys fall in one range, so the overall capacity never
// binds.
func TestStressFindsThePartitionLimit(t *testing.T) {
	t.Parallel()
	const limit = 500
	sim, err := sinksim.New(sinksim.Config{Capacity: 100_000, PartitionLimit: limit, SplitAfter: time.Hour})
	require.NoError(t, err)
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()
	client, err := sink.NewHTTP(sink.HTTPConfig{URL: srv.URL})
	require.NoError(t, err)

	rep, err := Stress(t.Context(), client, Config{Start: 400, Step: 25, Max: 1000, StepEvery: time.Second, Target: 450, Prefix: "p1"})
	require.NoError(t, err)
	for _, st := range rep.Steps {
		t.Logf("%+v", st)
	}
	require.Equal(t, "throttled", rep.StoppedBy)
	require.InEpsilon(t, limit, rep.Highest, 0.10, "within 10 %% of the partition limit")
	require.Equal(t, "meets target", rep.Verdict)
	require.Len(t, sim.Snapshot(false).Partitions, 1, "one range: every key on the stress partition")
	require.Less(t, rep.Steps[len(rep.Steps)-1].Rate, 700.0, "it stopped at the first throttled step")
}

func TestStressValidates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{Start: 10, Max: 5},
		{Start: 10, StepEvery: time.Millisecond},
		{Threshold: 1},
		{Target: -1},
	} {
		_, err := Stress(t.Context(), nil, cfg)
		require.Error(t, err, "%+v", cfg)
	}
}
