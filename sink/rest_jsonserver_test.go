package sink

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink/sinktest"
)

// jsonServerURL is the base URL of a real json-server (npm) with an
// "items" collection: SLUICE_TEST_JSONSERVER_URL, or the one
// scripts/jsonserver.sh starts (idempotent; the Makefile stops it).
func jsonServerURL(t testing.TB) string {
	t.Helper()
	return jsonServerService.URL(t)
}

// jsonServerDuplicate is how json-server 0.17 answers a POST of an id it
// holds: 500 with "Error: Insert failed, duplicate id" (lodash-id's
// insert). The REST sink maps exactly that answer to Duplicate; any other
// 500 stays retryable.
const jsonServerDuplicate = "500:duplicate id"

// openJSONServer is a REST sink that POSTs to json-server's items, each
// record as {"id": "<prefix>-<ID>", "mag": <mag>} (records without mag are
// refused, unsent, as a schema would refuse them), the prefix making the
// collection fresh for each test.
func openJSONServer(t testing.TB, prefix string, duplicates bool) *RESTSink {
	t.Helper()
	return openJSONServerAt(t, jsonServerURL(t), prefix, duplicates)
}

// openJSONServerAt is openJSONServer's sink on base, json-server's URL or
// a proxy's in front of it.
func openJSONServerAt(t testing.TB, base, prefix string, duplicates bool) *RESTSink {
	t.Helper()
	rules := StatusRules{}
	if duplicates {
		rules.DuplicateOn = MustStatusSet(jsonServerDuplicate)
	}
	s, err := NewREST(RESTConfig{URL: base + "/items", Body: `{"id":"` + prefix + `-{$id}","mag":"{mag}"}`, Status: rules})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestRESTConformanceJSONServer(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	prefixes := map[ingest.Sink]string{}
	sinktest.Suite{
		Open: func(t *testing.T) ingest.Sink {
			prefix := fmt.Sprintf("t%d", rand.Int64())
			s := openJSONServer(t, prefix, true)
			mu.Lock()
			prefixes[s] = prefix
			mu.Unlock()
			return s
		},
		// json-server's own 500 for an id it holds, seen by a sink that was
		// not told it means a duplicate: retryable, as any 500 is.
		Retryable: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			batch := []ingest.Record{{ID: "r", Value: []byte(`{"mag":1}`)}}
			res, err := s.Write(t.Context(), batch)
			require.NoError(t, err)
			require.Equal(t, ingest.Delivered, res[0].Outcome)
			mu.Lock()
			prefix := prefixes[s]
			mu.Unlock()
			return openJSONServer(t, prefix, false), batch
		},
		// json-server has no rate limit: a proxy in front of it answers the
		// POSTs of "hot" records 429 with Retry-After, as a rate-limited
		// REST API does, and forwards the others, which json-server stores.
		Throttled: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			p := newAnswerProxy(t, jsonServerURL(t), func(r *http.Request, body []byte) (serverAnswer, bool) {
				return serverAnswer{status: http.StatusTooManyRequests, header: http.Header{"Retry-After": {"1"}, "Content-Type": {"application/json"}},
					body: `{"error":"rate limit exceeded"}`}, r.Method == http.MethodPost && bytes.Contains(body, []byte(`-hot`))
			})
			mu.Lock()
			prefix := prefixes[s]
			mu.Unlock()
			batch := []ingest.Record{{ID: "cold1", Value: []byte(`{"mag":1}`)}, {ID: "hot1", Value: []byte(`{"mag":2}`)}, {ID: "cold2", Value: []byte(`{"mag":3}`)}}
			t.Cleanup(func() {
				require.Positive(t, p.answered.Load(), "the proxy answered no request itself")
				for id, want := range map[string]int{"cold1": http.StatusOK, "cold2": http.StatusOK, "hot1": http.StatusNotFound} {
					resp, err := http.Get(jsonServerURL(t) + "/items/" + prefix + "-" + id)
					require.NoError(t, err)
					_ = resp.Body.Close()
					require.Equal(t, want, resp.StatusCode, "%s: the records forwarded are stored, the answered one is not", id)
				}
			})
			return openJSONServerAt(t, p.url, prefix, true), batch
		},
		// A collection the server does not have: 404 for every request.
		Down: func(t *testing.T) ingest.Sink {
			s, err := NewREST(RESTConfig{URL: jsonServerURL(t) + "/no-such-collection", Body: `{"id":"{$id}"}`})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	}.Run(t)
}

// json-server's own refusal of a record, with the record sent as is: a
// value that is JSON but not an object is answered 400 by its body parser,
// and dead-lettered alone while its neighbours are stored.
func TestRESTJSONServerRefusesARecord(t *testing.T) {
	t.Parallel()
	s, err := NewREST(RESTConfig{URL: jsonServerURL(t) + "/items", Status: StatusRules{DuplicateOn: MustStatusSet(jsonServerDuplicate)}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	prefix := fmt.Sprintf("as-is-%d", rand.Int64())
	batch := []ingest.Record{
		{ID: "a", Value: []byte(`{"id":"` + prefix + `-a","mag":1}`)},
		{ID: "b", Value: []byte(`"just a string"`)},
		{ID: "c", Value: []byte(`{"id":"` + prefix + `-c","mag":2}`)},
	}
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Delivered}, outcomesOf(res))
	require.Contains(t, res[1].Reason, "HTTP 400")
	require.Contains(t, res[1].Reason, "is not valid JSON", "the body parser's message, HTML tags dropped")
	res, err = s.Write(t.Context(), []ingest.Record{batch[0], batch[2]})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Duplicate, ingest.Duplicate}, outcomesOf(res))
}
