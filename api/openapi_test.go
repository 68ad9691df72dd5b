package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/recordtype"
)

func init() {
	// NDJSON is one JSON object per line: checked as text.
	openapi3filter.RegisterBodyDecoder("application/x-ndjson", openapi3filter.PlainBodyDecoder)
}

// The OpenAPI document against the real handler: every request of the
// table is answered as documented (status, headers, body schema), requests
// the document allows pass its request validation, and the statuses the
// table produces are exactly the documented ones, operation by operation.
func TestOpenAPIDocumentMatchesTheHandler(t *testing.T) {
	t.Parallel()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("openapi.yaml")
	require.NoError(t, err)
	require.NoError(t, doc.Validate(context.Background()))
	doc.Servers = nil // match the test requests' host too
	router, err := gorillamux.NewRouter(doc)
	require.NoError(t, err)

	types, err := recordtype.Load(filepath.Join("..", "examples", "types.yaml"))
	require.NoError(t, err)
	handler := func(prodErr, readyErr error) http.Handler {
		h, err := New(Config{
			Types: types, Producer: &fakeProducer{err: prodErr}, MaxBody: 1 << 20,
			Tokens:   map[[32]byte][]string{HashToken("good"): {"earthquake"}, HashToken("other"): {"earthquake-backfill"}},
			Ready:    func(context.Context) error { return readyErr },
			Registry: prometheus.NewRegistry(),
		})
		require.NoError(t, err)
		return h
	}
	down := errors.New("broker unreachable")
	tests := []struct {
		name, method, path, token, ct, body string
		prodErr, readyErr                   error
		want                                int
		validRequest                        bool // the document allows the request
	}{
		{"ndjson", "POST", "/v1/records/earthquake", "good", "application/x-ndjson", eq("a") + "\n\n" + eq("b") + "\n", nil, nil, 202, true},
		{"array", "POST", "/v1/records/earthquake", "good", "application/json", "[" + eq("a") + "]", nil, nil, 202, true},
		{"invalid record", "POST", "/v1/records/earthquake", "good", "application/json", `[{"id":"x"}]`, nil, nil, 400, true},
		{"not an array", "POST", "/v1/records/earthquake", "good", "application/json", `{"id":"x"}`, nil, nil, 400, false},
		{"no records", "POST", "/v1/records/earthquake", "good", "application/x-ndjson", "\n\n", nil, nil, 400, true},
		{"no token", "POST", "/v1/records/earthquake", "", "application/x-ndjson", eq("a"), nil, nil, 401, false},
		{"token for another type", "POST", "/v1/records/earthquake", "other", "application/x-ndjson", eq("a"), nil, nil, 403, true},
		{"unknown type", "POST", "/v1/records/quake", "good", "application/x-ndjson", eq("a"), nil, nil, 404, true},
		{"too large", "POST", "/v1/records/earthquake", "good", "application/x-ndjson", strings.Repeat(eq("a")+"\n", 40000), nil, nil, 413, true},
		{"wrong content type", "POST", "/v1/records/earthquake", "good", "text/csv", "id,time\na,b\n", nil, nil, 415, false},
		{"queue down", "POST", "/v1/records/earthquake", "good", "application/x-ndjson", eq("a"), down, nil, 503, true},
		{"health", "GET", "/healthz", "", "", "", nil, nil, 200, true},
		{"ready", "GET", "/readyz", "", "", "", nil, nil, 200, true},
		{"not ready", "GET", "/readyz", "", "", "", nil, down, 503, true},
		{"metrics", "GET", "/metrics", "", "", "", nil, nil, 200, true},
	}
	produced := map[string][]int{} // "METHOD path-template" → statuses
	for _, tt := range tests {
		req := httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
		if tt.ct != "" {
			req.Header.Set("Content-Type", tt.ct)
		}
		if tt.token != "" {
			req.Header.Set("Authorization", "Bearer "+tt.token)
		}
		route, params, err := router.FindRoute(req)
		require.NoError(t, err, tt.name)
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
		if tt.validRequest {
			require.NoError(t, openapi3filter.ValidateRequest(context.Background(), in), tt.name)
		}
		// Validation read the body: serve the handler a fresh request.
		req = httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body))
		req.Header = in.Request.Header.Clone()
		w := httptest.NewRecorder()
		handler(tt.prodErr, tt.readyErr).ServeHTTP(w, req)
		require.Equal(t, tt.want, w.Code, "%s: %s", tt.name, w.Body.String())
		in.Request = req
		require.NoError(t, openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: w.Code, Header: w.Header(), Body: io.NopCloser(bytes.NewReader(w.Body.Bytes())),
		}), "%s: the answer %d %s", tt.name, w.Code, w.Body.String())
		if w.Code == http.StatusServiceUnavailable && tt.method == "POST" {
			require.NotEmpty(t, w.Header().Get("Retry-After"), tt.name)
		}
		key := tt.method + " " + route.Path
		if !slices.Contains(produced[key], w.Code) {
			produced[key] = append(produced[key], w.Code)
		}
	}
	documented := map[string][]int{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for code := range op.Responses.Map() {
				var n int
				_, err := fmt.Sscan(code, &n)
				require.NoError(t, err, "%s %s: response %q is not a status code", method, path, code)
				documented[method+" "+path] = append(documented[method+" "+path], n)
			}
		}
	}
	for k := range documented {
		slices.Sort(documented[k])
		slices.Sort(produced[k])
	}
	require.Equal(t, documented, produced, "every documented status is produced by some request, and no other")
}
