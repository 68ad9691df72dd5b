package stress

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
)

// Stress against a range-partitioned emulator over HTTP finds the range's
// limit: all its keys fall in one range, so the overall capacity never
// binds. It runs on virtual time (the emulator is served in-process), so
// the figures do not depend on the machine's load.
func TestStressFindsThePartitionLimit(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const limit = 500
		sim, err := sinksim.New(sinksim.Config{Capacity: 100_000, PartitionLimit: limit, SplitAfter: time.Hour})
		require.NoError(t, err)
		client, err := sink.NewHTTP(sink.HTTPConfig{URL: "http://sink.test", Client: &http.Client{Transport: inProcess{sim.Handler()}}})
		require.NoError(t, err)

		rep, err := Stress(t.Context(), client, Config{Start: 400, Step: 25, Max: 1000, StepEvery: time.Second, Target: 450, Prefix: "p1"})
		require.NoError(t, err)
		for _, st := range rep.Steps {
			t.Logf("%+v", st)
		}
		require.Equal(t, "throttled", rep.StoppedBy)
		require.InEpsilon(t, limit, rep.Highest, 0.03, "within 3 %% of the partition limit")
		require.Equal(t, "meets target", rep.Verdict)
		require.Len(t, sim.Snapshot(false).Partitions, 1, "one range: every key on the stress partition")
		require.Less(t, rep.Steps[len(rep.Steps)-1].Rate, 700.0, "it stopped at the first throttled step")
	})
}

// inProcess serves requests with a handler in the same goroutine, with no
// connection: an HTTP client for a testing/synctest bubble.
type inProcess struct{ h http.Handler }

func (p inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	p.h.ServeHTTP(rec, r)
	res := rec.Result()
	res.Request = r
	return res, nil
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
