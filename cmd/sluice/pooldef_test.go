package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sinksim"
)

// A rolling restart after `sluice pool set`: a worker started with the
// flags its pods always had (capacity 2000, 20 partitions) finds the
// definition changed live (capacity 1000, 10 partitions), runs with the
// stored one, says so naming both, and its metrics show the stored
// capacity. Under Kubernetes a refusal here would be a crash loop.
func TestWorkerAdoptsAPoolChangedBySet(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.ClockTTL(true)
	rc := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rc.Close()
	_, url := startSim(t, sinksim.Config{Capacity: 2000})
	kafka, err := queue.StartEmbedded(t.Context())
	require.NoError(t, err)
	defer kafka.Close()
	brokers := strings.Join(kafka.Addrs(), ",")

	// The first deployment defined the pool; an operator then halved it.
	_, err = lease.EnsurePool(t.Context(), rc, "", lease.Pool{Name: "quakes", Capacity: 2000, Partitions: 20})
	require.NoError(t, err)
	code, stdout, stderr := runCLI(t, "pool", "set", "--redis-addr", mr.Addr(), "--pool", "quakes",
		"--capacity", "1000", "--partitions", "10", "--switch-after", "1s")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "capacity 1000 records/s, 10 partitions")

	// A pod restarted with its original flags.
	metricsAddr := closedAddr(t)
	var logs lockedBuffer
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- newApp(io.Discard, &logs).RunContext(ctx, []string{"sluice", "worker",
			"--brokers", brokers, "--redis-addr", mr.Addr(), "--sink", url, "--topic", "quakes",
			"--pool", "quakes", "--capacity", "2000", "--partitions", "20", "--metrics-addr", metricsAddr})
	}()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "worker started") }, 30*time.Second, 20*time.Millisecond,
		"the worker did not start:\n%s", logs.String())
	out := logs.String()
	require.Contains(t, out, `msg="pool defined differently in Redis; running with the stored definition"`)
	require.Contains(t, out, `stored="capacity 1000 records/s, 10 partitions, ttl 15s"`, "names the stored definition")
	require.Contains(t, out, `given="capacity 2000 records/s, 20 partitions, ttl 15s"`, "and the flags'")

	// It runs with the stored capacity once the switch instant has passed.
	want := `sluice_pool_capacity_units_per_second{pool="quakes"} 1000`
	require.Eventually(t, func() bool { return strings.Contains(scrape(t, metricsAddr), want) }, 10*time.Second, 50*time.Millisecond,
		"the worker's metrics show the stored capacity:\n%s", scrape(t, metricsAddr))
	select {
	case err := <-done:
		require.Failf(t, "the worker stopped", "%v\n%s", err, logs.String())
	default:
	}
	cancel()
	require.NoError(t, <-done, "a clean stop")

	// A definition that disagrees with a pool nobody changed live is a
	// conflict (two deployments disagreeing on a new pool): refused, both
	// values named.
	_, err = lease.EnsurePool(t.Context(), rc, "", lease.Pool{Name: "fresh", Capacity: 2000, Partitions: 20})
	require.NoError(t, err)
	code, _, stderr = runCLI(t, "worker", "--brokers", brokers, "--redis-addr", mr.Addr(), "--sink", url, "--topic", "fresh",
		"--pool", "fresh", "--capacity", "1500", "--partitions", "20")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, `pool "fresh" is defined in Redis (sluice:fresh:def) with capacity 2000 records/s, 20 partitions`)
	require.Contains(t, stderr, "this worker was started with capacity 1500 records/s, 20 partitions")
}

// scrape returns the text of a metrics server's /metrics, or "" while it
// does not answer.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://%s/metrics", addr))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}
