package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
)

// parseWorker runs the worker command's flag parsing on args and returns
// what workerSettings makes of them. Tests that run a cli app are not
// parallel: urfave/cli's help flag is a package variable every app sets.
func parseWorker(t *testing.T, args ...string) ([]settings, error) {
	t.Helper()
	var got []settings
	var gotErr error
	cmd := workerCommand()
	cmd.Action = func(c *cli.Context) error {
		got, gotErr = workerSettings(c)
		return nil
	}
	app := &cli.App{Commands: []*cli.Command{cmd}}
	require.NoError(t, app.Run(append([]string{"sluice", "worker"}, args...)))
	return got, gotErr
}

func TestWorkerServesSeveralTypesEachInItsPool(t *testing.T) {
	all, err := parseWorker(t, "--types", "../../examples/types.yaml", "--type", "earthquake,earthquake-backfill", "--group", "g")
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, "earthquakes", all[0].worker.Topic)
	require.Equal(t, "g-earthquake", all[0].worker.Group)
	require.Equal(t, "quakes-interactive", all[0].worker.Pool.Name)
	require.Equal(t, 1500.0, all[0].worker.Pool.Capacity)
	require.Equal(t, 15, all[0].worker.Pool.Partitions)
	require.Equal(t, "earthquakes-backfill", all[1].worker.Topic)
	require.Equal(t, "g-earthquake-backfill", all[1].worker.Group)
	require.Equal(t, "quakes-bulk", all[1].worker.Pool.Name)
	require.Equal(t, 500.0, all[1].worker.Pool.Capacity)
	require.Equal(t, ingest.UnitRecords, all[1].worker.Pool.Unit)
	require.NotNil(t, all[1].worker.Processor)
}

func TestWorkerTypeErrorsNameTheFlag(t *testing.T) {
	types := "../../examples/types.yaml"
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"pool flag with several types", []string{"--types", types, "--type", "earthquake,earthquake-backfill", "--capacity", "9"}, "--capacity: with several --type"},
		{"unknown type", []string{"--types", types, "--type", "earthquake,quake"}, `--type "quake": not defined`},
		{"no types file", []string{"--type", "earthquake"}, "--type needs --types"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseWorker(t, tt.args...)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestOneTypeFlagsOverrideTheType(t *testing.T) {
	all, err := parseWorker(t, "--types", "../../examples/types.yaml", "--type", "earthquake", "--capacity", "42", "--topic", "mine")
	require.NoError(t, err)
	require.Len(t, all, 1)
	require.Equal(t, 42.0, all[0].worker.Pool.Capacity)
	require.Equal(t, "mine", all[0].worker.Topic)
	require.Equal(t, "quakes-interactive", all[0].worker.Pool.Name)
	require.Equal(t, 15, all[0].worker.Pool.Partitions, "the rest of the type's pool")
}

func TestSinkKeyFlagsAndTypeRule(t *testing.T) {
	all, err := parseWorker(t, "--capacity", "10", "--sink-key", "{time}/{id}", "--sink-key-strategy", "shard:16")
	require.NoError(t, err)
	out, err := all[0].worker.Processor.Process(ingest.Record{ID: "a", Value: []byte(`{"id":"a","time":"t1"}`)})
	require.NoError(t, err)
	require.Regexp(t, `^\d\d/t1/a$`, out.SinkKey)
	key, err := all[0].sinkKey.Key([]byte(`{"id":"a","time":"t1"}`))
	require.NoError(t, err)
	require.Equal(t, out.SinkKey, key, "bulk-load orders by the key the worker writes")

	_, err = parseWorker(t, "--capacity", "10", "--sink-key", "{time", "--sink-key-strategy", "shard:16")
	require.ErrorContains(t, err, "--sink-key, --sink-key-strategy:")
	_, err = parseWorker(t, "--capacity", "10", "--sink-key-strategy", "reverse")
	require.ErrorContains(t, err, "needs --sink-key")
}

// parseBulkLoad runs the bulk-load command's flag parsing on args and
// returns what readSettings makes of them.
func parseBulkLoad(t *testing.T, args ...string) (settings, error) {
	t.Helper()
	var got settings
	var gotErr error
	cmd := bulkLoadCommand()
	cmd.Action = func(c *cli.Context) error {
		got, gotErr = readSettings(c)
		return nil
	}
	app := &cli.App{Commands: []*cli.Command{cmd}}
	require.NoError(t, app.Run(append([]string{"sluice", "bulk-load"}, args...)))
	return got, gotErr
}

// The priority class and weight: worker runs at normal and bulk-load at
// low unless --priority (or SLUICE_PRIORITY) says otherwise; a types
// file's pool gives its worker pods a class and a weight, not a bulk load
// of its types; bad values name the flag.
func TestPriorityAndWeight(t *testing.T) {
	dir := t.TempDir()
	types := filepath.Join(dir, "types.yaml")
	require.NoError(t, os.WriteFile(types, []byte("pools:\n  orders: {capacity: 2000, partitions: 100, priority: high, weight: 3}\n"+
		"types:\n  order: {topic: orders, pool: orders, id_field: id}\n"), 0o600))
	base := []string{"--capacity", "2000"}

	all, err := parseWorker(t, base...)
	require.NoError(t, err)
	require.Equal(t, lease.PriorityNormal, all[0].worker.Priority, "worker defaults to normal")
	require.Equal(t, 1, all[0].worker.Weight)
	bulk, err := parseBulkLoad(t, base...)
	require.NoError(t, err)
	require.Equal(t, lease.PriorityLow, bulk.worker.Priority, "bulk-load defaults to low")

	all, err = parseWorker(t, append(base, "--priority", "high", "--weight", "2")...)
	require.NoError(t, err)
	require.Equal(t, lease.PriorityHigh, all[0].worker.Priority)
	require.Equal(t, 2, all[0].worker.Weight)
	bulk, err = parseBulkLoad(t, append(base, "--priority", "normal")...)
	require.NoError(t, err)
	require.Equal(t, lease.PriorityNormal, bulk.worker.Priority, "--priority overrides bulk-load's default")

	t.Setenv("SLUICE_PRIORITY", "high")
	bulk, err = parseBulkLoad(t, base...)
	require.NoError(t, err)
	require.Equal(t, lease.PriorityHigh, bulk.worker.Priority, "SLUICE_PRIORITY")
	t.Setenv("SLUICE_PRIORITY", "") // an unset chart value: the default
	bulk, err = parseBulkLoad(t, base...)
	require.NoError(t, err)
	require.Equal(t, lease.PriorityLow, bulk.worker.Priority, "empty is the command's default")

	all, err = parseWorker(t, "--types", types, "--type", "order")
	require.NoError(t, err)
	require.Equal(t, lease.PriorityHigh, all[0].worker.Priority, "the pool's class for its pods")
	require.Equal(t, 3, all[0].worker.Weight)
	all, err = parseWorker(t, "--types", types, "--type", "order", "--priority", "low")
	require.NoError(t, err)
	require.Equal(t, lease.PriorityLow, all[0].worker.Priority, "the flag over the file")
	bulk, err = parseBulkLoad(t, "--types", types, "--type", "order")
	require.NoError(t, err)
	require.Equal(t, lease.PriorityLow, bulk.worker.Priority, "a backfill of the type stays low")
	require.Equal(t, 1, bulk.worker.Weight)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--priority", "urgent"}, `--priority: unknown priority class "urgent" (want high, normal or low)`},
		{[]string{"--weight", "0"}, "--weight: must be a positive integer, got 0"},
		{[]string{"--weight", "-2"}, "--weight: must be a positive integer, got -2"},
	} {
		_, err := parseWorker(t, append(base, tc.args...)...)
		require.EqualError(t, err, tc.want)
		_, err = parseBulkLoad(t, append(base, tc.args...)...)
		require.EqualError(t, err, tc.want)
	}
}
