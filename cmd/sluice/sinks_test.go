package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// usgsPlusBad writes the whole USGS file plus one row, a copy of the first
// with the id "sluice-bad-1" (and, with pad, a place of pad characters),
// that the sink refuses: by a constraint, or for its size.
func usgsPlusBad(t *testing.T, pad int) string {
	t.Helper()
	data, err := os.ReadFile("../../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	require.Len(t, lines, 9367, "header + 9,366 records")
	bad := strings.Replace(lines[1], ",nn00898537,", ",sluice-bad-1,", 1)
	require.NotEqual(t, lines[1], bad)
	if pad > 0 {
		bad = strings.Replace(bad, `"45 km ESE of Beatty, Nevada"`, strings.Repeat("x", pad), 1)
	}
	path := filepath.Join(t.TempDir(), "usgs-plus-bad.csv")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(append(lines, bad), "\n")+"\n"), 0o600))
	return path
}

// serviceURL is a real server's URL: the environment variable env, or the
// one scripts/<script> starts (idempotent; the Makefile stops it), printed
// on the script's last line.
func serviceURL(t *testing.T, env, script string) string {
	t.Helper()
	if u := os.Getenv(env); u != "" {
		return u
	}
	var stderr bytes.Buffer
	cmd := exec.Command("../../scripts/"+script, "start")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "scripts/%s start: %s", script, stderr.String())
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// testPostgresURL is a real PostgreSQL server's URL: SLUICE_TEST_POSTGRES_URL
// or the one scripts/postgres.sh starts.
func testPostgresURL(t *testing.T) string {
	t.Helper()
	return serviceURL(t, "SLUICE_TEST_POSTGRES_URL", "postgres.sh")
}

// The USGS file into a real PostgreSQL through embedded Kafka and Redis:
// 9,366 rows exactly once, the constraint-violating row dead-lettered, and a
// second bulk-load of the same file adds none.
func TestBulkLoadIntoPostgres(t *testing.T) {
	base := testPostgresURL(t)
	table := fmt.Sprintf("quakes_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(t.Context(), base)
	require.NoError(t, err)
	defer conn.Close(t.Context())
	_, err = conn.Exec(t.Context(), fmt.Sprintf(`CREATE TABLE %s (id text PRIMARY KEY, value jsonb NOT NULL,
		ingested_at timestamptz NOT NULL DEFAULT now(), CONSTRAINT not_bad CHECK (value->>'id' <> 'sluice-bad-1'))`, table))
	require.NoError(t, err)
	path := usgsPlusBad(t, 0)
	count := func() (n int64) {
		require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n))
		return n
	}

	for run := 1; run <= 2; run++ {
		summary := filepath.Join(t.TempDir(), "summary.json")
		start := time.Now()
		code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--sink", base+"?table="+table,
			"--capacity", "100000", "--partitions", "4", "--batch-size", "500", "--id-field", "id",
			"--topic", "quakes", "--summary-json", summary, path)
		require.Equal(t, exitDeadLetters, code, "run %d stderr:\n%s", run, stderr)
		require.Contains(t, stderr, "not_bad", "the reason names the constraint")
		s := readSummary(t, summary)
		t.Logf("run %d: %d records in %v (%.0f records/s end to end): %+v", run, s.RecordsTotal, time.Since(start), float64(s.RecordsTotal)/s.ElapsedS, s)
		require.Equal(t, int64(9367), s.RecordsTotal)
		require.Equal(t, int64(1), s.RecordsDeadLettered)
		require.Equal(t, int64(9366), count(), "run %d: every record exactly once (the second load adds none)", run)
	}
}

// A typed bulk load: the USGS file with the earthquake type of
// examples/types.yaml, whose JSON Schema declares the numeric columns, into
// a real PostgreSQL: every row's mag is a jsonb number (not the CSV's
// string), an empty field is null, and a row whose mag is not a number is
// dead-lettered as a schema error naming the column and its file:line.
func TestTypedBulkLoadIntoPostgres(t *testing.T) {
	base := testPostgresURL(t)
	table := fmt.Sprintf("typed_quakes_%d", time.Now().UnixNano())
	conn, err := pgx.Connect(t.Context(), base)
	require.NoError(t, err)
	defer conn.Close(t.Context())
	data, err := os.ReadFile("../../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	// A copy of the first row with its own ID and a mag of "big".
	bad := strings.Replace(strings.Replace(lines[1], ",nn00898537,", ",sluice-big-mag,", 1), ",10.8,0,ml,", ",10.8,big,ml,", 1)
	require.NotEqual(t, lines[1], bad)
	path := filepath.Join(t.TempDir(), "usgs-typed.csv")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(append(lines, bad), "\n")+"\n"), 0o600))
	summary := filepath.Join(t.TempDir(), "summary.json")
	dlq := filepath.Join(t.TempDir(), "dlq.ndjson")

	code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--sink", base+"?table="+table,
		"--types", "../../examples/types.yaml", "--type", "earthquake", "--pool", table, "--capacity", "100000", "--batch-size", "500",
		"--dead-letter-file", dlq, "--summary-json", summary, path)
	require.Equal(t, exitDeadLetters, code, "stderr:\n%s", stderr)
	s := readSummary(t, summary)
	require.Equal(t, int64(9367), s.RecordsTotal)
	require.Equal(t, int64(9366), s.RecordsDelivered)
	require.Equal(t, int64(1), s.RecordsDeadLettered)
	letters, err := os.ReadFile(dlq)
	require.NoError(t, err)
	require.Contains(t, string(letters), path+`:9368: schema: column \"mag\": \"big\" is not a number`)

	var rows, numbers, nullNst, stringID int64
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT count(*),
		count(*) FILTER (WHERE jsonb_typeof(value->'mag') = 'number'),
		count(*) FILTER (WHERE jsonb_typeof(value->'nst') = 'null'),
		count(*) FILTER (WHERE jsonb_typeof(value->'id') = 'string') FROM `+table).Scan(&rows, &numbers, &nullNst, &stringID))
	require.Equal(t, int64(9366), rows)
	require.Equal(t, rows, numbers, "jsonb_typeof(value->'mag') = 'number' for every row")
	require.Equal(t, int64(1485), nullNst, "the empty nst fields are null")
	require.Equal(t, rows, stringID)
	var mag float64
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT (value->'mag')::float8 FROM `+table+` WHERE value->>'id' = 'ak0257659x6e'`).Scan(&mag))
	require.Equal(t, 0.8, mag)
}

// The USGS file into Azurite's Table service through embedded Kafka and
// Redis: 9,366 entities once, the oversized row dead-lettered, and a second
// bulk-load of the same file adds none.
func TestBulkLoadIntoAzureTables(t *testing.T) {
	base := serviceURL(t, "SLUICE_TEST_AZURITE_URL", "azurite.sh")
	t.Setenv(envAzureAccountKey, azuriteKey)
	table := fmt.Sprintf("quakes%d", time.Now().UnixNano())
	path := usgsPlusBad(t, 40_000)
	count := func() (n int64) {
		cred, err := aztables.NewSharedKeyCredential("devstoreaccount1", azuriteKey)
		require.NoError(t, err)
		// A transport of its own, closed after counting: the SDK's shared
		// one would keep an idle connection past the test.
		transport := &http.Transport{}
		defer transport.CloseIdleConnections()
		opts := &aztables.ClientOptions{}
		opts.Transport = &http.Client{Transport: transport}
		svc, err := aztables.NewServiceClientWithSharedKey("http://"+strings.TrimPrefix(base, "azuretables://"), cred, opts)
		require.NoError(t, err)
		pager := svc.NewClient(table).NewListEntitiesPager(&aztables.ListEntitiesOptions{Select: to.Ptr("RowKey")})
		for pager.More() {
			page, err := pager.NextPage(t.Context())
			require.NoError(t, err)
			n += int64(len(page.Entities))
		}
		return n
	}
	for run := 1; run <= 2; run++ {
		summary := filepath.Join(t.TempDir(), "summary.json")
		start := time.Now()
		code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--sink", base+"?table="+table,
			"--capacity", "100000", "--partitions", "4", "--batch-size", "500", "--id-field", "id",
			"--topic", "quakes", "--summary-json", summary, path)
		require.Equal(t, exitDeadLetters, code, "run %d stderr:\n%s", run, stderr)
		require.Contains(t, stderr, "PropertyValueTooLarge", "the reason names the service's error")
		s := readSummary(t, summary)
		t.Logf("run %d: %d records in %v (%.0f records/s end to end): %+v", run, s.RecordsTotal, time.Since(start), float64(s.RecordsTotal)/s.ElapsedS, s)
		require.Equal(t, int64(9367), s.RecordsTotal)
		require.Equal(t, int64(1), s.RecordsDeadLettered)
		require.Equal(t, int64(9366), count(), "run %d: every record exactly once (the second load adds none)", run)
	}
}

// azuriteKey is the Azure Storage emulator's well-known development account
// key, published by Microsoft for devstoreaccount1; not a secret.
const azuriteKey = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

// The USGS file's first 1,000 rows plus a row the API refuses (422)
// through the REST sink into an in-process API that stores items by id
// and answers 409 for an id it holds: each record once, its body from
// --sink-body, the bad row dead-lettered alone with the API's reason; a
// second bulk-load counts 1,000 duplicates (--sink-duplicate-on 409) and
// stores nothing.
func TestBulkLoadThroughRESTSink(t *testing.T) {
	var mu sync.Mutex
	stored := map[string]map[string]any{}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var item map[string]any
		if r.Method != http.MethodPut || json.NewDecoder(r.Body).Decode(&item) != nil {
			http.Error(w, `{"error":"want PUT of a JSON object"}`, http.StatusBadRequest)
			return
		}
		id := strings.TrimPrefix(r.URL.Path, "/v1/quakes/")
		mu.Lock()
		defer mu.Unlock()
		switch {
		case id == "sluice-bad-1":
			http.Error(w, `{"error":"magnitude out of range"}`, http.StatusUnprocessableEntity)
		case stored[id] != nil:
			http.Error(w, `{"error":"exists"}`, http.StatusConflict)
		default:
			stored[id] = item
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer api.Close()
	data, err := os.ReadFile("../../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(t, err)
	lines := strings.SplitAfter(string(data), "\n")
	bad := strings.Replace(lines[1], ",nn00898537,", ",sluice-bad-1,", 1)
	path := filepath.Join(t.TempDir(), "quakes.csv")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines[:1001], "")+bad), 0o600))

	for run := 1; run <= 2; run++ {
		summary := filepath.Join(t.TempDir(), "summary.json")
		code, _, stderr := runCLI(t, "bulk-load", "--embedded", "--sink", "rest+"+api.URL+"/v1/quakes/{id}",
			"--sink-method", "PUT", "--sink-body", `{"id":"{id}","magnitude":"{mag}","where":"{place}","note":"M{mag} {place}"}`,
			"--sink-duplicate-on", "409", "--capacity", "5000", "--partitions", "4", "--id-field", "id",
			"--topic", "quakes", "--summary-json", summary, path)
		require.Equal(t, exitDeadLetters, code, "run %d stderr:\n%s", run, stderr)
		require.Contains(t, stderr, "magnitude out of range", "the reason is the API's")
		s := readSummary(t, summary)
		t.Logf("run %d: %+v", run, s)
		require.Equal(t, int64(1001), s.RecordsTotal)
		require.Equal(t, int64(1), s.RecordsDeadLettered)
		if run == 1 {
			require.Equal(t, int64(1000), s.RecordsDelivered)
			require.Zero(t, s.DuplicatesAtSink)
		} else {
			require.Zero(t, s.RecordsDelivered, "nothing stored for the first time")
			require.Equal(t, int64(1000), s.DuplicatesAtSink)
		}
		mu.Lock()
		require.Len(t, stored, 1000, "run %d: every record once", run)
		mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	first := stored["nn00898537"]
	require.Equal(t, "nn00898537", first["id"])
	require.Equal(t, "M"+fmt.Sprint(first["magnitude"])+" "+fmt.Sprint(first["where"]), first["note"])
}
