package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/recordtype"
)

type fakeProducer struct {
	mu   sync.Mutex
	recs []ingest.Record
	err  error
}

func (f *fakeProducer) Produce(_ context.Context, _ string, recs []ingest.Record) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.recs = append(f.recs, recs...)
	return nil
}

func newTestHandler(t *testing.T, p ingest.Producer) *Handler {
	t.Helper()
	types, err := recordtype.Load(filepath.Join("..", "examples", "types.yaml"))
	require.NoError(t, err)
	h, err := New(Config{Types: types, Producer: p, MaxBody: 1 << 20, Tokens: map[[32]byte][]string{
		HashToken("good"): {"earthquake"}, HashToken("other"): {"nothing"}}})
	require.NoError(t, err)
	return h
}

func eq(id string) string { return fmt.Sprintf(`{"id":%q,"time":"2026-01-01"}`, id) }

func TestPostStatuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, typ, token, ct, body string
		prodErr                    error
		want                       int
		wantCode                   string
	}{
		{"accepted ndjson", "earthquake", "good", "application/x-ndjson", eq("a") + "\n" + eq("b") + "\n", nil, 202, ""},
		{"accepted array", "earthquake", "good", "application/json", "[" + eq("a") + "]", nil, 202, ""},
		{"invalid record", "earthquake", "good", "application/x-ndjson", eq("a") + "\n{\"id\":1}\n", nil, 400, "invalid_records"},
		{"no token", "earthquake", "", "application/x-ndjson", eq("a"), nil, 401, "unauthorized"},
		{"bad token", "earthquake", "nope", "application/x-ndjson", eq("a"), nil, 401, "unauthorized"},
		{"forbidden", "earthquake", "other", "application/x-ndjson", eq("a"), nil, 403, "forbidden"},
		{"unknown type", "nope", "good", "application/x-ndjson", eq("a"), nil, 404, "unknown_type"},
		{"too large", "earthquake", "good", "application/x-ndjson", strings.Repeat(eq("a")+"\n", 40000), nil, 413, "body_too_large"},
		{"wrong content type", "earthquake", "good", "text/plain", eq("a"), nil, 415, "unsupported_media_type"},
		{"kafka down", "earthquake", "good", "application/x-ndjson", eq("a"), errors.New("down"), 503, "unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := &fakeProducer{err: tt.prodErr}
			h := newTestHandler(t, p)
			req := httptest.NewRequest(http.MethodPost, "/v1/records/"+tt.typ, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", tt.ct)
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			require.Equal(t, tt.want, w.Code, w.Body.String())
			var got map[string]any
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
			if tt.wantCode != "" {
				require.Equal(t, tt.wantCode, got["code"])
				require.Empty(t, p.recs)
			} else {
				require.NotEmpty(t, p.recs)
				require.EqualValues(t, len(p.recs), got["accepted"])
			}
			if tt.want == 503 {
				require.Equal(t, "1", w.Header().Get("Retry-After"))
			}
		})
	}
}

func TestOneBadRecordAmongThousandProducesNothing(t *testing.T) {
	t.Parallel()
	p := &fakeProducer{}
	h := newTestHandler(t, p)
	var b strings.Builder
	for i := range 1000 {
		if i == 736 {
			b.WriteString(`{"time":"x"}` + "\n")
			continue
		}
		b.WriteString(eq(fmt.Sprint(i)) + "\n")
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/records/earthquake", strings.NewReader(b.String()))
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Authorization", "Bearer good")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	require.Equal(t, http.StatusBadRequest, w.Code)
	var got apiError
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
	require.Len(t, got.Records, 1)
	require.Equal(t, 737, got.Records[0].Line)
	require.Empty(t, p.recs)
}

func TestRecordIDs(t *testing.T) {
	t.Parallel()
	id, err := recordID([]byte(`{"id":"x"}`), "id", "k", 3)
	require.NoError(t, err)
	require.Equal(t, "x", id)
	id, err = recordID([]byte(`{"a":1}`), "id", "k", 3)
	require.NoError(t, err)
	require.Equal(t, "k#3", id)
	id, err = recordID([]byte(`{"a":1}`), "id", "", 3)
	require.NoError(t, err)
	require.Equal(t, ingest.ContentID([]byte(`{"a":1}`)), id)
}
