package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/bulkload"
)

// sample writes the first n rows of the USGS file (plus extra raw lines) to a
// temporary CSV.
func sample(t *testing.T, n int, extra ...string) string {
	t.Helper()
	data, err := os.ReadFile("../../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(t, err)
	lines := strings.SplitAfter(string(data), "\n")
	out := strings.Join(lines[:n+1], "") + strings.Join(extra, "")
	path := filepath.Join(t.TempDir(), "sample.csv")
	require.NoError(t, os.WriteFile(path, []byte(out), 0o600))
	return path
}

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCLIWithStdin(t, strings.NewReader(""), args...)
}

// runCLIWithStdin runs the CLI with stdin as its standard input.
func runCLIWithStdin(t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	if len(args) > 0 && args[0] == "bulk-load" && !slices.Contains(args, "--dead-letter-file") {
		// --embedded writes dead letters to <topic>.dlq.ndjson in the
		// working directory; a test keeps its own.
		args = slices.Insert(args, 1, "--dead-letter-file", filepath.Join(t.TempDir(), "dlq.ndjson"))
	}
	var out, errOut lockedBuffer // go-redis logs from goroutines of its own through the logger a command installs
	code = run(append([]string{"sluice"}, args...), stdin, &out, &errOut)
	return code, out.String(), errOut.String()
}

func readSummary(t *testing.T, path string) bulkload.Summary {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var s bulkload.Summary
	require.NoError(t, json.Unmarshal(data, &s))
	return s
}

// Two in-process workers, embedded Kafka, embedded Redis and the sink
// emulator: every record exactly once at the sink, no sliding second over
// capacity at send time (the sink side is judged on virtual time in
// package worker and on the wall clock in e2e).
func TestBulkLoadEmbeddedTwoWorkers(t *testing.T) {
	summary := filepath.Join(t.TempDir(), "summary.json")
	code, stdout, stderr := runCLI(t, "bulk-load", "--embedded", "--capacity", "1000", "--partitions", "10",
		"--workers", "2", "--id-field", "id", "--topic", "quakes", "--summary-json", summary, sample(t, 2500))
	require.Equal(t, exitOK, code, "stderr:\n%s", stderr)
	require.Contains(t, stdout, "2500 delivered")
	s := readSummary(t, summary)
	t.Logf("summary: %+v", s)
	require.Equal(t, int64(2500), s.RecordsTotal)
	require.Equal(t, int64(2500), s.RecordsDelivered)
	require.Equal(t, int64(0), s.RecordsDeadLettered)
	require.Equal(t, int64(0), s.DuplicatesAtSink)
	require.Equal(t, int64(0), s.SinkThrottled)
	require.NotNil(t, s.SinkStats)
	require.Equal(t, int64(2500), s.SinkStats.Accepted, "every record stored once")
	require.Positive(t, s.SendMaxUnits1s)
	require.LessOrEqual(t, s.SendMaxUnits1s, int64(1000), "no sliding second over capacity at send time")
	require.Positive(t, s.MaxUnits1sWindow, "the sink's own figure is reported")
	require.Positive(t, s.Utilization)
}

func TestBulkLoadDeadLettersMalformedRowsAndDeliversTheRest(t *testing.T) {
	summary := filepath.Join(t.TempDir(), "summary.json")
	path := sample(t, 300, "broken,row\n")
	code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--capacity", "5000", "--id-field", "id",
		"--summary-json", summary, path)
	require.Equal(t, exitDeadLetters, code, "stderr:\n%s", stderr)
	require.Contains(t, stderr, "sample.csv:302: wrong number of fields")
	s := readSummary(t, summary)
	require.Equal(t, int64(301), s.RecordsTotal)
	require.Equal(t, int64(300), s.RecordsDelivered)
	require.Equal(t, int64(1), s.RecordsDeadLettered)
}

func TestPoolDefinitionMismatchIsRefused(t *testing.T) {
	redis := miniredis.RunT(t)
	path := sample(t, 10)
	code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--pool", "p",
		"--capacity", "2000", "--id-field", "id", path)
	require.Equal(t, exitOK, code, stderr)
	code, _, stderr = runCLI(t, "bulk-load", "--embedded", "--redis-addr", redis.Addr(), "--pool", "p",
		"--capacity", "1000", "--id-field", "id", path)
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "2000")
	require.Contains(t, stderr, "1000")
}

func TestUsageErrorsNameTheProblem(t *testing.T) {
	path := sample(t, 1)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bulk-load", "--no-such-flag", path}, "flag provided but not defined: -no-such-flag"},
		{[]string{"bulk-load", "--embedded", path}, "--capacity"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--unit", "apples", path}, `--unit: unknown unit "apples"`},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--partitions", "0", path}, "--partitions"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10"}, "at least one input"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "-"}, "--format: standard input (-): cannot tell its format; set it to csv or ndjson"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--compression", "lzma", path}, "--compression: want auto, none, gzip or zstd"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--csv-types", "typed", path}, "--csv-types: want auto or string"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--kafka-compression", "lzma", path}, `--kafka-compression: queue: invalid configuration: unknown compression "lzma"`},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", filepath.Join(filepath.Dir(path), "*.nope.csv")}, "the pattern matches no file"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--id-field", "nope", path}, "--id-field: " + path + `: "nope" is not a column`},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "missing.csv"}, "missing.csv"},
		{[]string{"worker", "--capacity", "10", "--sink", "ftp://x"}, "--sink"},
		{[]string{"worker", "--capacity", "10", "--priority", "urgent"}, `--priority: unknown priority class "urgent"`},
		{[]string{"worker", "--capacity", "10", "--weight", "0"}, "--weight: must be a positive integer, got 0"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--priority", "top", path}, `--priority: unknown priority class "top"`},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--weight", "-1", path}, "--weight: must be a positive integer, got -1"},
		// The preflight: every field the settings read is in the file.
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--id-field", "id", "--sink-key", "{tiem}/{id}", path}, `--sink-key: field "tiem" is not in the input`},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--id-field", "id", "--sink", "rest+http://127.0.0.1:1/quakes/{code}", path}, `--sink: field "code" is not in the input`},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--id-field", "id", "--sink", "rest+http://127.0.0.1:1/quakes", "--sink-body", `{"m":"{magnitude}"}`, path}, `--sink-body: field "magnitude" is not in the input`},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--sink", "rest+http://{host}/quakes", path}, "--sink: sink URL: url"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--sink", "rest+http://h/q", "--sink-body", `{"m":`, path}, "--sink-body: body template"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--sink", "rest+http://h/q", "--sink-method", "GET", path}, "--sink-method"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--sink", "rest+http://h/q", "--sink-retry-on", "2xx", path}, "--sink-retry-on: status \"2xx\""},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--sink", "rest+http://h/q", "--sink-dead-letter-on", "400,429", path}, "429 is never a verdict"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--max-dead-letters", "lots", path}, "--max-dead-letters"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--send-guard", "1s", path}, "--send-guard"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--max-in-flight-bytes", "100", path}, "--max-in-flight-bytes"},
		{[]string{"bulk-load", "--embedded", "--capacity", "10", "--max-in-flight", "-1", path}, "--max-in-flight"},
		// Unknown commands are usage errors too, with the closest there is.
		{[]string{"wroker"}, `unknown command "wroker". Did you mean "worker"?`},
		{[]string{"worker", "--brokerz", "x"}, `flag provided but not defined: -brokerz. Did you mean "--brokers"?`},
		{[]string{"pool", "lsit"}, `unknown command "lsit". Did you mean "list"?`},
		{[]string{"help"}, `use "sluice --help"`},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

// --embedded refuses an input its in-process broker cannot hold, with the
// command that loads it through real services instead (exit 2).
func TestEmbeddedRefusesLargeInputs(t *testing.T) {
	code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--capacity", "10", "--id-field", "id", "--dead-letter-file", "dlq.ndjson",
		"--embedded-max-input", "1", "../../testdata/usgs-earthquakes-2025-05.csv")
	require.Equal(t, exitUsage, code, stderr)
	require.Equal(t, "sluice: --embedded: the input is about 1.8 MiB (uncompressed estimate), over --embedded-max-input 1 MiB: "+
		"the in-process Kafka broker keeps every record in memory (about 10 times the CSV size). Load it through real services instead:\n"+
		"  scripts/kafka.sh start; scripts/redis.sh start; sluice sink-sim --capacity 10 & sluice bulk-load --capacity 10 --dead-letter-file dlq.ndjson "+
		"--id-field id --brokers 127.0.0.1:19092 --redis-addr 127.0.0.1:16379 --sink http://127.0.0.1:8088 ../../testdata/usgs-earthquakes-2025-05.csv\n", stderr)
}

// The tests that run the app are not parallel: urfave/cli's help flag is
// a package variable every app run sets (the race detector sees two apps
// parsing at once).
func TestVersion(t *testing.T) {
	code, stdout, _ := runCLI(t, "--version")
	require.Equal(t, exitOK, code)
	require.Regexp(t, `^sluice version \S+`, stdout)
}

func TestEveryFlagHasAnEnvVar(t *testing.T) {
	t.Parallel()
	app := newApp(&bytes.Buffer{}, &bytes.Buffer{})
	for _, cmd := range app.Commands {
		cmds := append([]*cli.Command{cmd}, cmd.Subcommands...)
		for _, c := range cmds {
			for _, f := range c.Flags {
				env, ok := f.(interface{ GetEnvVars() []string })
				require.True(t, ok)
				name := f.Names()[0]
				require.Equal(t, "SLUICE_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_")), env.GetEnvVars()[0], "%s --%s", c.Name, name)
				require.Len(t, env.GetEnvVars(), len(f.Names()), "%s --%s: one variable per name", c.Name, name)
			}
		}
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
