package recordtype

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func TestLoadTypesExample(t *testing.T) {
	t.Parallel()
	types, err := Load(filepath.Join("..", "examples", "types.yaml"))
	require.NoError(t, err)
	eq := types["earthquake"]
	require.NotNil(t, eq)
	require.Equal(t, "earthquakes", eq.Topic)
	require.Equal(t, "id", eq.IDField)
	require.Equal(t, &PoolSpec{Capacity: 1500, Partitions: 15}, eq.PoolSpec)
	require.Equal(t, 500.0, types["earthquake-backfill"].PoolSpec.Capacity)
	eq.now = func() time.Time { return time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) }

	tests := []struct {
		name, value, wantErr string
	}{
		{"valid", `{"id":"us1","time":"2026-01-01T00:00:00Z","mag":4.5,"nst":null}`, ""},
		{"a number as a string", `{"id":"us1","time":"t","mag":"4.5"}`, "/mag"},
		{"missing id", `{"time":"t"}`, "id"},
		{"wrong type", `{"id":1,"time":"t"}`, "id"},
		{"not an object", `[1]`, "not a JSON object"},
		{"not JSON", `{`, "not JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, err := eq.Processor().Process(ingest.Record{ID: "x", Value: []byte(tt.value)})
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			var obj map[string]any
			require.NoError(t, json.Unmarshal(out.Value, &obj))
			require.Equal(t, "2026-01-02T03:04:05Z", obj["ingested_at"])
			require.Equal(t, "us1", obj["id"])
		})
	}
}

// FieldTypes reads the schema's declared types, through $ref and allOf.
func TestFieldTypes(t *testing.T) {
	t.Parallel()
	types, err := Load(filepath.Join("..", "examples", "types.yaml"))
	require.NoError(t, err)
	ft := types["earthquake"].FieldTypes()
	require.Equal(t, []string{"null", "number"}, ft["mag"])
	require.Equal(t, []string{"null", "integer"}, ft["nst"])
	require.Equal(t, []string{"string"}, ft["id"])

	dir := t.TempDir()
	schema := `{"$defs": {"count": {"type": "integer"}},
		"allOf": [{"properties": {"n": {"$ref": "#/$defs/count"}}}],
		"properties": {"ok": {"type": "boolean"}, "any": {"minLength": 1}}}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "s.json"), []byte(schema), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "types.yaml"), []byte("types:\n  a:\n    topic: t\n    schema: s.json\n"), 0o600))
	types, err = Load(filepath.Join(dir, "types.yaml"))
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"n": {"integer"}, "ok": {"boolean"}}, types["a"].FieldTypes())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "plain.yaml"), []byte("types:\n  b:\n    topic: t\n"), 0o600))
	types, err = Load(filepath.Join(dir, "plain.yaml"))
	require.NoError(t, err)
	require.Nil(t, types["b"].FieldTypes(), "no schema")
}

func TestLoadTypesErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"no topic", "types:\n  a:\n    pool: p\n", `type "a": topic is required`},
		{"unknown field", "types:\n  a:\n    topic: t\n    bogus: 1\n", "line 4"},
		{"bad enrichment", "types:\n  a:\n    topic: t\n    enrich: [x]\n", "unknown enrichment"},
		{"missing schema", "types:\n  a:\n    topic: t\n    schema: nope.json\n", "nope.json"},
		{"empty", "types: {}\n", "no types"},
		{"pool without capacity", "pools:\n  p: {partitions: 2}\ntypes:\n  a: {topic: t, pool: p}\n", `pool "p": capacity must be a finite number > 0`},
		{"pool with a bad unit", "pools:\n  p: {capacity: 5, unit: RU}\ntypes:\n  a: {topic: t}\n", `unknown unit "RU"`},
		{"bad sink key", "types:\n  a:\n    topic: t\n    sink_key: {template: \"{id}\", strategy: zigzag}\n", `type "a": recordtype: sink key rule: unknown strategy "zigzag"`},
		{"pool with a bad TTL", "pools:\n  p: {capacity: 5, lease_ttl: soon}\ntypes:\n  a: {topic: t}\n", "line 2"},
		{"pool with an unknown class", "pools:\n  p: {capacity: 5, priority: urgent}\ntypes:\n  a: {topic: t}\n", `pool "p": priority: unknown priority class "urgent" (want high, normal or low)`},
		{"pool with a negative weight", "pools:\n  p: {capacity: 5, weight: -1}\ntypes:\n  a: {topic: t}\n", `pool "p": weight must be a positive integer, got -1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(t.TempDir(), "types.yaml")
			require.NoError(t, os.WriteFile(p, []byte(tt.yaml), 0o600))
			_, err := Load(p)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tt.wantErr)
			require.ErrorContains(t, err, p)
		})
	}
}
