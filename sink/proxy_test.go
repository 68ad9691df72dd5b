package sink

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// serverAnswer is an answer a proxy gives in a real server's place.
type serverAnswer struct {
	status int
	header http.Header
	body   string
}

// answerProxy stands in front of a real server that cannot be made to
// throttle or fail one request (DynamoDB Local, MinIO, Azurite, json-server
// ignore any provisioned rate): for the requests answer picks (by their
// method, path and body) it answers itself, with the answer the service
// gives under load, and it forwards every other request to the server
// unchanged, Host header and signature included. It counts the requests
// it answered itself.
type answerProxy struct {
	url      string
	answered atomic.Int64
}

func newAnswerProxy(t *testing.T, target string, answer func(r *http.Request, body []byte) (serverAnswer, bool)) *answerProxy {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	p := &answerProxy{}
	fwd := reverseProxy(t, u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if a, ok := answer(r, body); ok {
			p.answered.Add(1)
			for k, v := range a.header {
				w.Header()[k] = v
			}
			w.WriteHeader(a.status)
			_, _ = io.WriteString(w, a.body)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		fwd.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}
