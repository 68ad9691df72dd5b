//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/queue"
)

// BenchmarkAPIIntake drives sluice api, backed by the real broker, with
// concurrent clients posting the USGS records as NDJSON, 100 a request, for
// a bounded time, and reports the records/s the API acknowledged (every
// acknowledged record is in Kafka, written with RequireAll) and the request
// latency percentiles. make bench-api runs it; it asserts nothing about speed.
//
//	SLUICE_API_LOAD_SECONDS (default 10), SLUICE_API_LOAD_CLIENTS (default 16)
func BenchmarkAPIIntake(b *testing.B) {
	seconds, clients := envInt(b, "SLUICE_API_LOAD_SECONDS", 10), envInt(b, "SLUICE_API_LOAD_CLIENTS", 16)
	e := &env{t: b, name: fmt.Sprintf("apiload-%d", time.Now().UnixNano())}
	topic := e.name
	require.NoError(b, queue.EnsureTopic(b.Context(), []string{brokers}, topic, 6))

	dir := b.TempDir()
	types := filepath.Join(dir, "types.yaml")
	require.NoError(b, os.WriteFile(types, []byte("types:\n  earthquake:\n    topic: "+topic+"\n    id_field: id\n"), 0o600))
	tokens := filepath.Join(dir, "tokens")
	require.NoError(b, os.WriteFile(tokens, []byte("load-token earthquake\n"), 0o600))
	addr := freeAddr(b)
	e.start("api", "api", "--brokers", brokers, "--listen", addr, "--types", types, "--tokens-file", tokens)
	url := "http://" + addr + "/v1/records/earthquake"
	require.Eventually(b, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "sluice api did not start")

	bodies := usgsBatches(b, 100)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		records   int
		failures  int
	)
	b.ResetTimer()
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			var mine []time.Duration
			n, failed := 0, 0
			for i := c; time.Now().Before(deadline); i += clients {
				body := bodies[i%len(bodies)]
				began := time.Now()
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body.data))
				req.Header.Set("Content-Type", "application/x-ndjson")
				req.Header.Set("Authorization", "Bearer load-token")
				resp, err := client.Do(req)
				if err != nil {
					failed++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					failed++
					continue
				}
				mine = append(mine, time.Since(began))
				n += body.records
			}
			mu.Lock()
			latencies, records, failures = append(latencies, mine...), records+n, failures+failed
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	require.NotEmpty(b, latencies)
	ends, err := queue.Admin{Brokers: []string{brokers}}.EndOffsets(b.Context(), topic)
	require.NoError(b, err)
	var stored int64
	for _, end := range ends {
		stored += end
	}
	require.EqualValues(b, records, stored, "every acknowledged record is in the topic, once")
	slices.Sort(latencies)
	pct := func(p float64) float64 { return latencies[int(p*float64(len(latencies)-1))].Seconds() * 1000 }
	b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(failures), "failed-requests")
	b.Logf("%d clients, %d requests of ≤ 100 records in %.1f s: %.0f records/s acknowledged, p50 %.1f ms, p99 %.1f ms, %d failed",
		clients, len(latencies), elapsed.Seconds(), float64(records)/elapsed.Seconds(), pct(0.5), pct(0.99), failures)
}

type batch struct {
	data    []byte
	records int
}

// usgsBatches returns the USGS records as NDJSON bodies of n records.
func usgsBatches(tb testing.TB, n int) []batch {
	file, err := bulkload.OpenFile(usgs, "csv", "id")
	require.NoError(tb, err)
	var out []batch
	var cur batch
	for {
		rec, err := file.Next()
		if err == io.EOF {
			break
		}
		require.NoError(tb, err)
		cur.data = append(append(cur.data, rec.Value...), '\n')
		if cur.records++; cur.records == n {
			out, cur = append(out, cur), batch{}
		}
	}
	return out
}

func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(tb, err, name)
	return n
}
