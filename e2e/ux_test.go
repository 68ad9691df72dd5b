//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
)

// What a user reads tells the truth (issue 26), against real Kafka and
// Redis and separate sluice processes.

// Two idle workers on real Kafka for a minute log no WARN line: idle
// fetch timeouts and the group's first rebalances are DEBUG.
func TestIdleWorkersLogNoWarn(t *testing.T) {
	e := newEnv(t, 1000, 10, 15*time.Second)
	w1, w2 := e.worker("w1"), e.worker("w2")
	e.awaitGroup(2)
	time.Sleep(60 * time.Second) // the case is the quiet minute itself
	for _, p := range []*proc{w1, w2} {
		data, err := os.ReadFile(p.log)
		require.NoError(t, err)
		var warns []string
		for _, l := range strings.Split(string(data), "\n") {
			if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
				warns = append(warns, l)
			}
		}
		require.Empty(t, warns, "%s logged WARNs while idle", p.name)
		require.Contains(t, string(data), "worker started")
	}
}

// A bulk load interrupted by Ctrl-C says so, with its exit code (130);
// the rerun resumes and finishes; a rerun of the finished load has
// nothing to do; a rerun with --no-resume finds every record at the
// emulator, and the summary counts the re-sent records at their cost and
// reports this run's figures at the shared emulator, not its lifetime's.
func TestLoadOutcomesAndReruns(t *testing.T) {
	e := newEnv(t, 1000, 10, 15*time.Second)
	path := head(t, 3000)
	args, summary, _ := e.bulkLoadArgs(e.sim, path)
	p := e.start("interrupted", args...)
	e.awaitAccepted(300, 30*time.Second)
	p.signal(t, syscall.SIGINT)
	code, ok := p.wait(30 * time.Second)
	require.True(t, ok, "the load stops on Ctrl-C")
	out, err := os.ReadFile(p.log)
	require.NoError(t, err)
	require.Equal(t, 130, code, "%s", out)
	require.Contains(t, string(out), "outcome      interrupted: interrupted (interrupt signal received) before the load finished; rerun the same command to resume (exit 130)")
	s := readSummaryFile(t, summary)
	require.Equal(t, bulkload.OutcomeInterrupted, s.Outcome)
	require.Equal(t, 130, s.ExitCode)

	code, output := e.run(2*time.Minute, args...)
	require.Equal(t, 0, code, output)
	require.Contains(t, output, "outcome      finished (exit 0)")
	s = readSummaryFile(t, summary)
	require.EqualValues(t, 3000, s.RecordsTotal)
	require.EqualValues(t, 3000, e.stats().Accepted, "every record stored once")

	code, output = e.run(time.Minute, args...)
	require.Equal(t, 0, code, output)
	require.Regexp(t, `outcome      nothing to do: load \S+ finished at `, output)
	require.NotContains(t, output, "resuming a load")
	require.EqualValues(t, 3000, e.stats().Accepted)

	before := e.stats()
	code, output = e.run(2*time.Minute, append(args[:len(args)-1], "--no-resume", path)...)
	require.Equal(t, 0, code, output)
	s = readSummaryFile(t, summary)
	t.Logf("all duplicates:\n%s", output)
	require.EqualValues(t, 0, s.RecordsDelivered)
	require.EqualValues(t, 3000, s.DuplicatesAtSink)
	require.EqualValues(t, 3000, s.UnitsSent, "every record sent at its cost")
	require.Greater(t, s.Utilization, 0.5, "re-sent records count: the capacity was used")
	require.Equal(t, bulkload.ScopeRunSeries, s.SinkStatsScope)
	require.NotNil(t, s.SinkStats)
	require.EqualValues(t, 0, s.SinkStats.Accepted, "this run's count at the emulator, not its lifetime's")
	require.EqualValues(t, 3000, s.SinkStats.Duplicates)
	require.Positive(t, s.MaxUnits1sWindow)
	require.LessOrEqual(t, float64(s.MaxUnits1sWindow), 1.01*1000)
	require.Greater(t, before.Accepted, s.SinkStats.Accepted)
	require.Contains(t, output, "(this run, from the sink's 200 ms series)")
}

// With --workers 0 the pods drain the topic: the summary reports no send
// side of its own, and the time the group committed the last record.
func TestWorkersZeroWithPods(t *testing.T) {
	e := newEnv(t, 1000, 10, 15*time.Second)
	e.worker("pod")
	e.awaitGroup(1)
	args, summary, _ := e.bulkLoadArgs(e.sim, head(t, 1000), "--workers", "0")
	code, output := e.run(2*time.Minute, args...)
	require.Equal(t, 0, code, output)
	require.Contains(t, output, "sink         not measured here: worker pods of the consumer group sent the records (--workers 0)")
	require.NotContains(t, output, "0 requests")
	require.Regexp(t, `the group committed the last record at \d+\.\d\d s`, output)
	s := readSummaryFile(t, summary)
	require.EqualValues(t, 1000, s.RecordsDelivered)
	require.Greater(t, s.LoadS, 0.5, "the pods' last commit, not the last produce")
	require.InDelta(t, s.ElapsedS, s.LoadS, 1.5)
}

// Loads without --pool share the pool "default"; one with another
// capacity is refused with the hint to pass --pool. A --dry-run of a
// worker from the example config checks Kafka, Redis, the pool and the
// sink and stores nothing; pool list and pool status read back.
func TestPoolDefaultsConfigAndDryRun(t *testing.T) {
	e := newEnv(t, 1000, 10, 15*time.Second)
	path := head(t, 50)
	load := func(capacity string) (int, string) {
		return e.run(time.Minute, "bulk-load", "--brokers", brokers, "--redis-addr", e.redis, "--sink", e.sim, "--topic", e.name,
			"--id-field", "id", "--capacity", capacity, "--no-resume", "--dead-letter-file", filepath.Join(t.TempDir(), "dl.ndjson"), path)
	}
	code, out := load("1000")
	require.Equal(t, 0, code, out)
	code, out = load("2000")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, `pool "default"`)
	require.Contains(t, out, "give it a pool of its own with --pool NAME")

	code, out = e.run(time.Minute, "worker", "--config", "../examples/worker.yaml", "--brokers", brokers, "--redis-addr", e.redis,
		"--sink", e.sim, "--topic", e.name, "--pool", e.name, "--capacity", "1000", "--log-format", "text", "--dry-run")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, fmt.Sprintf("pool      %s: capacity 1000 records/s, 20 partitions, ttl 15s (new: a run stores it)", e.name))
	require.Contains(t, out, fmt.Sprintf("topic     %s: 6 partitions", e.name))
	code, out = e.run(time.Minute, "pool", "status", "--redis-addr", e.redis, "--pool", e.name)
	require.Equal(t, 2, code, "the dry run stored no pool: %s", out)
	code, out = e.run(time.Minute, "pool", "list", "--redis-addr", e.redis)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "default  capacity 1000 records/s")
}

// A REST API that never sees the record ID (json-server with a body that
// carries none) stores a rerun twice: start-up warns, naming the fixes,
// and the summary says the API does not report duplicates.
func TestRESTWithoutDedupeIsExplicit(t *testing.T) {
	e := newEnv(t, 500, 5, 15*time.Second)
	api := startJSONServer(t, "quakes")
	path := head(t, 200)
	args, summary, _ := e.bulkLoadArgs("rest+"+api+"/quakes", path, "--sink-body", `{"mag": "{mag}", "place": "{place}"}`, "--no-resume")
	for run := 1; run <= 2; run++ {
		code, out := e.run(2*time.Minute, args...)
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "the REST API never sees a record's ID")
		require.Contains(t, out, "put {$id} in the URL")
		require.Contains(t, out, "--sink-idempotency-key")
		require.Contains(t, out, "200 written (the API does not report duplicates")
		require.True(t, readSummaryFile(t, summary).DuplicatesUnknown)
		require.Equal(t, 200*run, jsonServerCount(t, api, "quakes"), "what the warning is about")
	}
}
