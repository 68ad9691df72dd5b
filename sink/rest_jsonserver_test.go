package sink

import (
	"fmt"
	"math/rand/v2"
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
	rules := StatusRules{}
	if duplicates {
		rules.DuplicateOn = MustStatusSet(jsonServerDuplicate)
	}
	s, err := NewREST(RESTConfig{URL: jsonServerURL(t) + "/items", Body: `{"id":"` + prefix + `-{$id}","mag":"{mag}"}`, Status: rules})
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
