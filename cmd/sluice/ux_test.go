package main

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
)

// badIDs writes n USGS rows whose id column is empty in 3 of 10 rows and
// repeats one of 40 values in the others: a wrong --id-field.
func badIDs(t *testing.T, n int) string {
	t.Helper()
	f, err := os.Open("../../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	id := -1
	for i, h := range rows[0] {
		if h == "id" {
			id = i
		}
	}
	out := [][]string{rows[0]}
	for i, r := range rows[1 : n+1] {
		r = append([]string(nil), r...)
		if i%10 < 3 {
			r[id] = ""
		} else {
			r[id] = "x" + strconv.Itoa(i%40)
		}
		out = append(out, r)
	}
	path := filepath.Join(t.TempDir(), "badids.csv")
	g, err := os.Create(path)
	require.NoError(t, err)
	w := csv.NewWriter(g)
	require.NoError(t, w.WriteAll(out))
	require.NoError(t, g.Close())
	return path
}

// Item 1: an ID column empty in many rows stops the load with exit 3 and
// the documented message, never an internal error, every time.
func TestWrongIDFieldStopsWithExit3(t *testing.T) {
	path := badIDs(t, 3000)
	for range 3 {
		summary := filepath.Join(t.TempDir(), "summary.json")
		code, stdout, stderr := runCLI(t, "bulk-load", "--embedded", "--capacity", "2000", "--id-field", "id", "--topic", "bad",
			"--summary-json", summary, path)
		require.Equal(t, exitDeadLetters, code, "stderr:\n%s", stderr)
		require.Regexp(t, `sluice: too many dead letters: \d+ of \d+ rows read \(the limit is 1 %\)`, stderr)
		require.NotContains(t, stderr, "context canceled")
		require.Contains(t, stdout, "outcome      stopped: too many dead letters:")
		require.Contains(t, stdout, "(exit 3)")
		s := readSummary(t, summary)
		require.Equal(t, bulkload.OutcomeStopped, s.Outcome)
		require.Equal(t, exitDeadLetters, s.ExitCode)
		require.Greater(t, s.RecordsDeadLettered, int64(100))
	}
}

// Item 3: with --workers 0 the summary reports no send side of its own
// and never "0 requests"; every figure it shows is the pods'.
func TestWorkersZeroSummaryDoesNotContradictItself(t *testing.T) {
	redis := miniredis.RunT(t)
	path := sample(t, 200)
	code, stdout, stderr := runCLI(t, "bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--capacity", "2000", "--id-field", "id",
		"--topic", "pods", "--workers", "0", "--sink-timeout", "1s", path)
	require.Equal(t, exitFailure, code, stderr) // no pod drains the in-process broker
	require.Contains(t, stdout, "sink         not measured here: worker pods of the consumer group sent the records (--workers 0)")
	require.NotContains(t, stdout, "0 requests")
	require.NotContains(t, stdout, "sent         at most")
	require.NotContains(t, stdout, "last record")
	require.Contains(t, stdout, "the group committed 0 records")
	require.Contains(t, stdout, "outcome      failed: ")
}

// Item 3: a rerun that finds everything at the sink counts the re-sent
// records at their cost; a rerun of a finished load does nothing and says
// so.
func TestRerunsSayWhatHappened(t *testing.T) {
	redis := miniredis.RunT(t)
	dir := t.TempDir()
	path := sample(t, 600)
	args := []string{"bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--capacity", "1000", "--id-field", "id", "--topic", "again"}
	code, _, stderr := runCLI(t, append(args, "--summary-json", filepath.Join(dir, "1.json"), path)...)
	require.Equal(t, exitOK, code, stderr)
	first := readSummary(t, filepath.Join(dir, "1.json"))
	require.Equal(t, bulkload.OutcomeFinished, first.Outcome)

	// The same command again: nothing to do.
	code, stdout, stderr := runCLI(t, append(args, "--summary-json", filepath.Join(dir, "2.json"), path)...)
	require.Equal(t, exitOK, code, stderr)
	require.Regexp(t, `outcome      nothing to do: load [0-9a-f]+ finished at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(600 rows\); --no-resume loads it again \(exit 0\)`, stdout)
	require.NotContains(t, stderr, "resuming")
	second := readSummary(t, filepath.Join(dir, "2.json"))
	require.Equal(t, bulkload.OutcomeNothingToDo, second.Outcome)
	require.Equal(t, first.LoadID, second.LoadID)

	// --no-resume loads it again: the sink (the same in-process emulator
	// is gone, so a fresh one) — here the point is the utilization:
	// records re-sent count at their cost, whatever the sink says.
	code, stdout, stderr = runCLI(t, append(args, "--no-resume", "--summary-json", filepath.Join(dir, "3.json"), path)...)
	require.Equal(t, exitOK, code, stderr)
	third := readSummary(t, filepath.Join(dir, "3.json"))
	require.EqualValues(t, 600, third.UnitsSent)
	require.InDelta(t, 0.6, third.IdealS, 1e-9)
	require.Greater(t, third.Utilization, 0.3)
	require.Contains(t, stdout, "600 records sent at 1000 records/s")
}

// Item 6: a second load with another capacity in the shared default pool
// is refused with a message that names --pool.
func TestPoolMismatchNamesPool(t *testing.T) {
	redis := miniredis.RunT(t)
	path := sample(t, 10)
	code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--capacity", "2000", "--id-field", "id", path)
	require.Equal(t, exitOK, code, stderr)
	code, _, stderr = runCLI(t, "bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--capacity", "1000", "--id-field", "id", path)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, `pool "default"`)
	require.Contains(t, stderr, "give it a pool of its own with --pool NAME")
	require.Contains(t, stderr, "sluice pool set --pool NAME --capacity N")

	// pool list and pool status: finite numbers, one line per worker.
	code, stdout, stderr := runCLI(t, "pool", "list", "--redis-addr", redis.Addr())
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "default  capacity 2000 records/s, 20 partitions")
	code, stdout, stderr = runCLI(t, "pool", "status", "--redis-addr", redis.Addr())
	require.Equal(t, exitOK, code, stderr)
	require.NotContains(t, stdout, "Inf")
	require.Contains(t, stdout, "free partitions: 20 of 20 (0-19)")
}

// Item 6: a worker needs --sink and --topic; a sink URL error shows what
// one looks like; --embedded's dead letters go beside the summary, once
// each across reruns.
func TestDefaultsThatDoNotSurprise(t *testing.T) {
	code, _, stderr := runCLI(t, "worker", "--capacity", "10", "--sink", "http://127.0.0.1:1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--topic: required")
	code, _, stderr = runCLI(t, "worker", "--capacity", "10", "--topic", "t")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--sink: required")
	code, _, stderr = runCLI(t, "worker", "--capacity", "10", "--topic", "t", "--sink", "127.0.0.1:45100")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "a sink URL looks like http://host:port")
	code, _, stderr = runCLI(t, "bulk-load", "--capacity", "10", sample(t, 1))
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--sink: required")
	require.Contains(t, stderr, "or --embedded")

	require.Equal(t, filepath.Join("out", "quakes.dlq.ndjson"), defaultDeadLetterFile(filepath.Join("out", "s.json"), "quakes"))
	require.Equal(t, filepath.Join(".sluice", "quakes.dlq.ndjson"), defaultDeadLetterFile("", "quakes"))
	redis := miniredis.RunT(t)
	dir := t.TempDir()
	path := sample(t, 50, ",,,,,,,,,,,,,,,,,,,,,\n", "a,b\n")
	for range 2 {
		code, _, stderr = runCLI(t, "bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--no-resume", "--capacity", "1000", "--id-field", "id",
			"--topic", "dl", "--dead-letter-file", filepath.Join(dir, "dl.dlq.ndjson"), path)
		require.Equal(t, exitDeadLetters, code, stderr)
	}
	data, err := os.ReadFile(filepath.Join(dir, "dl.dlq.ndjson"))
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(string(data), "\n"), "two bad rows, one line each after two runs:\n%s", data)
}

// Item 7: every flag can come from --config; flags and SLUICE_* override
// it; a key that names no flag is refused, with the closest one.
func TestConfigFileAndFlagsOverridingIt(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "load.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte("embedded: true\ncapacity: 5000\ntopic: fromfile\nid-field: id\nworkers: 2\npartitions: 10\nsim-latency: 0s\n"), 0o600))
	summary := filepath.Join(dir, "s.json")
	t.Setenv("SLUICE_PARTITIONS", "5")
	code, _, stderr := runCLI(t, "bulk-load", "--config", cfg, "--capacity", "3000", "--summary-json", summary, sample(t, 300))
	require.Equal(t, exitOK, code, stderr)
	s := readSummary(t, summary)
	require.Equal(t, 3000.0, s.CapacityUnitsPerS, "the flag wins over the file")
	require.Equal(t, 2, s.Workers, "the file's workers")
	require.EqualValues(t, 300, s.RecordsDelivered)
	require.Contains(t, stderr, "fromfile", "the file's topic")
	code, stdout, stderr := runCLI(t, "bulk-load", "--config", cfg, "--capacity", "3000", "--dry-run", sample(t, 3))
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "capacity 3000 records/s, 5 partitions", "SLUICE_PARTITIONS wins over the file, the flag too")
	require.Contains(t, stdout, "topic     fromfile:")

	require.NoError(t, os.WriteFile(cfg, []byte("embedded: true\ncapcity: 5000\n"), 0o600))
	code, _, stderr = runCLI(t, "bulk-load", "--config", cfg, sample(t, 1))
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, `"capcity" is not a flag of this command (did you mean "capacity"?)`)
	require.NoError(t, os.WriteFile(cfg, []byte("capacity: lots\n"), 0o600))
	code, _, stderr = runCLI(t, "bulk-load", "--config", cfg, sample(t, 1))
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, `--capacity: want a number of units/s, sink (read it from the sink) or probe (find it), got "lots"`)
}

// The example config files parse, with every key a flag of their command.
func TestExampleConfigFiles(t *testing.T) {
	app := newApp(&lockedBuffer{}, &lockedBuffer{})
	for _, name := range []string{"worker", "bulk-load"} {
		cmd := app.Command(name)
		require.NotNil(t, cmd)
		values, err := readConfig("../../examples/"+name+".yaml", cmd.Flags)
		require.NoError(t, err, name)
		require.Greater(t, len(values), 10, name)
	}
}

// Item 7: --dry-run checks everything, prints what would run, and
// writes nothing; a problem is exit 2.
func TestDryRun(t *testing.T) {
	redis := miniredis.RunT(t)
	path := sample(t, 120, "broken,row\n")
	code, stdout, stderr := runCLI(t, "bulk-load", "--config", "../../examples/bulk-load.yaml", "--redis-addr", redis.Addr(),
		"--summary-json", filepath.Join(t.TempDir(), "s.json"), "--dry-run", path)
	require.Equal(t, exitOK, code, stderr)
	for _, want := range []string{
		"dry run: every check passed; nothing was stored, created, produced or written",
		"pool      earthquakes: capacity 2000 records/s, 20 partitions, ttl 15s (new: a run stores it)",
		"topic     earthquakes: new: a run creates it with 6 partitions",
		"input     " + path + ": 121 rows, 1 of them to be dead-lettered",
		"group     sluice-earthquakes, 2 worker(s) here",
	} {
		require.Contains(t, stdout, want)
	}
	require.Empty(t, redis.Keys(), "nothing stored in Redis")

	// The stored definition disagrees: exit 2, naming it.
	code, _, stderr = runCLI(t, "bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--pool", "p", "--capacity", "100", "--id-field", "id", path)
	require.Equal(t, exitDeadLetters, code, stderr)
	code, _, stderr = runCLI(t, "bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--pool", "p", "--capacity", "200", "--id-field", "id", "--dry-run", path)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--pool NAME")
	// A sink that does not answer: exit 2.
	code, _, stderr = runCLI(t, "worker", "--redis-addr", redis.Addr(), "--brokers", "127.0.0.1:1", "--topic", "t", "--sink", "http://127.0.0.1:1", "--capacity", "10", "--dry-run")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "dry run:")
}
