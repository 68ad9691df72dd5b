package lease

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRampFormula(t *testing.T) {
	t.Parallel()
	e := time.Unix(1_700_000_000, 0)
	s := schedule{pool: Pool{Capacity: 10_000, Partitions: 10, Ramp: RampGCS}, epoch: e}
	require.Equal(t, 1000.0, s.effective(e.Add(-time.Hour)), "before the epoch: the start")
	require.Equal(t, 1000.0, s.effective(e))
	require.InDelta(t, 2000, s.effective(e.Add(20*time.Minute)), 1e-9, "doubles every 20 minutes")
	require.InDelta(t, 1000*math.Sqrt2, s.effective(e.Add(10*time.Minute)), 1e-9, "continuously")
	require.Equal(t, 10_000.0, s.effective(e.Add(3*time.Hour)), "capped at the capacity")
	require.InDelta(t, 200, s.partitionRate(e.Add(20*time.Minute)), 1e-9, "partitions follow the effective rate")
	require.Equal(t, 1000.0, schedule{pool: s.pool}.effective(e.Add(time.Hour)), "no epoch yet: the start")
	require.Equal(t, 10_000.0, schedule{pool: Pool{Capacity: 10_000, Partitions: 10}}.effective(e), "no ramp: the capacity")

	f := schedule{pool: Pool{Capacity: 10_000, Partitions: 10, Ramp: RampFirestore}, epoch: e}
	require.InDelta(t, 750, f.effective(e.Add(5*time.Minute)), 1e-9, "500, ×1.5 every 5 minutes")
}

func TestPartitionCreditIsTheIntegral(t *testing.T) {
	t.Parallel()
	e := time.Unix(1_700_000_000, 0)
	ramp := Ramp{Start: 100, Factor: 2, Period: 2 * time.Second}
	for _, tc := range []struct {
		name string
		s    schedule
	}{
		{"flat", schedule{pool: Pool{Capacity: 1000, Partitions: 4}}},
		{"ramp to the cap", schedule{pool: Pool{Capacity: 1000, Partitions: 4, Ramp: ramp}, epoch: e}},
		{"switch down", schedule{pool: Pool{Capacity: 500, Partitions: 5, Switch: &Switch{At: e.Add(3 * time.Second), Capacity: 1000, Partitions: 4}}}},
		{"ramp and switch up", schedule{pool: Pool{Capacity: 2000, Partitions: 8, Ramp: ramp, Switch: &Switch{At: e.Add(5 * time.Second), Capacity: 1000, Partitions: 4}}, epoch: e}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, w := range [][2]time.Duration{{-time.Second, 2 * time.Second}, {0, 10 * time.Second}, {2500 * time.Millisecond, 7 * time.Second}, {9 * time.Second, 12 * time.Second}} {
				from, to := e.Add(w[0]), e.Add(w[1])
				const step = 100 * time.Microsecond
				var sum float64
				for t := from; t.Before(to); t = t.Add(step) {
					sum += tc.s.partitionRate(t.Add(step/2)) * step.Seconds()
				}
				require.InDelta(t, sum, tc.s.partitionCredit(from, to), 1e-3*math.Max(1, sum), "window %v", w)
			}
		})
	}
}

func TestPoolJSONRoundTrip(t *testing.T) {
	t.Parallel()
	p := Pool{Name: "q", Capacity: 500, Unit: "cost", Partitions: 5, TTL: 15 * time.Second,
		Ramp:   Ramp{Start: 100, Factor: 1.5, Period: time.Minute, IdleReset: time.Hour},
		Switch: &Switch{At: time.UnixMilli(1_700_000_000_123), Capacity: 1000, Partitions: 10}}
	data, err := json.Marshal(p)
	require.NoError(t, err)
	var got Pool
	require.NoError(t, json.Unmarshal(data, &got))
	require.Equal(t, p, got)
	require.Contains(t, p.String(), "ramp 100/s ×1.5 every 1m0s")
}

func TestRampValidation(t *testing.T) {
	t.Parallel()
	base := Pool{Name: "r", Capacity: 100, Partitions: 2}
	for _, r := range []Ramp{{Start: 10, Factor: 1, Period: time.Minute}, {Start: 10, Factor: 2, Period: time.Millisecond}, {Start: math.Inf(1), Factor: 2, Period: time.Minute}} {
		p := base
		p.Ramp = r
		require.ErrorIs(t, p.Validate(), ErrInvalidPool, "%+v", r)
	}
}
