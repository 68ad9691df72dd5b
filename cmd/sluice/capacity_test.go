package main

import (
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinksim"
)

// These tests run bulk-load in-process against embedded Kafka and Redis and
// a sink emulator the test owns. They check what the command does and the
// send side of the rate promise, which the pacer keeps exactly whatever the
// load on the machine; the sink side is judged on virtual time in package
// worker, and on the wall clock in e2e and the benchmarks.

func startSim(t *testing.T, cfg sinksim.Config) (*sinksim.Sim, string) {
	t.Helper()
	sim, err := sinksim.New(cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	return sim, srv.URL
}

func ndjson(t *testing.T, n int, value func(i int) string) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		b.WriteString(value(i))
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "records.ndjson")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

func TestBulkLoadOfARecordTypeValidatesEachRow(t *testing.T) {
	sim, url := startSim(t, sinksim.Config{Capacity: 5000})
	// A row without the "time" the schema requires: the type's schema
	// check dead-letters it with its file:line before it is produced, its
	// neighbours load.
	path := sample(t, 200, strings.Repeat(",", 11)+"nc-no-time"+strings.Repeat(",", 10)+"\n")
	summary := filepath.Join(t.TempDir(), "summary.json")
	code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--sink", url, "--types", "../../examples/types.yaml", "--type", "earthquake",
		"--capacity", "5000", "--summary-json", summary, path)
	require.Equal(t, exitDeadLetters, code, stderr)
	require.Contains(t, stderr, "sample.csv:202: schema: /time: got null, want string")
	s := readSummary(t, summary)
	require.Equal(t, int64(200), s.RecordsDelivered)
	require.Equal(t, int64(1), s.RecordsDeadLettered)
	require.Equal(t, int64(200), sim.Stats().Accepted)
}

// The pool's unit and cost rule reach the workers: a bytes pool with
// records of very different sizes, and a cost pool whose service charges
// 20 % more than the rule estimates (the difference is charged to the
// pacer). Every record is stored once, and no sliding second at send time
// holds more than the capacity.
func TestBulkLoadPoolUnits(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity int64
		sim      sinksim.Config
		flags    []string
	}{
		{"bytes", 400_000, sinksim.Config{Unit: ingest.UnitBytes}, []string{"--unit", "bytes"}},
		{"cost", 10_000, sinksim.Config{Unit: ingest.UnitCost, ChargeFactor: 1.2}, []string{"--unit", "cost", "--cost", "5/KiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.sim.Capacity = tc.capacity
			if tc.sim.ChargeFactor > 0 {
				rule, err := ingest.ParseCost(ingest.UnitCost, "5/KiB")
				require.NoError(t, err)
				tc.sim.Charge = &rule
			}
			sim, url := startSim(t, tc.sim)
			sizes := []int{80, 2000, 300, 9000, 40, 1200}
			path := ndjson(t, 600, func(i int) string {
				return fmt.Sprintf(`{"id":"b%d","pad":"%s"}`, i, strings.Repeat("x", sizes[i%len(sizes)]))
			})
			summary := filepath.Join(t.TempDir(), "summary.json")
			args := append(append([]string{"bulk-load", "--embedded", "--sink", url, "--capacity", fmt.Sprint(tc.capacity),
				"--partitions", "8", "--workers", "2", "--id-field", "id", "--summary-json", summary}, tc.flags...), path)
			code, _, stderr := runCLI(t, args...)
			require.Equal(t, exitOK, code, stderr)
			s := readSummary(t, summary)
			st := sim.Snapshot(false)
			t.Logf("%s: %d units in %.2f s, send side %d of %d in any second, corrections %d", tc.name, s.CostTotal, s.ElapsedS,
				s.SendMaxUnits1s, tc.capacity, st.UnitsCharged-s.CostTotal)
			require.EqualValues(t, 600, st.Accepted)
			require.EqualValues(t, 600, s.RecordsDelivered)
			require.Positive(t, s.SendMaxUnits1s)
			require.LessOrEqual(t, s.SendMaxUnits1s, tc.capacity, "no sliding second over the capacity at send time")
		})
	}
}
