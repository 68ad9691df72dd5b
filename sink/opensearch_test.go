package sink

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink/sinktest"
)

// The OpenSearch tests do not run in parallel with one another: the node
// that scripts/opensearch.sh starts has one write thread and a write
// queue of 4, and the tests that make it throttle fill that queue, which
// would throttle a neighbour's writes too.

// opensearchService is a real OpenSearch node: SLUICE_TEST_OPENSEARCH_URL,
// or the one scripts/opensearch.sh starts (idempotent; the Makefile stops
// it).
var opensearchService = &service{env: "SLUICE_TEST_OPENSEARCH_URL", script: "opensearch.sh"}

func opensearchURL(t testing.TB) string {
	t.Helper()
	return opensearchService.URL(t)
}

func freshIndex() string { return strings.ReplaceAll(freshTable("quakes"), "_", "-") }

// strictMapping makes an index that stores documents whose only field is
// a number "mag" and refuses any other field
// (strict_dynamic_mapping_exception) or a "mag" that is not a number
// (mapper_parsing_exception).
const strictMapping = `{"mappings":{"dynamic":"strict","properties":{"mag":{"type":"float"}}}}`

// osRequest sends one request to the node and returns its status and body.
func osRequest(t testing.TB, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, opensearchURL(t)+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Close = true // no idle connection left behind
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, data
}

// createIndex creates index with shards primary shards, no replica, and
// the given mappings (a JSON object, "" for dynamic ones).
func createIndex(t testing.TB, index string, shards int, mappings string) {
	t.Helper()
	createIndexWith(t, index, "", fmt.Sprintf(`{"number_of_shards":%d,"number_of_replicas":0}`, shards), mappings)
}

// createIndexWith creates index with the settings object given and the
// create index request's query parameters (e.g. "wait_for_active_shards=0").
func createIndexWith(t testing.TB, index, query, settings, mappings string) {
	t.Helper()
	body := `{"settings":` + settings
	if mappings != "" {
		body += `,` + strings.TrimSuffix(strings.TrimPrefix(mappings, "{"), "}")
	}
	path := "/" + index
	if query != "" {
		path += "?" + query
	}
	status, data := osRequest(t, http.MethodPut, path, body+"}")
	require.Equal(t, http.StatusOK, status, string(data))
	t.Cleanup(func() {
		// Best effort: the node's data goes with scripts/opensearch.sh stop.
		req, _ := http.NewRequest(http.MethodDelete, opensearchURL(t)+"/"+index, nil)
		req.Close = true
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	})
}

// countDocs refreshes index and counts its documents with _count.
func countDocs(t testing.TB, index string) int {
	t.Helper()
	status, data := osRequest(t, http.MethodPost, "/"+index+"/_refresh", "")
	require.Equal(t, http.StatusOK, status, string(data))
	status, data = osRequest(t, http.MethodGet, "/"+index+"/_count", "")
	require.Equal(t, http.StatusOK, status, string(data))
	var c struct{ Count int }
	require.NoError(t, json.Unmarshal(data, &c))
	return c.Count
}

// getSource reads one document's source.
func getSource(t testing.TB, index, id string) string {
	t.Helper()
	status, data := osRequest(t, http.MethodGet, "/"+index+"/_source/"+url.PathEscape(id), "")
	require.Equal(t, http.StatusOK, status, string(data))
	return string(data)
}

// openOS opens an OpenSearchSink on a fresh index of one shard with the
// strict mapping.
func openOS(t testing.TB, tweak ...func(*OpenSearchConfig)) *OpenSearchSink {
	t.Helper()
	index := freshIndex()
	createIndex(t, index, 1, strictMapping)
	return openOSIndex(t, index, tweak...)
}

func openOSIndex(t testing.TB, index string, tweak ...func(*OpenSearchConfig)) *OpenSearchSink {
	t.Helper()
	cfg := OpenSearchConfig{URL: opensearchURL(t), Index: index, Timeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	for _, f := range tweak {
		f(&cfg)
	}
	s, err := NewOpenSearch(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// osStopped is a sink whose node nothing listens on (built without
// NewOpenSearch's check).
func osStopped(t *testing.T) *OpenSearchSink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return osAt(t, "http://"+addr, "quakes")
}

// osAt is a sink on base without NewOpenSearch's check of the node.
func osAt(t *testing.T, base, index string) *OpenSearchSink {
	s := &OpenSearchSink{client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}, base: base, index: index,
		bulk: base + "/" + index + "/_bulk?filter_path=" + opensearchFilter, action: OpenSearchCreate,
		maxRecords: DefaultOpenSearchMaxRecords, maxBytes: DefaultOpenSearchMaxBytes, timeout: 2 * time.Second, log: slog.New(slog.DiscardHandler)}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func quake(id string, mag float64) ingest.Record {
	return ingest.Record{ID: id, Value: fmt.Appendf(nil, `{"mag":%g}`, mag), Cost: 1}
}

func TestOpenSearchConformance(t *testing.T) {
	sinktest.Suite{
		Open: func(t *testing.T) ingest.Sink { return openOS(t) },
		// The node's own 503 for the items of a shard that is not
		// allocated: an index of 2 primary shards that may hold at most 1
		// shard per node has its second one unassigned on the one-node
		// cluster; the node stores the items routed to the first and,
		// once the bulk request's timeout passes (200 ms instead of the
		// default minute, a parameter the node takes), answers the others
		// 503 unavailable_shards_exception.
		Retryable: func(t *testing.T, _ ingest.Sink) (ingest.Sink, []ingest.Record) {
			index := freshIndex()
			createIndexWith(t, index, "wait_for_active_shards=0", // the second shard never starts
				`{"number_of_shards":2,"number_of_replicas":0,"index.routing.allocation.total_shards_per_node":1}`, strictMapping)
			status, data := osRequest(t, http.MethodGet, "/_cluster/health/"+index+"?wait_for_active_shards=1&timeout=30s", "")
			require.Equal(t, http.StatusOK, status, "the first shard started: %s", data)
			s := openOSIndex(t, index)
			s.bulk = strings.Replace(s.bulk, "/_bulk?", "/_bulk?timeout=200ms&", 1)
			batch := make([]ingest.Record, 10)
			for i := range batch {
				batch[i] = quake(fmt.Sprintf("r%d", i), 1)
			}
			return s, batch
		},
		// The node's own throttling: a bulk request over an index of 16
		// shards is 16 shard requests at once for one write thread and a
		// queue of 4; the node answers 429 rejected_execution_exception
		// for the items of the shard requests it could not queue.
		Throttled: func(t *testing.T, _ ingest.Sink) (ingest.Sink, []ingest.Record) {
			index := freshIndex()
			createIndex(t, index, 16, strictMapping)
			batch := make([]ingest.Record, 200)
			for i := range batch {
				batch[i] = quake(fmt.Sprintf("t%d", i), 2)
			}
			return openOSIndex(t, index), batch
		},
		// The index is closed under the sink: every item answers 400
		// index_closed_exception, about the index, not the documents.
		Down: func(t *testing.T) ingest.Sink {
			s := openOS(t)
			status, data := osRequest(t, http.MethodPost, "/"+s.Index()+"/_close", "")
			require.Equal(t, http.StatusOK, status, string(data))
			return s
		},
		// A stopped node: nothing listens on the port.
		Stopped: func(t *testing.T) ingest.Sink { return osStopped(t) },
	}.Run(t)
}

// Item by item: a document refused for its field is dead-lettered with the
// server's reason beside stored ones; what sluice can tell without asking
// is refused before the request; values are sent compacted onto one line.
func TestOpenSearchItems(t *testing.T) {
	s := openOS(t)
	long := strings.Repeat("x", 513)
	res, err := s.Write(t.Context(), []ingest.Record{
		quake("a", 1),
		{ID: "b", Value: []byte(`{"mag":"strong"}`)},
		{ID: long, Value: []byte(`{"mag":1}`)},
		{ID: "c", Value: []byte("{\n  \"mag\": 4.5\n}\n")},
		{ID: "d", Value: []byte(`[1,2]`)},
		quake("a", 2), // the same ID again in the batch: the node's 409
		{ID: `e"/é`, Value: []byte(`{"mag":3}`)},
		{ID: "f\xff", Value: []byte(`{"mag":3}`)},
	})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Permanent, ingest.Delivered, ingest.Permanent, ingest.Duplicate, ingest.Delivered, ingest.Permanent}, outcomesOf(res))
	require.Contains(t, res[7].Reason, "not valid UTF-8")
	require.Contains(t, res[1].Reason, "HTTP 400 mapper_parsing_exception: failed to parse field [mag]")
	require.Contains(t, res[1].Reason, "number_format_exception")
	require.Contains(t, res[2].Reason, "513 bytes")
	require.Contains(t, res[4].Reason, "not a JSON object")
	require.Equal(t, 4-1, countDocs(t, s.Index()))
	require.JSONEq(t, `{"mag":4.5}`, getSource(t, s.Index(), "c"))
	require.JSONEq(t, `{"mag":1}`, getSource(t, s.Index(), "a"), "create never replaces")
	require.JSONEq(t, `{"mag":3}`, getSource(t, s.Index(), `e"/é`))
}

// With action=index a redelivery replaces the document and is counted as
// a duplicate (the node answers 200 updated, not 201 created).
func TestOpenSearchIndexAction(t *testing.T) {
	s := openOS(t, func(c *OpenSearchConfig) { c.Action = OpenSearchIndex })
	res, err := s.Write(t.Context(), []ingest.Record{quake("a", 1), quake("b", 2)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered}, outcomesOf(res))
	res, err = s.Write(t.Context(), []ingest.Record{quake("a", 7), quake("c", 3)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Duplicate, ingest.Delivered}, outcomesOf(res))
	require.JSONEq(t, `{"mag":7}`, getSource(t, s.Index(), "a"), "index replaces")
	require.Equal(t, 3, countDocs(t, s.Index()))
}

// bulkCounter is a reverse proxy in front of the node that counts the
// _bulk requests and their bodies' sizes, and can answer in the node's
// place.
type bulkCounter struct {
	srv      *httptest.Server
	mu       sync.Mutex
	requests []int // body bytes of each _bulk request
	docs     []int // documents of each
	answer   func(body []byte) (status int, hdr http.Header, reply string, ok bool)
}

func newBulkCounter(t *testing.T) *bulkCounter {
	u, err := url.Parse(opensearchURL(t))
	require.NoError(t, err)
	bc := &bulkCounter{}
	proxy := reverseProxy(t, u)
	bc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.HasSuffix(r.URL.Path, "/_bulk") {
			bc.mu.Lock()
			bc.requests = append(bc.requests, len(body))
			bc.docs = append(bc.docs, bytes.Count(body, []byte("\n"))/2)
			answer := bc.answer
			bc.mu.Unlock()
			if answer != nil {
				if status, hdr, reply, ok := answer(body); ok {
					for k, v := range hdr {
						w.Header()[k] = v
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(status)
					_, _ = io.WriteString(w, reply)
					return
				}
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(bc.srv.Close)
	return bc
}

func (bc *bulkCounter) sizes() (requests, docs []int) {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	return append([]int(nil), bc.requests...), append([]int(nil), bc.docs...)
}

// A write of more records than max_records, or more bytes than
// max_bytes, is sent as several _bulk requests, each within both bounds.
func TestOpenSearchRequestBounds(t *testing.T) {
	index := freshIndex()
	createIndex(t, index, 1, `{"mappings":{"properties":{"mag":{"type":"float"},"pad":{"type":"keyword","index":false}}}}`)
	bc := newBulkCounter(t)
	s := openOSIndex(t, index, func(c *OpenSearchConfig) { c.URL, c.MaxRecords, c.MaxBytes = bc.srv.URL, 4, 2000 })
	pad := strings.Repeat("p", 400)
	batch := make([]ingest.Record, 13)
	for i := range batch {
		batch[i] = ingest.Record{ID: fmt.Sprintf("r%02d", i), Value: fmt.Appendf(nil, `{"mag":1,"pad":%q}`, pad)}
	}
	batch[5].Value = fmt.Appendf(nil, `{"mag":1,"pad":%q}`, strings.Repeat("q", 3000)) // alone over max_bytes
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	for i, r := range res {
		require.Equal(t, ingest.Delivered, r.Outcome, "record %d: %s", i, r.Reason)
	}
	require.Equal(t, 13, countDocs(t, index))
	requests, docs := bc.sizes()
	total := 0
	for k, n := range requests {
		require.LessOrEqual(t, docs[k], 4, "request %d", k)
		if docs[k] > 1 {
			require.LessOrEqual(t, n, 2000, "request %d", k)
		}
		total += docs[k]
	}
	require.Equal(t, 13, total)
	// 13 records of ~450 bytes, 4 to a request of at most 2,000 bytes,
	// the large one alone: [0-3] [4] [5] [6-9] [10-12], sent 4 at once.
	slices.Sort(docs)
	require.Equal(t, []int{1, 1, 3, 4, 4}, docs)
}

// The answers of the request as a whole that the node gives only under
// conditions a test cannot make on demand, from a proxy in front of it:
// throttling of the whole request (429, 503 with Retry-After), a body
// over http.max_content_length (413), refused credentials (401), an
// answer that is not the _bulk answer.
func TestOpenSearchWholeRequestAnswers(t *testing.T) {
	bc := newBulkCounter(t)
	index := freshIndex()
	createIndex(t, index, 1, strictMapping)
	s := openOSIndex(t, index, func(c *OpenSearchConfig) { c.URL, c.MaxRecords = bc.srv.URL, 2 })
	recs := []ingest.Record{quake("a", 1), quake("b", 2), quake("c", 3)}
	answer := func(status int, hdr http.Header, reply string) {
		bc.mu.Lock()
		defer bc.mu.Unlock()
		bc.answer = func([]byte) (int, http.Header, string, bool) { return status, hdr, reply, true }
	}
	rejected := `{"error":{"root_cause":[],"type":"rejected_execution_exception","reason":"rejected execution of coordinating operation"},"status":429}`

	// Every request throttled: the write is throttled as a whole.
	answer(http.StatusTooManyRequests, http.Header{"Retry-After": {"2"}}, rejected)
	res, err := s.Write(t.Context(), recs)
	se := (*ingest.SinkError)(nil)
	require.ErrorAs(t, err, &se)
	require.True(t, se.Throttled)
	require.Equal(t, 2*time.Second, se.RetryAfter)
	require.Contains(t, err.Error(), "rejected_execution_exception")
	require.Nil(t, res)

	answer(http.StatusServiceUnavailable, http.Header{"Retry-After": {"1"}}, `{"error":"unavailable","status":503}`)
	_, err = s.Write(t.Context(), recs)
	require.ErrorAs(t, err, &se)
	require.True(t, se.Throttled)

	// A 503 without Retry-After, a 401, an unreadable answer: failures of
	// the request, never a record's verdict.
	for _, tc := range []struct {
		status int
		reply  string
		want   string
	}{
		{http.StatusServiceUnavailable, `{"error":{"type":"cluster_block_exception","reason":"blocked by: [SERVICE_UNAVAILABLE/1/state not recovered / initialized];"},"status":503}`, "cluster_block_exception"},
		{http.StatusUnauthorized, `{"error":{"type":"security_exception","reason":"missing authentication credentials"},"status":401}`, "HTTP 401 security_exception"},
		{http.StatusOK, `<html>proxy error</html>`, "protocol violation"},
		{http.StatusOK, `{"errors":false,"items":[]}`, "_bulk answered 0 items for"},
		{http.StatusRequestEntityTooLarge, ``, "over the node's http.max_content_length"},
	} {
		answer(tc.status, nil, tc.reply)
		res, err := s.Write(t.Context(), recs)
		require.ErrorContains(t, err, tc.want, tc.status)
		require.Nil(t, res)
		var se *ingest.SinkError
		require.False(t, errors.As(err, &se) && se.Throttled, "%d is not throttling", tc.status)
	}

	// A 413 for a request of one document: that document is too large.
	answer(http.StatusRequestEntityTooLarge, nil, ``)
	res, err = s.Write(t.Context(), recs[:1])
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Permanent}, outcomesOf(res))
	require.Contains(t, res[0].Reason, "http.max_content_length")

	// One request throttled beside a stored one: its records only are
	// throttled; the others stand.
	bc.mu.Lock()
	bc.answer = func(body []byte) (int, http.Header, string, bool) {
		if bytes.Contains(body, []byte(`"_id":"c"`)) {
			return http.StatusTooManyRequests, nil, rejected, true
		}
		return 0, nil, "", false
	}
	bc.mu.Unlock()
	res, err = s.Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered, ingest.Retryable}, outcomesOf(res))
	require.True(t, res[2].Throttled)
}

// opensearchs:// with a CA file and each way of authenticating, through a
// TLS proxy in front of the node that requires the credentials (the test
// node has no security plugin).
func TestOpenSearchTLSAndCredentials(t *testing.T) {
	target, err := url.Parse(opensearchURL(t))
	require.NoError(t, err)
	proxy := reverseProxy(t, target)
	var mu sync.Mutex
	want := ""
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ok := r.Header.Get("Authorization") == want
		mu.Unlock()
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":{"type":"security_exception","reason":"missing authentication credentials for REST request [/]"},"status":401}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	index := freshIndex()
	createIndex(t, index, 1, strictMapping)
	host := strings.TrimPrefix(srv.URL, "https://")
	expect := func(v string) {
		mu.Lock()
		defer mu.Unlock()
		want = v
	}

	// The Authorization header from the environment, through Open.
	expect("Basic c2x1aWNlOnNlY3JldA==") // sluice:secret
	s, err := Open(t.Context(), "opensearchs://"+host+"/"+index, OpenConfig{Authorization: "Basic c2x1aWNlOnNlY3JldA==", CAFile: caFile,
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	res, err := s.Write(t.Context(), []ingest.Record{quake("tls1", 1)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered}, outcomesOf(res))
	require.NoError(t, s.(ingest.Warmer).Warm(t.Context(), 3))
	_ = s.Close()

	// Username and password, and an API key, in the config.
	for _, tc := range []struct {
		header string
		tweak  func(*OpenSearchConfig)
	}{
		{"Basic c2x1aWNlOnNlY3JldA==", func(c *OpenSearchConfig) { c.Username, c.Password = "sluice", "secret" }},
		{"ApiKey a2V5aWQ6c2VjcmV0", func(c *OpenSearchConfig) { c.APIKey = "a2V5aWQ6c2VjcmV0" }},
	} {
		expect(tc.header)
		s := openOSIndex(t, index, func(c *OpenSearchConfig) { c.URL, c.CAFile = srv.URL, caFile }, tc.tweak)
		res, err := s.Write(t.Context(), []ingest.Record{quake("tls1", 1)})
		require.NoError(t, err)
		require.Equal(t, []ingest.Outcome{ingest.Duplicate}, outcomesOf(res))
	}

	// Wrong credentials: the node refuses them when the sink opens, and a
	// write refused later is a failure of the request, not a verdict.
	expect("Basic other")
	_, err = NewOpenSearch(t.Context(), OpenSearchConfig{URL: srv.URL, Index: index, CAFile: caFile, Username: "sluice", Password: "secret"})
	require.ErrorContains(t, err, "HTTP 401 security_exception")
	expect("ApiKey other")
	s2 := openOSIndex(t, index, func(c *OpenSearchConfig) { c.URL, c.CAFile, c.APIKey = srv.URL, caFile, "other" })
	expect("ApiKey revoked")
	res, err = s2.Write(t.Context(), []ingest.Record{quake("tls2", 1)})
	require.ErrorContains(t, err, "HTTP 401")
	require.Nil(t, res)
	// No CA file: the proxy's certificate is not trusted.
	_, err = NewOpenSearch(t.Context(), OpenSearchConfig{URL: srv.URL, Index: index, APIKey: "nothing"})
	require.ErrorContains(t, err, "certificate")
	require.Equal(t, 1, countDocs(t, index))
}

func TestOpenSearchConfigAndURL(t *testing.T) {
	for _, cfg := range []OpenSearchConfig{
		{URL: "127.0.0.1:9200", Index: "quakes"},
		{URL: "http://u:p@127.0.0.1:9200", Index: "quakes"},
		{URL: "http://127.0.0.1:9200", Index: "Quakes"},
		{URL: "http://127.0.0.1:9200", Index: "_quakes"},
		{URL: "http://127.0.0.1:9200", Index: "a,b"},
		{URL: "http://127.0.0.1:9200", Index: "quakes", Action: "update"},
		{URL: "http://127.0.0.1:9200", Index: "quakes", MaxBytes: 101 << 20},
		{URL: "http://127.0.0.1:9200", Index: "quakes", MaxRecords: -1},
		{URL: "http://127.0.0.1:9200", Index: "quakes", Password: "p"},
		{URL: "http://127.0.0.1:9200", Index: "quakes", Username: "u", APIKey: "k"},
	} {
		_, err := NewOpenSearch(t.Context(), cfg)
		require.ErrorIs(t, err, ErrOpenSearchConfig, "%+v", cfg)
	}
	for _, bad := range []string{
		"opensearch:///quakes",
		"opensearch://127.0.0.1:9200",
		"opensearch://127.0.0.1:9200/Quakes",
		"opensearch://127.0.0.1:9200/a/b",
		"opensearch://u:p@127.0.0.1:9200/quakes",
		"opensearch://127.0.0.1:9200/quakes?action=update",
		"opensearch://127.0.0.1:9200/quakes?max_bytes=200MiB",
		"opensearch://127.0.0.1:9200/quakes?max_bytes=lots",
		"opensearch://127.0.0.1:9200/quakes?max_records=0",
		"opensearch://127.0.0.1:9200/quakes?refresh=true",
	} {
		require.ErrorIs(t, CheckURL(bad), ErrSinkURL, bad)
	}
	for raw, want := range map[string]OpenSearchConfig{
		"opensearch://127.0.0.1:9200/quakes":                                      {URL: "http://127.0.0.1:9200", Index: "quakes"},
		"opensearchs://search.example.com/logs-2025?action=index&max_bytes=10MiB": {URL: "https://search.example.com:9200", Index: "logs-2025", Action: OpenSearchIndex, MaxBytes: 10 << 20},
		"elasticsearch://10.0.0.1:9201/quakes?max_records=500&max_bytes=65536":    {URL: "http://10.0.0.1:9201", Index: "quakes", MaxRecords: 500, MaxBytes: 65536},
		"elasticsearchs://es.example.com:443/quakes?max_bytes=512KiB":             {URL: "https://es.example.com:443", Index: "quakes", MaxBytes: 512 << 10},
	} {
		require.NoError(t, CheckURL(raw), raw)
		u, err := url.Parse(raw)
		require.NoError(t, err)
		got, err := openSearchConfig(u, OpenConfig{})
		require.NoError(t, err)
		require.Equal(t, want, got, raw)
	}

	// A node that does not answer: NewOpenSearch says so.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, err = Open(t.Context(), "opensearch://"+addr+"/quakes", OpenConfig{})
	require.ErrorContains(t, err, "connection refused")
}

// BenchmarkOpenSearchWrite measures unthrottled _bulk writes into the
// real node, by batch size (one request per write, one at a time):
// go test -run '^$' -bench OpenSearchWrite ./sink/
func BenchmarkOpenSearchWrite(b *testing.B) {
	for _, size := range []int{25, 100, 500, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			index := freshIndex()
			createIndex(b, index, 1, "")
			s := openOSIndex(b, index)
			value := []byte(`{"mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`)
			n := 0
			for b.Loop() {
				batch := make([]ingest.Record, size)
				for i := range batch {
					n++
					batch[i] = ingest.Record{ID: fmt.Sprintf("r%09d", n), Value: value}
				}
				res, err := s.Write(b.Context(), batch)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Outcome != ingest.Delivered {
						b.Fatal(r.Outcome, r.Reason)
					}
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
