package sink

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A REST API sees a record's identity in the URL, in a body template, or
// through an Idempotency-Key it honours; else it cannot tell a record it
// has (and start-up warns).
func TestRESTUnseenID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url, body, idField string
		honoured           bool
		unseen             bool
	}{
		{url: "rest+http://api/items", unseen: true},
		{url: "rest+http://api/items", idField: "page_id", unseen: true},                        // the record as is: the API assigns its own IDs
		{url: "rest+http://api/items", body: `{"v": "{$record}"}`, idField: "id", unseen: true}, // the whole record, still no ID the API reads
		{url: "rest+http://api/items/{$id}"},
		{url: "rest+http://api/items?key={$key}"},
		{url: "rest+http://api/items/{page_id}", idField: "page_id"},
		{url: "rest+http://api/items/{name}", idField: "page_id", unseen: true},
		{url: "rest+http://api/items", body: `{"id": "{$id}", "v": "{$record}"}`},
		{url: "rest+http://api/items", body: `{"id": "{page_id}"}`, idField: "page_id"},
		{url: "rest+http://api/items", honoured: true},
		{url: "http://127.0.0.1:8088"}, // the emulator dedupes by ID
		{url: "postgres://u@h/db?table=t"},
	} {
		got := RESTUnseenID(tc.url, RESTOptions{Body: tc.body, IdempotencyKey: tc.honoured}, tc.idField)
		require.Equal(t, tc.unseen, got, "%+v", tc)
	}
}
