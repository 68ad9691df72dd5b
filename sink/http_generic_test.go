package sink

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinkwire"
)

func TestEncodeBatchKeyAndNDJSON(t *testing.T) {
	t.Parallel()
	batch := []ingest.Record{
		{ID: "a", SinkKey: "2025-05/a", Value: []byte(`{"n":1}`), Cost: 1},
		{ID: "b", Value: []byte(`{"n":2}`), Cost: 1},
	}
	var arr []map[string]any
	require.NoError(t, json.Unmarshal(encodeBatch(batch, false), &arr))
	require.Equal(t, "2025-05/a", arr[0]["key"])
	require.NotContains(t, arr[1], "key", "no SinkKey, no key")

	sc := bufio.NewScanner(bytes.NewReader(encodeBatch(batch, true)))
	var lines []map[string]any
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		lines = append(lines, m)
	}
	require.Len(t, lines, 2)
	require.Equal(t, "b", lines[1]["id"])
}

func TestHTTPSinkHeadersIdempotencyKeyAndNDJSON(t *testing.T) {
	t.Parallel()
	type seen struct{ auth, key, ctype, body string }
	got := make(chan seen, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Header.Get("Authorization"), r.Header.Get(HeaderIdempotencyKey), r.Header.Get("Content-Type"), string(body)}
		writeJSON(w, http.StatusOK, sinkwire.Response{Results: []sinkwire.Result{{ID: "a", Status: sinkwire.StatusStored}}})
	}))
	t.Cleanup(srv.Close)
	hs, err := NewHTTP(HTTPConfig{URL: srv.URL, NDJSON: true, Header: http.Header{"Authorization": {"Bearer s3cret"}}})
	require.NoError(t, err)
	t.Cleanup(hs.client.CloseIdleConnections)
	batch := []ingest.Record{{ID: "a", Value: []byte(`{}`)}}
	for range 2 {
		_, err := hs.Write(t.Context(), batch)
		require.NoError(t, err)
	}
	first, second := <-got, <-got
	require.Equal(t, "Bearer s3cret", first.auth)
	require.Equal(t, "application/x-ndjson", first.ctype)
	require.Equal(t, `{"id":"a","value":{}}`+"\n", first.body)
	require.Len(t, first.key, 32)
	require.Equal(t, first.key, second.key, "a retried batch carries the same key")
	require.NotEqual(t, first.key, batchKey([]ingest.Record{{ID: "b"}}))
}

// A service that dedupes by the Idempotency-Key header alone (not by record
// ID) stores each record once although every first answer is lost after the
// batch was stored: each retry of a batch carries its first attempt's key,
// and the service answers it from what it stored.
func TestHTTPSinkRetriesStoreOnceAtAKeyDedupingService(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	stored := map[string]int{}                 // record ID → times stored
	answered := map[string]sinkwire.Response{} // idempotency key → the answer given
	hs := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var batch []sinkwire.Record
		if err := json.NewDecoder(r.Body).Decode(&batch); err != nil {
			writeJSON(w, http.StatusBadRequest, sinkwire.Response{Error: err.Error()})
			return
		}
		key := r.Header.Get(HeaderIdempotencyKey)
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := answered[key]; ok {
			writeJSON(w, http.StatusOK, prev) // a replay: nothing stored again
			return
		}
		var res sinkwire.Response
		for _, rec := range batch {
			stored[rec.ID]++
			res.Results = append(res.Results, sinkwire.Result{ID: rec.ID, Status: sinkwire.StatusStored})
		}
		answered[key] = res
		writeJSON(w, http.StatusBadGateway, sinkwire.Response{Error: "upstream answer lost"}) // stored, but the client never hears
	}))
	var recs []ingest.Record
	for i := range 250 {
		recs = append(recs, ingest.Record{ID: fmt.Sprintf("quake-%03d", i), Value: []byte(`{"mag":1.5}`)})
	}
	for batch := range slices.Chunk(recs, 100) {
		_, err := hs.Write(t.Context(), batch)
		var se *ingest.SinkError
		require.ErrorAs(t, err, &se, "the first answer is lost")
		res, err := hs.Write(t.Context(), batch) // the pipeline retries a failed request whole
		require.NoError(t, err)
		require.Len(t, res, len(batch))
		for _, r := range res {
			require.Equal(t, ingest.Delivered, r.Outcome)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, stored, len(recs))
	for id, n := range stored {
		require.Equal(t, 1, n, "record %s stored %d times", id, n)
	}
	require.Len(t, answered, 3, "one key per batch, the same on its retry")
}

// Every status a service may answer a whole request with, against an
// httptest server: retryable ones retry, the others dead-letter.
// A status for the whole request is a failure of the request or the sink
// (credentials, a wrong URL or format, an outage, throttling), never a
// verdict about each record: Write returns it as an *ingest.SinkError.
func TestHTTPSinkEveryStatus(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		code      int
		throttled bool
	}{
		{408, false}, {429, true}, {500, false}, {502, false}, {503, false}, {504, false},
		{400, false}, {401, false}, {403, false}, {404, false}, {409, false}, {413, false}, {422, false}, {501, false},
	} {
		hs := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, tt.code, sinkwire.Response{Error: "nope"})
		}))
		res, err := hs.Write(t.Context(), []ingest.Record{{ID: "a", Value: []byte(`{}`)}, {ID: "b", Value: []byte(`{}`)}})
		require.Nil(t, res, "HTTP %d", tt.code)
		var se *ingest.SinkError
		require.ErrorAs(t, err, &se, "HTTP %d", tt.code)
		require.Equal(t, tt.throttled, se.Throttled, "HTTP %d", tt.code)
		require.ErrorContains(t, err, fmt.Sprintf("HTTP %d: nope", tt.code))
	}
}

// A 207 answer gives each record its own fate: a partial batch failure.
func TestHTTPSinkMultiStatus(t *testing.T) {
	t.Parallel()
	hs := serveHandler(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusMultiStatus, sinkwire.Response{Results: []sinkwire.Result{
			{ID: "a", Status: sinkwire.StatusStored}, {ID: "b", Status: 400, Error: "bad"}, {ID: "c", Status: 503},
		}})
	}))
	res, err := hs.Write(t.Context(), []ingest.Record{{ID: "a"}, {ID: "b"}, {ID: "c"}})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Retryable},
		[]ingest.Outcome{res[0].Outcome, res[1].Outcome, res[2].Outcome})
}

func TestHTTPSinkTLS(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, sinkwire.Response{Results: []sinkwire.Result{{ID: "a", Status: sinkwire.StatusStored}}})
	}))
	t.Cleanup(srv.Close)
	batch := []ingest.Record{{ID: "a", Value: []byte(`{}`)}}

	untrusted, err := NewHTTP(HTTPConfig{URL: srv.URL})
	require.NoError(t, err)
	_, err = untrusted.Write(t.Context(), batch)
	require.ErrorContains(t, err, "certificate")
	_ = untrusted.Close()

	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	for _, cfg := range []HTTPConfig{{URL: srv.URL, CAFile: ca}, {URL: srv.URL, InsecureSkipVerify: true}} {
		hs, err := NewHTTP(cfg)
		require.NoError(t, err)
		res, err := hs.Write(t.Context(), batch)
		require.NoError(t, err)
		require.NotEqual(t, ingest.Permanent, res[0].Outcome)
		_ = hs.Close()
	}
	_, err = NewHTTP(HTTPConfig{URL: srv.URL, CAFile: filepath.Join(t.TempDir(), "missing.pem")})
	require.ErrorContains(t, err, "CA file")
}

func TestReadHeaders(t *testing.T) {
	file := filepath.Join(t.TempDir(), "headers")
	require.NoError(t, os.WriteFile(file, []byte("# comment\nX-Api-Key: k1\n\nX-Tenant:  t \n"), 0o600))
	h, err := readHeaders(file)
	require.NoError(t, err)
	require.Equal(t, http.Header{"X-Api-Key": {"k1"}, "X-Tenant": {"t"}}, h)

	require.NoError(t, os.WriteFile(file, []byte("X-Ok: 1\nno colon secret\n"), 0o600))
	_, err = readHeaders(file)
	require.ErrorContains(t, err, file+":2")
	require.NotContains(t, err.Error(), "secret", "values are never shown")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// serveHandler starts an httptest server for h and an HTTPSink pointed at
// it.
func serveHandler(t *testing.T, h http.Handler) *HTTPSink {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	hs, err := NewHTTP(HTTPConfig{URL: srv.URL})
	require.NoError(t, err)
	t.Cleanup(func() { _ = hs.Close() })
	return hs
}

func TestNewHTTPValidates(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  HTTPConfig
		want string
	}{
		{HTTPConfig{}, "want an absolute http:// or https:// URL"},
		{HTTPConfig{URL: "ftp://host"}, "want an absolute"},
		{HTTPConfig{URL: "/v1"}, "want an absolute"},
		{HTTPConfig{URL: "127.0.0.1:8088"}, `url "127.0.0.1:8088"`},
		{HTTPConfig{URL: "http://h", Timeout: -time.Second}, "timeout -1s is negative"},
	} {
		_, err := NewHTTP(tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
	hs, err := NewHTTP(HTTPConfig{URL: "https://example:8443/base/"})
	require.NoError(t, err)
	require.Equal(t, "https://example:8443/base/v1/records", hs.records)
	require.Zero(t, hs.timeout, "the caller's deadline alone")
}

func TestEncodeBatch(t *testing.T) {
	t.Parallel()
	value := "{ \"html\": \"<b>&</b>\",\n \"n\": 1 }"
	data := encodeBatch([]ingest.Record{
		ingest.Record{ID: `q"uote`, Value: []byte(value), Cost: 7},
		ingest.Record{ID: "bad", Value: []byte("{not json"), Cost: 1},
		ingest.Record{ID: "nocost", Value: []byte(`{}`), Cost: 0},
		ingest.Record{ID: "empty", Value: []byte(``), Cost: 1},
	}, false)
	var got []sinkwire.Record
	require.NoError(t, json.Unmarshal(data, &got), string(data))
	require.Len(t, got, 4)
	require.Equal(t, `q"uote`, got[0].ID)
	require.Equal(t, int64(7), *got[0].Cost)
	require.Equal(t, value, string(got[0].Value), "valid JSON is sent byte for byte")
	require.Equal(t, `"{not json"`, string(got[1].Value), "invalid JSON becomes a string")
	require.Nil(t, got[2].Cost)
	require.Equal(t, `""`, string(got[3].Value))
}
