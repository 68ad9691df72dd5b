package worker_test

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/worker"
)

// probing attaches a capacity controller to a worker, as worker.Start does
// for the first worker of each process.
func (w *world) probing(pool lease.Pool) func(*worker.Worker) ingest.Runner {
	return func(wk *worker.Worker) ingest.Runner {
		ctrl, err := worker.NewController(pool, []redis.UniversalClient{w.redis}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), wk)
		require.NoError(w.t, err)
		return ctrl
	}
}

// The probe on virtual time: three workers, each its own process
// with its own controller, drain a backlog of 60,000 records into a sink
// provisioned for 1,500 records/s that nobody told them about (and for
// 1,200 and 1,550: where the first onset falls against the workers' own
// throttle cuts moves what the probe reads, and settling on what a window
// accepted read 81-93 % of 1,450-1,550). The pool starts at the probe's
// floor; within 30 s its capacity is at least 90 % of the sink's,
// throttled attempts stay within 2 % of the sends, and from the
// convergence on no sliding second at the sink holds more than its
// capacity.
// Both of the emulator's modes: a strict sliding window, and a token bucket
// with a second of capacity in reserve, which hides an overshoot until it
// runs dry and, refilled while the workers hold back, would read as
// capacity.
func TestProbeFindsTheSinksCapacity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode     string
		capacity int64
	}{
		{sinksim.ModeWindow, 1500}, {sinksim.ModeWindow, 1200}, {sinksim.ModeWindow, 1550},
		{sinksim.ModeBucket, 1500}, {sinksim.ModeBucket, 1200}, {sinksim.ModeBucket, 1550},
	} {
		t.Run(fmt.Sprintf("%s %d", tc.mode, tc.capacity), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const n = 60000
				capacity := tc.capacity
				w := newWorld(t, sinksim.Config{Capacity: capacity, Mode: tc.mode})
				pool := w.pool(lease.Pool{Name: "probed", Capacity: lease.DefaultProbeFloor, Partitions: 12,
					Source: lease.Source{Kind: lease.SourceProbe}})
				w.queue.add(records("p", n, nil)...)
				began := time.Now()
				var stops []func() error
				for _, id := range []string{"a", "b", "c"} {
					stops = append(stops, w.start(id, worker.Config{Pool: pool, IDField: "id"}, w.probing(pool)))
				}
				// Converged: from when the capacity stays within 90-100 % of
				// the sink's.
				var (
					converged time.Duration
					trace     []float64
				)
				for !w.queue.finished() && time.Since(began) < 5*time.Minute {
					time.Sleep(time.Second)
					st, err := lease.Status(t.Context(), w.redis, "", "probed")
					require.NoError(t, err)
					trace = append(trace, st.EffectiveRate)
					switch in := st.EffectiveRate >= 0.9*float64(capacity) && st.EffectiveRate <= float64(capacity); {
					case in && converged == 0:
						converged = time.Since(began)
					case !in:
						converged = 0
					}
				}
				w.drain(time.Minute, stops...)
				var tot ingest.Totals
				for _, wk := range w.workers {
					t := wk.Counters().Totals()
					tot.Attempts += t.Attempts
					tot.Throttled += t.Throttled
					tot.DeadLettered += t.DeadLettered
				}
				after := w.busiestBetween(time.Second, converged, time.Hour)
				t.Logf("capacity each second: %v", trace)
				t.Logf("converged to ≥ 90%% of %d after %s; %d of %d attempts throttled (%.2f %%); busiest second after: %d; stored %d in %s",
					capacity, converged, tot.Throttled, tot.Attempts, 100*float64(tot.Throttled)/float64(tot.Attempts), after, w.stored(), w.lastAccept())
				require.EqualValues(t, n, w.stored(), "every record once")
				require.Zero(t, tot.DeadLettered, "throttled records are never dead-lettered")
				require.NotZero(t, converged, "the capacity reached 90 %% of the sink's")
				require.LessOrEqual(t, converged, 30*time.Second, "within 30 s")
				require.LessOrEqual(t, float64(tot.Throttled), 0.02*float64(tot.Attempts), "throttled attempts ≤ 2 %% of the sends")
				require.LessOrEqual(t, after, capacity, "no sliding second over the sink's capacity after convergence")
			})
		})
	}
}
