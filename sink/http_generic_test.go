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
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
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
		writeJSON(w, http.StatusOK, WireResponse{Results: []WireResult{{ID: "a", Status: StatusStored}}})
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

// Every status a service may answer a whole request with, against an
// httptest server: retryable ones retry, the others dead-letter.
func TestHTTPSinkEveryStatus(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		code int
		want ingest.Outcome
	}{
		{408, ingest.Retryable}, {429, ingest.Retryable}, {500, ingest.Retryable}, {502, ingest.Retryable},
		{503, ingest.Retryable}, {504, ingest.Retryable},
		{400, ingest.Permanent}, {401, ingest.Permanent}, {403, ingest.Permanent}, {404, ingest.Permanent},
		{409, ingest.Permanent}, {413, ingest.Permanent}, {422, ingest.Permanent}, {501, ingest.Permanent},
	} {
		hs := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, tt.code, WireResponse{Error: "nope"})
		}), 0)
		res, err := hs.Write(t.Context(), []ingest.Record{{ID: "a", Value: []byte(`{}`)}, {ID: "b", Value: []byte(`{}`)}})
		require.NoError(t, err, "HTTP %d", tt.code)
		for _, r := range res {
			require.Equal(t, tt.want, r.Outcome, "HTTP %d", tt.code)
			require.Contains(t, r.Reason, fmt.Sprint(tt.code))
		}
	}
}

// A 207 answer gives each record its own fate: a partial batch failure.
func TestHTTPSinkMultiStatus(t *testing.T) {
	t.Parallel()
	hs := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusMultiStatus, WireResponse{Results: []WireResult{
			{ID: "a", Status: StatusStored}, {ID: "b", Status: 400, Error: "bad"}, {ID: "c", Status: 503},
		}})
	}), 0)
	res, err := hs.Write(t.Context(), []ingest.Record{{ID: "a"}, {ID: "b"}, {ID: "c"}})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Retryable},
		[]ingest.Outcome{res[0].Outcome, res[1].Outcome, res[2].Outcome})
}

func TestHTTPSinkTLS(t *testing.T) {
	t.Parallel()
	sim, err := NewSim(SimConfig{Capacity: 1000})
	require.NoError(t, err)
	srv := httptest.NewTLSServer(sim.Handler())
	t.Cleanup(srv.Close)
	batch := []ingest.Record{{ID: "a", Value: []byte(`{}`)}}

	untrusted, err := NewHTTP(HTTPConfig{URL: srv.URL})
	require.NoError(t, err)
	_, err = untrusted.Write(t.Context(), batch)
	require.ErrorContains(t, err, "certificate")
	untrusted.client.CloseIdleConnections()

	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	for _, cfg := range []HTTPConfig{{URL: srv.URL, CAFile: ca}, {URL: srv.URL, InsecureSkipVerify: true}} {
		hs, err := NewHTTP(cfg)
		require.NoError(t, err)
		res, err := hs.Write(t.Context(), batch)
		require.NoError(t, err)
		require.NotEqual(t, ingest.Permanent, res[0].Outcome)
		hs.client.CloseIdleConnections()
	}
	_, err = NewHTTP(HTTPConfig{URL: srv.URL, CAFile: filepath.Join(t.TempDir(), "missing.pem")})
	require.ErrorContains(t, err, "CA file")
}

func TestReadHeaders(t *testing.T) {
	file := filepath.Join(t.TempDir(), "headers")
	require.NoError(t, os.WriteFile(file, []byte("# comment\nX-Api-Key: k1\n\nX-Tenant:  t \n"), 0o600))
	t.Setenv(EnvSinkAuthorization, "Bearer tok")
	h, err := readHeaders(file)
	require.NoError(t, err)
	require.Equal(t, http.Header{"X-Api-Key": {"k1"}, "X-Tenant": {"t"}, "Authorization": {"Bearer tok"}}, h)

	require.NoError(t, os.WriteFile(file, []byte("X-Ok: 1\nno colon secret\n"), 0o600))
	_, err = readHeaders(file)
	require.ErrorContains(t, err, file+":2")
	require.NotContains(t, err.Error(), "secret", "values are never shown")
}

// BenchmarkHTTPSinkWrite measures unthrottled writes to the emulator (one
// client, one request at a time), by batch size:
// go test -run '^$' -bench HTTPSinkWrite ./sink/
func BenchmarkHTTPSinkWrite(b *testing.B) {
	for _, size := range []int{100, 500, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			sim, err := NewSim(SimConfig{Capacity: MaxCapacity / 10})
			require.NoError(b, err)
			srv := httptest.NewServer(sim.Handler())
			b.Cleanup(srv.Close)
			hs, err := NewHTTP(HTTPConfig{URL: srv.URL})
			require.NoError(b, err)
			b.Cleanup(hs.client.CloseIdleConnections)
			value := []byte(`{"mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`)
			n := 0
			for b.Loop() {
				batch := make([]ingest.Record, size)
				for i := range batch {
					n++
					batch[i] = ingest.Record{ID: fmt.Sprintf("r%09d", n), Value: value, Cost: 1}
				}
				if _, err := hs.Write(b.Context(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
