package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// restRequest is what the fault-injecting API saw of one request.
type restRequest struct {
	method, path, query, body string
	header                    http.Header
}

// faultAPI is a REST API that answers each request as its answer function
// says, given the request, and remembers every request.
type faultAPI struct {
	srv    *httptest.Server
	mu     sync.Mutex
	seen   []restRequest
	answer func(r restRequest) (status int, header http.Header, body string)
}

func newFaultAPI(t *testing.T, answer func(r restRequest) (int, http.Header, string)) *faultAPI {
	t.Helper()
	api := &faultAPI{answer: answer}
	api.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := restRequest{method: r.Method, path: r.URL.EscapedPath(), query: r.URL.RawQuery, body: string(body), header: r.Header.Clone()}
		api.mu.Lock()
		api.seen = append(api.seen, req)
		api.mu.Unlock()
		status, header, text := api.answer(req)
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, text)
	}))
	t.Cleanup(api.srv.Close)
	return api
}

func (api *faultAPI) requests() []restRequest {
	api.mu.Lock()
	defer api.mu.Unlock()
	return append([]restRequest(nil), api.seen...)
}

// sink opens a RESTSink on the API with cfg (its URL relative to the
// server's, e.g. "/items/{id}").
func (api *faultAPI) sink(t *testing.T, cfg RESTConfig) *RESTSink {
	t.Helper()
	cfg.URL = api.srv.URL + cfg.URL
	s, err := NewREST(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// statusByID answers each request with the status its path's last segment
// names after "s": /items/s201-a → 201.
func statusByID(r restRequest) (int, http.Header, string) {
	last := r.path[strings.LastIndex(r.path, "/")+1:]
	code, err := strconv.Atoi(strings.TrimPrefix(strings.SplitN(last, "-", 2)[0], "s"))
	if err != nil {
		return http.StatusCreated, nil, `{"ok":true}`
	}
	return code, nil, fmt.Sprintf(`{"error":"status %d for %s"}`, code, last)
}

func rec(id, value string) ingest.Record {
	return ingest.Record{ID: id, Value: []byte(value), Cost: 1}
}

func outcomesOf(res []ingest.Result) []ingest.Outcome {
	out := make([]ingest.Outcome, len(res))
	for i, r := range res {
		out[i] = r.Outcome
	}
	return out
}

// One request per record: the method, the templated URL, the record as
// the body, the headers (the configured ones, JSON content type, an
// Idempotency-Key per record that a retry repeats).
func TestRESTSinkOneRequestPerRecord(t *testing.T) {
	t.Parallel()
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) { return http.StatusCreated, nil, `{}` })
	s := api.sink(t, RESTConfig{URL: "/v1/items/{id}", Method: "put", Header: http.Header{"Authorization": {"Bearer s3cret"}}})
	batch := []ingest.Record{rec("a", `{"id":"a","mag":1.5}`), rec("b", `{"id":"b/2","mag":2}`), rec("c", `{"id":"c","mag":3}`)}
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered, ingest.Delivered}, outcomesOf(res))
	_, err = s.Write(t.Context(), batch[:1])
	require.NoError(t, err)

	seen := api.requests()
	require.Len(t, seen, 4, "one request per record")
	byPath := map[string][]restRequest{}
	for _, r := range seen {
		byPath[r.path] = append(byPath[r.path], r)
	}
	require.Len(t, byPath["/v1/items/a"], 2)
	require.Len(t, byPath["/v1/items/b%2F2"], 1, "a '/' in a value stays in its segment")
	first, retry := byPath["/v1/items/a"][0], byPath["/v1/items/a"][1]
	require.Equal(t, http.MethodPut, first.method)
	require.Equal(t, `{"id":"a","mag":1.5}`, first.body, "the record as is")
	require.Equal(t, "Bearer s3cret", first.header.Get("Authorization"))
	require.Equal(t, "application/json", first.header.Get("Content-Type"))
	require.Len(t, first.header.Get(HeaderIdempotencyKey), 32)
	require.Equal(t, first.header.Get(HeaderIdempotencyKey), retry.header.Get(HeaderIdempotencyKey), "a retry carries the same key")
	require.NotEqual(t, first.header.Get(HeaderIdempotencyKey), byPath["/v1/items/c"][0].header.Get(HeaderIdempotencyKey))
}

// The records of a write are sent in parallel, up to Parallel at once.
func TestRESTSinkParallelWithinAWrite(t *testing.T) {
	t.Parallel()
	var inFlight, most atomic.Int32
	release := make(chan struct{})
	arrived := make(chan struct{}, 16)
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		arrived <- struct{}{}
		<-release
		return http.StatusCreated, nil, ""
	})
	s := api.sink(t, RESTConfig{URL: "/items", Parallel: 4})
	batch := make([]ingest.Record, 10)
	for i := range batch {
		batch[i] = rec(fmt.Sprint(i), `{}`)
	}
	done := make(chan error, 1)
	go func() { _, err := s.Write(t.Context(), batch); done <- err }()
	for range 4 {
		<-arrived
	}
	close(release)
	require.NoError(t, <-done)
	require.EqualValues(t, 4, most.Load(), "Parallel requests at once, no more")
	require.Len(t, api.requests(), 10)
}

// URL templates: fields path-escaped in the path and query-escaped in the
// query, numbers and booleans by their JSON text, the record's own {$id}
// and {$key}; a record lacking a field the URL names is refused for good,
// unsent, naming the field, and its neighbours are written.
func TestRESTURLTemplate(t *testing.T) {
	t.Parallel()
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) { return http.StatusOK, nil, "" })
	s := api.sink(t, RESTConfig{URL: "/v1/{net}/items/{code}?mag={mag}&ok={ok}&id={$id}&k={$key}"})
	batch := []ingest.Record{
		{ID: "id 1", SinkKey: "2025/05", Value: []byte(`{"net":"n c","code":"a/b?c#d","mag":2.5,"ok":true}`)},
		{ID: "id2", Value: []byte(`{"net":"ü","code":"x","mag":-1,"ok":false}`)},
		{ID: "id3", Value: []byte(`{"net":"nc","mag":1,"ok":true}`)},
		{ID: "id4", Value: []byte(`{"net":null,"code":"x","mag":1,"ok":true}`)},
		{ID: "id5", Value: []byte(`{"net":{"a":1},"code":"x","mag":1,"ok":true}`)},
		{ID: "id6", Value: []byte(`[1,2]`)},
		{ID: "id7", Value: []byte(`{"net":"..","code":"x","mag":1,"ok":true}`)},
		{ID: "id8", Value: []byte(`{"net":"nc","code":"","mag":1,"ok":true}`)},
	}
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered, ingest.Permanent, ingest.Permanent, ingest.Permanent, ingest.Permanent, ingest.Permanent, ingest.Permanent}, outcomesOf(res))
	require.Contains(t, res[2].Reason, `field "code" is missing`)
	require.Contains(t, res[3].Reason, `field "net" is null`)
	require.Contains(t, res[4].Reason, `field "net" is an object or array`)
	require.Contains(t, res[5].Reason, "not a JSON object")
	require.Contains(t, res[6].Reason, `field "net" is "..", which cannot name a resource`)
	require.Contains(t, res[7].Reason, `field "code" is "", which cannot name a resource`)

	seen := api.requests()
	require.Len(t, seen, 2, "unfit records are not sent")
	got := map[string]string{}
	for _, r := range seen {
		got[r.path] = r.query
	}
	require.Equal(t, "mag=2.5&ok=true&id=id+1&k=2025%2F05", got["/v1/n%20c/items/a%2Fb%3Fc%23d"])
	require.Equal(t, "mag=-1&ok=false&id=id2&k=id2", got["/v1/%C3%BC/items/x"], "no sink key: {$key} is the ID")
}

func TestRESTTemplatesRefused(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  RESTConfig
		want string
	}{
		{RESTConfig{URL: "ftp://h/x"}, "http:// or https://"},
		{RESTConfig{URL: "http:///x"}, "http:// or https://"},
		{RESTConfig{URL: "http://{host}/x"}, "never the host"},
		{RESTConfig{URL: "http://u:p@h/x"}, "credentials"},
		{RESTConfig{URL: "http://h/x/{id"}, "unclosed"},
		{RESTConfig{URL: "http://h/x/id}"}, "unmatched"},
		{RESTConfig{URL: "http://h/x/{}"}, "empty placeholder"},
		{RESTConfig{URL: "http://h/x/{$foo}"}, "unknown placeholder"},
		{RESTConfig{URL: "http://h/x/{$record}"}, "body template"},
		{RESTConfig{URL: "http://h/x#{id}"}, "fragment"},
		{RESTConfig{URL: "http://h/x/{id}", Array: true}, "cannot name a record's fields"},
		{RESTConfig{URL: "http://h/x", Method: "DELETE"}, "want POST, PUT or PATCH"},
		{RESTConfig{URL: "http://h/x", Body: `{"a":`}, "body template"},
		{RESTConfig{URL: "http://h/x", Body: `{"a":"x {$record}"}`}, "whole string"},
		{RESTConfig{URL: "http://h/x", Body: `{"a":"{$nope}"}`}, "unknown placeholder"},
		{RESTConfig{URL: "http://h/x", Body: `{"a":1} {"b":2}`}, "more than one JSON value"},
		{RESTConfig{URL: "http://h/x", Body: `  `}, "empty"},
		{RESTConfig{URL: "http://h/x", Status: StatusRules{DeadLetterOn: MustStatusSet("400,429")}}, "429 is never a verdict"},
		{RESTConfig{URL: "http://h/x", Status: StatusRules{DuplicateOn: MustStatusSet("401")}}, "401 is never a verdict"},
		{RESTConfig{URL: "http://h/x", Status: StatusRules{RetryOn: MustStatusSet("409"), DuplicateOn: MustStatusSet("409")}}, "both the retry and the duplicate list"},
		{RESTConfig{URL: "http://h/x", Timeout: -1}, "negative"},
	} {
		_, err := NewREST(tt.cfg)
		require.ErrorContains(t, err, tt.want, "%+v", tt.cfg)
	}
}

func TestTemplateFields(t *testing.T) {
	t.Parallel()
	u, b, err := TemplateFields("rest+https://api.example.com/v1/{net}/items/{id}?at={time}&again={id}&me={$id}", `{"n":"{net}","m":"{mag}","r":"{$record}"}`)
	require.NoError(t, err)
	require.Equal(t, []string{"net", "id", "time"}, u)
	require.Equal(t, []string{"net", "mag"}, b)
	u, b, err = TemplateFields("http://127.0.0.1:8088", "")
	require.NoError(t, err)
	require.Nil(t, u, "not a REST sink: no fields")
	require.Nil(t, b)
	_, _, err = TemplateFields("rest+http://h/{x", "")
	require.Error(t, err)
}

// Body templates: a whole-string placeholder keeps the field's JSON type,
// a placeholder inside a string is the field's text, JSON-escaped; keys
// may hold placeholders; {$record}, {$id} and {$key}.
func TestRESTBodyTemplate(t *testing.T) {
	t.Parallel()
	tmpl := `{ "event": {"id": "{$id}", "magnitude": "{mag}", "where": "{place}", "tags": ["{net}", 1, true, null, 2.50]},
		"title": "M{mag} \"{place}\"", "{net}_seen": "{ok}", "note": "ok={ok}", "raw": "{$record}", "key": "{$key}", "literal": "a\u00e9\n" }`
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) { return http.StatusCreated, nil, "" })
	s := api.sink(t, RESTConfig{URL: "/quakes", Body: tmpl})
	value := `{"mag":4.2,"place":"10 km \"N\"\nof Ridgecrest","net":"ci","ok":false}`
	res, err := s.Write(t.Context(), []ingest.Record{{ID: "ci1", Value: []byte(value)}, {ID: "x", Value: []byte(`{"mag":1}`)}})
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)
	require.Equal(t, ingest.Permanent, res[1].Outcome)
	require.Contains(t, res[1].Reason, `field "place" is missing`)

	seen := api.requests()
	require.Len(t, seen, 1)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(seen[0].body), &got), seen[0].body)
	require.Equal(t, map[string]any{
		"event": map[string]any{"id": "ci1", "magnitude": 4.2, "where": "10 km \"N\"\nof Ridgecrest", "tags": []any{"ci", 1.0, true, nil, 2.5}},
		"title": "M4.2 \"10 km \"N\"\nof Ridgecrest\"", "ci_seen": false, "raw": map[string]any{"mag": 4.2, "place": "10 km \"N\"\nof Ridgecrest", "net": "ci", "ok": false},
		"key": "ci1", "literal": "aé\n", "note": "ok=false",
	}, got)
	require.NotContains(t, seen[0].body, "\n\t", "compact JSON")
}

// With Array, a write is one request whose body is a JSON array of the
// records' bodies (unfit records left out and refused); the answer's
// status is every sent record's.
func TestRESTArrayMode(t *testing.T) {
	t.Parallel()
	status := atomic.Int32{}
	status.Store(http.StatusCreated)
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) { return int(status.Load()), nil, `{"error":"conflict"}` })
	s := api.sink(t, RESTConfig{URL: "/bulk", Array: true, Body: `{"id":"{$id}","mag":"{mag}"}`,
		Status: StatusRules{DuplicateOn: MustStatusSet("409")}})
	batch := []ingest.Record{rec("a", `{"mag":1}`), rec("b", `{"depth":2}`), rec("c", `{"mag":3}`)}
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Delivered}, outcomesOf(res))
	seen := api.requests()
	require.Len(t, seen, 1, "one request per write")
	require.JSONEq(t, `[{"id":"a","mag":1},{"id":"c","mag":3}]`, seen[0].body)

	status.Store(http.StatusConflict)
	res, err = s.Write(t.Context(), []ingest.Record{rec("a", `{"mag":1}`), rec("c", `{"mag":3}`)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Duplicate, ingest.Duplicate}, outcomesOf(res))
	require.Equal(t, seen[0].header.Get(HeaderIdempotencyKey), api.requests()[1].header.Get(HeaderIdempotencyKey), "the same records, the same key")

	// A refusal of a whole array is a suspect refusal of every record: the
	// first answer fails the write, the probe's dead-letters it.
	status.Store(http.StatusUnprocessableEntity)
	_, err = s.Write(t.Context(), []ingest.Record{rec("d", `{"mag":1}`), rec("e", `{"mag":3}`)})
	require.Error(t, err)
	res, err = s.Write(t.Context(), []ingest.Record{rec("d", `{"mag":1}`), rec("e", `{"mag":3}`)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Permanent, ingest.Permanent}, outcomesOf(res))
	require.Contains(t, res[0].Reason, "HTTP 422: {\"error\":\"conflict\"}")
}

// Every status with the default rules, each in a write beside a record
// the API stores (so a refusal is not a refusal of every record).
func TestRESTSinkEveryStatus(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status    int
		outcome   ingest.Outcome // for the record; -1: the write fails as a whole
		throttled bool
	}{
		{200, ingest.Delivered, false}, {201, ingest.Delivered, false}, {202, ingest.Delivered, false}, {204, ingest.Delivered, false},
		{408, ingest.Retryable, false}, {429, ingest.Retryable, true}, {500, ingest.Retryable, false},
		{502, ingest.Retryable, false}, {503, ingest.Retryable, false}, {504, ingest.Retryable, false}, {599, ingest.Retryable, false},
		{400, ingest.Permanent, false}, {409, ingest.Permanent, false}, {410, ingest.Permanent, false},
		{413, ingest.Permanent, false}, {422, ingest.Permanent, false}, {418, ingest.Permanent, false},
		{401, -1, false}, {403, -1, false}, {404, -1, false}, {405, -1, false}, {407, -1, false},
		{501, -1, false}, {505, -1, false}, {301, -1, false}, {304, -1, false},
	} {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			t.Parallel()
			api := newFaultAPI(t, statusByID)
			s := api.sink(t, RESTConfig{URL: "/items/{$id}"})
			res, err := s.Write(t.Context(), []ingest.Record{rec("ok-1", `{}`), rec(fmt.Sprintf("s%d-x", tt.status), `{}`)})
			if tt.outcome == -1 {
				require.Nil(t, res)
				var se *ingest.SinkError
				require.ErrorAs(t, err, &se)
				require.False(t, se.Throttled)
				require.ErrorContains(t, err, fmt.Sprintf("HTTP %d", tt.status))
				require.ErrorContains(t, err, "POST "+api.srv.URL+"/items/{…}")
				return
			}
			require.NoError(t, err)
			require.Equal(t, ingest.Delivered, res[0].Outcome)
			require.Equal(t, tt.outcome, res[1].Outcome, res[1].Reason)
			require.Equal(t, tt.throttled, res[1].Throttled)
			if tt.outcome != ingest.Delivered {
				require.Equal(t, fmt.Sprintf(`HTTP %d: {"error":"status %d for s%d-x"}`, tt.status, tt.status, tt.status), res[1].Reason)
			}
		})
	}
}

// The user's lists: 409 a duplicate, 404 per record when named exactly, a
// status no list names (418 with a narrower dead-letter list) sink-wide,
// an entry with text matching the answer's body (json-server's 500 for an
// id it holds), and that entry not matching another 500.
func TestRESTSinkUserStatusLists(t *testing.T) {
	t.Parallel()
	api := newFaultAPI(t, func(r restRequest) (int, http.Header, string) {
		switch {
		case strings.HasSuffix(r.path, "/dup500"):
			return 500, http.Header{"Content-Type": {"text/html"}}, "Error: Insert failed, duplicate id\n    at Function.insert (index.js:49:18)"
		case strings.HasSuffix(r.path, "/crash500"):
			return 500, nil, "Error: out of memory"
		}
		return statusByID(r)
	})
	s := api.sink(t, RESTConfig{URL: "/items/{$id}", Status: StatusRules{
		RetryOn:      MustStatusSet("408,429,5xx"),
		DeadLetterOn: MustStatusSet("400,404,409:already archived,422"),
		DuplicateOn:  MustStatusSet("409,500:Duplicate ID"),
	}})
	res, err := s.Write(t.Context(), []ingest.Record{rec("ok", `{}`), rec("s409-a", `{}`), rec("s404-b", `{}`), rec("dup500", `{}`), rec("crash500", `{}`), rec("s422-c", `{}`)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Duplicate, ingest.Permanent, ingest.Duplicate, ingest.Retryable, ingest.Permanent}, outcomesOf(res))

	_, err = s.Write(t.Context(), []ingest.Record{rec("ok", `{}`), rec("s418-a", `{}`)})
	require.ErrorContains(t, err, "HTTP 418", "a status no list names fails the write as a whole")
}

func TestParseStatusSet(t *testing.T) {
	t.Parallel()
	set, err := ParseStatusSet(" 408, 429 ,5XX,502-504,500:Duplicate ID,")
	require.NoError(t, err)
	require.Equal(t, "408,429,5XX,502-504,500:Duplicate ID", set.String())
	require.Equal(t, 2, set.match(429, ""))
	require.Equal(t, 1, set.match(503, ""))
	require.Equal(t, 4, set.match(500, "error: duplicate id"))
	require.Equal(t, 1, set.match(500, "other"))
	require.Zero(t, set.match(404, ""))
	for _, bad := range []string{"2xx", "204", "abc", "600", "99", "5-4", "6xx", "500:", "400-"} {
		_, err := ParseStatusSet(bad)
		require.Error(t, err, bad)
	}
}

// A write whose every request answered 401 (or 403, 404 ...) is a failure
// of the whole write, never per-record dead letters; so is a write whose
// requests all failed in transport. A request failing in transport beside
// answered ones is retried alone.
func TestRESTSinkWideFailures(t *testing.T) {
	t.Parallel()
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) {
		return http.StatusUnauthorized, nil, `{"error":"invalid token"}`
	})
	s := api.sink(t, RESTConfig{URL: "/items"})
	for range 3 {
		res, err := s.Write(t.Context(), []ingest.Record{rec("a", `{}`), rec("b", `{}`)})
		require.Nil(t, res)
		require.ErrorContains(t, err, `HTTP 401: {"error":"invalid token"}`)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	down, err := NewREST(RESTConfig{URL: "http://" + addr + "/items"})
	require.NoError(t, err)
	defer down.Close()
	res, err := down.Write(t.Context(), []ingest.Record{rec("a", `{}`)})
	require.Nil(t, res)
	require.ErrorContains(t, err, "connection refused")
	require.ErrorContains(t, down.Warm(t.Context(), 2), "does not answer")

	// One connection of three dropped without an answer.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/drop") {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	flaky, err := NewREST(RESTConfig{URL: srv.URL + "/items/{$id}"})
	require.NoError(t, err)
	defer flaky.Close()
	res, err = flaky.Write(t.Context(), []ingest.Record{rec("a", `{}`), rec("drop", `{}`), rec("c", `{}`)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Retryable, ingest.Delivered}, outcomesOf(res))
	require.Contains(t, res[1].Reason, "request failed")
	_, err = flaky.Write(t.Context(), []ingest.Record{rec("drop", `{}`)})
	require.Error(t, err, "every request failed in transport: a failure of the whole write")
}

// Any 2xx is a success, whatever the body says.
func TestRESTSinkAny2xxIsSuccess(t *testing.T) {
	t.Parallel()
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) { return http.StatusOK, nil, `{"ok":true}` })
	s := api.sink(t, RESTConfig{URL: "/anything"})
	batch := make([]ingest.Record, 10)
	for i := range batch {
		batch[i] = rec(fmt.Sprint(i), `{"n":1}`)
	}
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, ingest.Delivered, r.Outcome)
	}
	require.Len(t, api.requests(), 10, "one request a record, no retries")
}

func TestRESTSinkCancelled(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) { <-block; return http.StatusCreated, nil, "" })
	defer close(block)
	s := api.sink(t, RESTConfig{URL: "/items"})
	ctx, cancel := context.WithTimeoutCause(t.Context(), 50*time.Millisecond, fmt.Errorf("test deadline"))
	defer cancel()
	res, err := s.Write(ctx, []ingest.Record{rec("a", `{}`), rec("b", `{}`)})
	require.Nil(t, res)
	require.EqualError(t, err, "test deadline")
}

// Warm opens connections (TCP, and TLS for https) without sending a
// request, and the first requests use them: the API sees no new
// connection and no request before the writes.
func TestRESTSinkWarm(t *testing.T) {
	t.Parallel()
	for _, tls := range []bool{false, true} {
		t.Run(fmt.Sprint("tls=", tls), func(t *testing.T) {
			t.Parallel()
			var conns, requests atomic.Int32
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				requests.Add(1)
				w.WriteHeader(http.StatusCreated)
			}))
			srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
				if st == http.StateNew {
					conns.Add(1)
				}
			}
			if tls {
				srv.StartTLS()
			} else {
				srv.Start()
			}
			t.Cleanup(srv.Close)
			s, err := NewREST(RESTConfig{URL: srv.URL + "/items/{$id}", InsecureSkipVerify: tls})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			require.NoError(t, s.Warm(t.Context(), 4))
			require.Eventually(t, func() bool { return conns.Load() == 4 }, 5*time.Second, 5*time.Millisecond)
			require.Zero(t, requests.Load(), "warming sends nothing")
			require.NoError(t, s.Warm(t.Context(), 4), "topped up, not doubled")
			batch := []ingest.Record{rec("a", `{}`), rec("b", `{}`), rec("c", `{}`), rec("d", `{}`)}
			for range 3 {
				res, err := s.Write(t.Context(), batch)
				require.NoError(t, err)
				require.Equal(t, ingest.Delivered, res[3].Outcome)
			}
			require.EqualValues(t, 12, requests.Load())
			require.EqualValues(t, 4, conns.Load(), "the writes used the warmed connections")
		})
	}
}

// Open selects the REST sink by its scheme, with the headers file and the
// Authorization given apart (as the HTTP sink takes them) and the REST
// options.
func TestOpenREST(t *testing.T) {
	t.Parallel()
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) { return http.StatusNoContent, nil, "" })
	headers := filepath.Join(t.TempDir(), "headers")
	require.NoError(t, os.WriteFile(headers, []byte("# the API's key\nX-Api-Key: k3y\nAuthorization: Basic old\n"), 0o600))
	s, err := Open(t.Context(), "rest+"+api.srv.URL+"/v2/quakes/{id}", OpenConfig{
		HeadersFile: headers, Authorization: "Bearer new",
		REST: RESTOptions{Method: "PATCH", Body: `{"m":"{mag}"}`, Status: StatusRules{DuplicateOn: MustStatusSet("409")}},
	})
	require.NoError(t, err)
	defer s.Close()
	res, err := s.Write(t.Context(), []ingest.Record{rec("q1", `{"id":"q1","mag":2}`)})
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)
	seen := api.requests()
	require.Len(t, seen, 1)
	require.Equal(t, http.MethodPatch, seen[0].method)
	require.Equal(t, "/v2/quakes/q1", seen[0].path)
	require.Equal(t, `{"m":2}`, seen[0].body)
	require.Equal(t, "k3y", seen[0].header.Get("X-Api-Key"))
	require.Equal(t, "Bearer new", seen[0].header.Get("Authorization"))

	_, err = Open(t.Context(), "rest+"+api.srv.URL+"/q", OpenConfig{REST: RESTOptions{Method: "GET"}})
	require.ErrorIs(t, err, ErrSinkURL)
	require.Equal(t, "rest+https://api.example.com/v1/{id}?k={key}", Redact("rest+https://api.example.com/v1/{id}?k={key}"))
}
