package metrics_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/pacing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCollectorAndServer(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.ClockTTL(true)
	rc := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rc.Close()
	pool := lease.Pool{Name: "quakes", Capacity: 1000, Partitions: 10}
	_, err := lease.EnsurePool(context.Background(), rc, "", pool)
	require.NoError(t, err)
	mgr, err := lease.New(lease.Config{Pool: pool, WorkerID: "w1", Reserved: 2}, rc)
	require.NoError(t, err)
	pacer, err := pacing.New(pacing.Config{}, mgr)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leasing := make(chan error, 1)
	go func() { leasing <- mgr.Run(ctx) }()
	require.Eventually(t, func() bool { return len(mgr.Held()) == 2 }, 5*time.Second, 5*time.Millisecond, "the reserved partitions")

	reg := prometheus.NewRegistry()
	col, err := metrics.New(reg)
	require.NoError(t, err)
	col.Add(metrics.Worker{Pool: "quakes", Lease: mgr, Pacer: pacer, Lag: func() int64 { return 400 }}, new(ingest.Counters))
	col.ObserveWrite("quakes")(100, 30*time.Millisecond)

	require.InDelta(t, 200, gaugeValue(t, reg, "sluice_leased_units_per_second"), 1e-9, "2 partitions of 100/s")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP sluice_leased_units_per_second The rate the worker's valid leases allow, in units/s, by the worker's priority class.
# TYPE sluice_leased_units_per_second gauge
sluice_leased_units_per_second{pool="quakes",priority="normal",worker="w1"} 200
`), "sluice_leased_units_per_second"), "the leased rate carries the worker's class")
	require.InDelta(t, 1000, gaugeValue(t, reg, "sluice_pool_capacity_units_per_second"), 1e-9)
	require.InDelta(t, 2, gaugeValue(t, reg, "sluice_leases_held"), 1e-9)
	require.InDelta(t, 2, gaugeValue(t, reg, "sluice_eta_seconds"), 1e-9, "400 records at 200 records/s")
	n, err := testutil.GatherAndCount(reg, "sluice_lease_events_total", "sluice_batch_duration_seconds", "sluice_records_total")
	require.NoError(t, err)
	require.Equal(t, 5+1+3, n)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems, "metric names and help follow the Prometheus conventions")

	// The server.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var notReady atomic.Bool
	serving := make(chan error, 1)
	go func() {
		serving <- httpserver.Serve(ctx, ln, metrics.Handler(reg, func(context.Context) error {
			if notReady.Load() {
				return errors.New("kafka unreachable")
			}
			return nil
		}), 5*time.Second)
	}()
	base := "http://" + ln.Addr().String()
	code, body := get(t, base+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `sluice_leases_held{pool="quakes",worker="w1"} 2`)
	code, _ = get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code)
	notReady.Store(true)
	code, body = get(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "kafka unreachable")

	cancel()
	require.NoError(t, <-serving)
	require.NoError(t, <-leasing)
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// TestDemandAndRedisUnreachable: the demand a worker announces is
// reported finite (capped at the pool's effective rate), and the time its
// Redis has been unreachable rises while Redis is down and drops to 0
// once Redis answers again.
func TestDemandAndRedisUnreachable(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.ClockTTL(true)
	rc := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	defer rc.Close()
	pool := lease.Pool{Name: "quakes", Capacity: 1000, Partitions: 10}
	_, err := lease.EnsurePool(context.Background(), rc, "", pool)
	require.NoError(t, err)
	// A keep-alive of 200 ms: an outage shows within it.
	mgr, err := lease.New(lease.Config{Pool: pool, WorkerID: "w1", KeepAlive: 200 * time.Millisecond}, rc)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	col, err := metrics.New(reg)
	require.NoError(t, err)
	col.Add(metrics.Worker{Pool: "quakes", Lease: mgr}, nil)

	expect := func(demand, unreachable string) string {
		return `
# HELP sluice_demand_units_per_second The demand the worker announces to its pool, capped at the pool's effective rate, in units/s.
# TYPE sluice_demand_units_per_second gauge
sluice_demand_units_per_second{pool="quakes",worker="w1"} ` + demand + `
# HELP sluice_redis_unreachable_seconds Seconds the worker's Redis calls have been failing without a success, 0 while Redis answers.
# TYPE sluice_redis_unreachable_seconds gauge
sluice_redis_unreachable_seconds{pool="quakes",worker="w1"} ` + unreachable + "\n"
	}
	compare := func(demand, unreachable string) {
		t.Helper()
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expect(demand, unreachable)),
			"sluice_demand_units_per_second", "sluice_redis_unreachable_seconds"))
	}
	compare("0", "0")
	mgr.SetDemand(math.Inf(1)) // a backlog the current rate cannot drain
	compare("1000", "0")
	mgr.SetDemand(250)
	compare("250", "0")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leasing := make(chan error, 1)
	go func() { leasing <- mgr.Run(ctx) }()
	require.Eventually(t, func() bool { return len(mgr.Held()) == 3 }, 5*time.Second, 5*time.Millisecond, "250/s of 100/s partitions")
	unreachable := func() float64 { return gaugeValue(t, reg, "sluice_redis_unreachable_seconds") }
	require.Zero(t, unreachable(), "Redis answers")

	mr.Close()
	require.Eventually(t, func() bool { return unreachable() > 0 }, 5*time.Second, 10*time.Millisecond, "Redis is down")
	first := unreachable()
	require.Eventually(t, func() bool { return unreachable() >= first+0.3 }, 5*time.Second, 10*time.Millisecond,
		"the time keeps growing while Redis stays down")
	require.InDelta(t, 250, gaugeValue(t, reg, "sluice_demand_units_per_second"), 1e-9, "the demand does not depend on Redis")

	require.NoError(t, mr.Restart())
	require.Eventually(t, func() bool { return unreachable() == 0 }, 5*time.Second, 10*time.Millisecond, "Redis answers again")
	cancel()
	require.NoError(t, <-leasing)
}
