package sink

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/iterator"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink/sinktest"
)

// gcsService is a real Cloud Storage emulator (fake-gcs-server):
// SLUICE_TEST_GCS_URL, or the one scripts/gcs.sh starts (idempotent; the
// Makefile stops it).
var gcsService = &service{env: "SLUICE_TEST_GCS_URL", script: "gcs.sh"}

func gcsEndpoint(t testing.TB) string {
	t.Helper()
	return gcsService.URL(t)
}

// openGCS opens a GCSSink on a fresh bucket of the emulator, with objects
// under "quakes/".
func openGCS(t testing.TB, tweak ...func(*GCSConfig)) *GCSSink {
	t.Helper()
	cfg := GCSConfig{Bucket: freshBucket(), Prefix: "quakes", Endpoint: gcsEndpoint(t), CreateBucket: true,
		Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	for _, f := range tweak {
		f(&cfg)
	}
	s, err := NewGCS(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// gcsAt is a sink on endpoint (a proxy, a stopped server) without NewGCS's
// bucket check.
func gcsAt(t *testing.T, endpoint, bucket string, layout GCSLayout) *GCSSink {
	transport, client, err := gcsClient(t.Context(), endpoint)
	require.NoError(t, err)
	s := &GCSSink{client: client, bucket: client.Bucket(bucket), transport: transport, name: bucket, prefix: "quakes/",
		layout: layout, spread: DefaultGCSSpread, timeout: 2 * time.Second, log: slog.New(slog.DiscardHandler)}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func gcsStopped(t *testing.T, layout GCSLayout) *GCSSink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return gcsAt(t, "http://"+addr, "quakes", layout)
}

// gcsObjects lists the names under the sink's prefix with the JSON API.
func gcsObjects(t testing.TB, s *GCSSink) []string {
	t.Helper()
	var names []string
	it := s.bucket.Objects(t.Context(), &storage.Query{Prefix: s.prefix})
	for {
		o, err := it.Next()
		if err == iterator.Done {
			break
		}
		require.NoError(t, err)
		names = append(names, o.Name)
	}
	return names
}

// gcsObject reads an object's bytes as stored (Accept-Encoding: gzip
// turns off decompressive transcoding of gzip objects).
func gcsObject(t testing.TB, endpoint, bucket, name string) []byte {
	t.Helper()
	u := endpoint + "/storage/v1/b/" + bucket + "/o/" + url.PathEscape(name) + "?alt=media"
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	require.NoError(t, err)
	req.Header.Set("Accept-Encoding", "gzip") // as stored: no decompressive transcoding
	req.Close = true                          // no idle connection left behind
	resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(data))
	return data
}

// gcsProxy is a reverse proxy in front of the emulator, which cannot
// throttle: answer, when it returns ok, answers an upload in the
// server's place (as Cloud Storage answers under load: 429, 503); every
// other request goes through.
type gcsProxy struct {
	srv    *httptest.Server
	mu     sync.Mutex
	answer func(body []byte) (status int, hdr http.Header, reply string, ok bool)
}

func newGCSProxy(t *testing.T) *gcsProxy {
	u, err := url.Parse(gcsEndpoint(t))
	require.NoError(t, err)
	p := &gcsProxy{}
	proxy := reverseProxy(t, u)
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		answer := p.answer
		p.mu.Unlock()
		if answer != nil && strings.HasPrefix(r.URL.Path, "/upload/") {
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
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *gcsProxy) set(answer func(body []byte) (int, http.Header, string, bool)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answer = answer
}

// gcsError is the JSON API's error body.
func gcsError(code int, reason, message string) string {
	return fmt.Sprintf(`{"error":{"code":%d,"message":%q,"errors":[{"domain":"global","reason":%q,"message":%q}]}}`, code, message, reason, message)
}

func TestGCSConformance(t *testing.T) {
	t.Parallel()
	sinktest.Suite{
		Open: func(t *testing.T) ingest.Sink { return openGCS(t) },
		// fake-gcs-server does not fail an upload on demand: the proxy in
		// front of it answers 500 backendError for the uploads of "fail"
		// objects, as Cloud Storage does when a backend fails, and lets the
		// others through to the emulator.
		Retryable: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			p := newGCSProxy(t)
			p.set(func(body []byte) (int, http.Header, string, bool) {
				if bytes.Contains(body, []byte("quakes/fail")) {
					return http.StatusInternalServerError, nil, gcsError(500, "backendError", "Backend Error"), true
				}
				return 0, nil, "", false
			})
			batch := []ingest.Record{{ID: "cold1", Value: []byte(`{"mag":1}`)}, {ID: "fail1", Value: []byte(`{"mag":2}`)}, {ID: "cold2", Value: []byte(`{"mag":3}`)}}
			return gcsAt(t, p.srv.URL, s.(*GCSSink).name, GCSPerRecord), batch
		},
		// fake-gcs-server does not throttle: a proxy in front of it
		// answers 429 with Retry-After for the uploads of "hot" objects,
		// as Cloud Storage does for a key range over its write rate, and
		// lets the others through to the emulator.
		Throttled: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			p := newGCSProxy(t)
			p.set(func(body []byte) (int, http.Header, string, bool) {
				if bytes.Contains(body, []byte("quakes/hot")) {
					return http.StatusTooManyRequests, http.Header{"Retry-After": {"1"}}, gcsError(429, "rateLimitExceeded", "The object exceeded the rate limit for object mutation operations"), true
				}
				return 0, nil, "", false
			})
			batch := []ingest.Record{{ID: "cold1", Value: []byte(`{"mag":1}`)}, {ID: "hot1", Value: []byte(`{"mag":2}`)}, {ID: "hot2", Value: []byte(`{"mag":3}`)}}
			return gcsAt(t, p.srv.URL, s.(*GCSSink).name, GCSPerRecord), batch
		},
		// The bucket is deleted under the sink: 404 for every upload.
		Down: func(t *testing.T) ingest.Sink {
			s := openGCS(t)
			require.NoError(t, s.bucket.Delete(t.Context()))
			return s
		},
		// A stopped server: nothing listens on the port.
		Stopped: func(t *testing.T) ingest.Sink { return gcsStopped(t, GCSPerRecord) },
		// An object name over Cloud Storage's 1,024 bytes.
		Bad: func(id string) ingest.Record {
			return ingest.Record{ID: id, SinkKey: strings.Repeat("k", 1100), Value: []byte(`{"mag":1}`), Cost: 1}
		},
	}.Run(t)
}

// The per-batch layout passes the suite's cases in their per-batch form.
func TestGCSBatchLayout(t *testing.T) {
	t.Parallel()
	good := func(id string) ingest.Record { return ingest.Record{ID: id, Value: []byte(`{"mag":1.5}`), Cost: 1} }
	for _, gz := range []bool{false, true} {
		t.Run(fmt.Sprintf("gzip=%v", gz), func(t *testing.T) {
			t.Parallel()
			s := openGCS(t, func(c *GCSConfig) { c.Layout, c.Gzip, c.Spread = GCSPerBatch, gz, 3 })
			batch := []ingest.Record{good("a"), {ID: "b", Value: []byte(`[1]`)}, good("c"), {ID: "d", Value: []byte(`{not json`)}, good("e")}
			res, err := s.Write(t.Context(), batch)
			require.NoError(t, err)
			require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Delivered, ingest.Permanent, ingest.Delivered}, outcomesOf(res))

			names := gcsObjects(t, s)
			require.Len(t, names, 1)
			suffix := ".ndjson"
			if gz {
				suffix += ".gz"
			}
			require.Regexp(t, `^quakes/[0-9a-f]{3}/a-[0-9a-f]{16}`+strings.ReplaceAll(suffix, ".", `\.`)+`$`, names[0])
			body := gcsObject(t, gcsEndpoint(t), s.name, names[0])
			if gz {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				require.NoError(t, err)
				body, err = io.ReadAll(zr)
				require.NoError(t, err)
			}
			require.Equal(t, "{\"mag\":1.5}\n{\"mag\":1.5}\n{\"mag\":1.5}\n", string(body))

			// The same batch again (a whole-write retry): the same object.
			res, err = s.Write(t.Context(), batch)
			require.NoError(t, err)
			require.Equal(t, []ingest.Outcome{ingest.Duplicate, ingest.Permanent, ingest.Duplicate, ingest.Permanent, ingest.Duplicate}, outcomesOf(res))
			// Another batch with a stored record: a new object.
			res, err = s.Write(t.Context(), []ingest.Record{good("a"), good("f")})
			require.NoError(t, err)
			require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered}, outcomesOf(res))
			require.Len(t, gcsObjects(t, s), 2)
		})
	}
	t.Run("down", func(t *testing.T) {
		t.Parallel()
		s := openGCS(t, func(c *GCSConfig) { c.Layout = GCSPerBatch })
		require.NoError(t, s.bucket.Delete(t.Context()))
		res, err := s.Write(t.Context(), []ingest.Record{good("x1"), good("x2")})
		require.ErrorContains(t, err, "404")
		require.Nil(t, res)
		res, err = gcsStopped(t, GCSPerBatch).Write(t.Context(), []ingest.Record{good("x1")})
		require.Error(t, err)
		require.Nil(t, res)
	})
}

func TestGCSObjectNames(t *testing.T) {
	t.Parallel()
	s := openGCS(t)
	recs := []ingest.Record{
		{ID: "us1", SinkKey: "3f/2025-05-01T00:00:00Z/us1", Value: []byte(`{"mag":4.5}`)},
		{ID: "us2", Value: []byte(` {"mag":1} `)},
		{ID: "odd", SinkKey: "a//b/./c\nd%e", Value: []byte(`{"mag":2}`)},
		{ID: "us2-again", SinkKey: "us2", Value: []byte(`{"mag":1}`)}, // the same name in the batch
	}
	res, err := s.Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered, ingest.Delivered, ingest.Duplicate}, outcomesOf(res))
	require.ElementsMatch(t, []string{"quakes/3f/2025-05-01T00:00:00Z/us1.json", "quakes/us2.json", `quakes/a/%2F/b/%2E/c%0Ad%25e.json`}, gcsObjects(t, s))
	require.JSONEq(t, `{"mag":4.5}`, string(gcsObject(t, gcsEndpoint(t), s.name, "quakes/3f/2025-05-01T00:00:00Z/us1.json")))
	attrs, err := s.bucket.Object("quakes/us2.json").Attrs(t.Context())
	require.NoError(t, err)
	require.Equal(t, "application/json", attrs.ContentType)
}

func TestGCSThrottlingAndFailures(t *testing.T) {
	t.Parallel()
	recs := []ingest.Record{{ID: "a", Value: []byte(`{"mag":1}`)}, {ID: "b", Value: []byte(`{"mag":2}`)}}
	bucket := openGCS(t).name
	p := newGCSProxy(t)
	always := func(status int, hdr http.Header, reply string) {
		p.set(func([]byte) (int, http.Header, string, bool) { return status, hdr, reply, true })
	}

	// Every upload throttled, 503 or 429: the write is throttled as a
	// whole, in either layout, Retry-After honoured.
	for _, layout := range []GCSLayout{GCSPerRecord, GCSPerBatch} {
		s := gcsAt(t, p.srv.URL, bucket, layout)
		always(http.StatusServiceUnavailable, http.Header{"Retry-After": {"3"}}, gcsError(503, "backendError", "Service Unavailable"))
		_, err := s.Write(t.Context(), recs)
		se := (*ingest.SinkError)(nil)
		require.ErrorAs(t, err, &se, layout)
		require.True(t, se.Throttled, layout)
		require.Equal(t, 3*time.Second, se.RetryAfter, layout)

		always(http.StatusTooManyRequests, nil, gcsError(429, "rateLimitExceeded", "rate limit"))
		_, err = s.Write(t.Context(), recs)
		require.ErrorAs(t, err, &se, layout)
		require.True(t, se.Throttled, layout)
	}

	s := gcsAt(t, p.srv.URL, bucket, GCSPerRecord)
	// A 500 beside a stored object: retried, not throttled.
	p.set(func(body []byte) (int, http.Header, string, bool) {
		if bytes.Contains(body, []byte("quakes/b.json")) {
			return http.StatusInternalServerError, nil, gcsError(500, "backendError", "Backend Error"), true
		}
		return 0, nil, "", false
	})
	res, err := s.Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Retryable}, outcomesOf(res))
	require.False(t, res[1].Throttled)
	require.Contains(t, res[1].Reason, "HTTP 500: Backend Error")

	// Refused credentials for every upload: the whole write failed.
	always(http.StatusForbidden, nil, gcsError(403, "forbidden", "sluice@example.iam.gserviceaccount.com does not have storage.objects.create access"))
	res, err = s.Write(t.Context(), []ingest.Record{{ID: "c", Value: []byte(`{"mag":1}`)}, {ID: "d", Value: []byte(`{"mag":1}`)}})
	require.ErrorContains(t, err, "storage.objects.create")
	require.Nil(t, res)

	// The request deadline with one answer in: it stands, and the record
	// without one is retried as throttled. Its upload did reach the
	// emulator, so its retry finds it stored (412): delivered, not a
	// duplicate, as its own unanswered upload stored it.
	release := make(chan struct{})
	var slowed atomic.Bool
	p.set(nil)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte("quakes/f.json")) && slowed.CompareAndSwap(false, true) {
			rec := httptest.NewRecorder()
			p.srv.Config.Handler.ServeHTTP(rec, r) // stored now
			<-release                              // answered too late
			return
		}
		p.srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	ss := gcsAt(t, slow.URL, bucket, GCSPerRecord)
	late := []ingest.Record{{ID: "e", Value: []byte(`{"mag":1}`)}, {ID: "f", Value: []byte(`{"mag":2}`)}}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	res, err = ss.Write(ctx, late)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Retryable}, outcomesOf(res))
	require.True(t, res[1].Throttled)
	require.Contains(t, res[1].Reason, "no answer within the request deadline")
	close(release)
	res, err = ss.Write(t.Context(), late[1:])
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered}, outcomesOf(res))
	res, err = ss.Write(t.Context(), late[1:])
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Duplicate}, outcomesOf(res))
}

// reverseProxy is a reverse proxy to target whose connections are closed
// when the test ends.
func reverseProxy(t *testing.T, target *url.URL) *httputil.ReverseProxy {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(transport.CloseIdleConnections)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = transport
	return proxy
}

// dropSecond serves HTTP/1.1 on a loopback port: it answers every request
// with reply's body, except the second request it reads, which it reads
// in full and then closes the connection on without answering (a server
// that stored a write and died). It counts the requests read, and
// reports whether the dropped one came on a reused connection, the case
// in which net/http's transport may send a request again by itself.
func dropSecond(t *testing.T, reply func(*http.Request) string) (base string, requests *atomic.Int32, reused *atomic.Bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	requests, reused = &atomic.Int32{}, &atomic.Bool{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for served := 0; ; served++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if requests.Add(1) == 2 {
						reused.Store(served > 0)
						return
					}
					body := reply(req)
					_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String(), requests, reused
}

// A write whose connection dies after the server read it is the write's
// failure, for the worker to pace and send again: neither sink's
// transport nor client sends it a second time by itself.
func TestWritesAreNotReplayedByTheTransport(t *testing.T) {
	t.Parallel()
	t.Run("opensearch", func(t *testing.T) {
		t.Parallel()
		base, requests, reused := dropSecond(t, func(*http.Request) string {
			return `{"errors":false,"items":[{"create":{"_id":"a","status":201,"result":"created"}}]}`
		})
		s := osAt(t, base, "quakes")
		res, err := s.Write(t.Context(), []ingest.Record{quake("a", 1)})
		require.NoError(t, err)
		require.Equal(t, []ingest.Outcome{ingest.Delivered}, outcomesOf(res))
		_, err = s.Write(t.Context(), []ingest.Record{quake("a", 1)})
		require.Error(t, err)
		require.True(t, reused.Load(), "the second request went on the kept-alive connection")
		require.EqualValues(t, 2, requests.Load(), "the dropped request was sent once")
	})
	t.Run("gcs", func(t *testing.T) {
		t.Parallel()
		base, requests, reused := dropSecond(t, func(*http.Request) string {
			return `{"kind":"storage#object","bucket":"quakes","name":"quakes/a.json","generation":"1","metageneration":"1"}`
		})
		s := gcsAt(t, base, "quakes", GCSPerRecord)
		res, err := s.Write(t.Context(), []ingest.Record{{ID: "a", Value: []byte(`{"mag":1}`)}})
		require.NoError(t, err)
		require.Equal(t, []ingest.Outcome{ingest.Delivered}, outcomesOf(res))
		_, err = s.Write(t.Context(), []ingest.Record{{ID: "b", Value: []byte(`{"mag":1}`)}})
		require.Error(t, err)
		require.True(t, reused.Load(), "the second request went on the kept-alive connection")
		require.EqualValues(t, 2, requests.Load(), "the dropped upload was sent once")
	})
}

func TestNewGCSRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []GCSConfig{
		{Bucket: "ab"},
		{Bucket: "Quakes"},
		{Bucket: "-quakes"},
		{Bucket: "quakes", Layout: "tree"},
		{Bucket: "quakes", Spread: 33},
		{Bucket: "quakes", Gzip: true},
		{Bucket: "quakes", Timeout: -1},
		{Bucket: "quakes", CreateBucket: true},
		{Bucket: "quakes", Prefix: "a\nb"},
	} {
		_, err := NewGCS(t.Context(), cfg)
		require.ErrorIs(t, err, ErrGCSConfig, "%+v", cfg)
	}
	_, err := NewGCS(t.Context(), GCSConfig{Bucket: "missing-bucket", Endpoint: gcsEndpoint(t)})
	require.ErrorContains(t, err, "missing-bucket", "a missing bucket without create_bucket")
}

// Without an emulator (an endpoint or STORAGE_EMULATOR_HOST) the client
// authenticates with Application Default Credentials: a credentials file
// that cannot be read is a config error (no request is sent).
func TestGCSApplicationDefaultCredentials(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "missing.json")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", bad)
	t.Setenv("STORAGE_EMULATOR_HOST", "")
	_, err := NewGCS(t.Context(), GCSConfig{Bucket: "quakes"})
	require.ErrorIs(t, err, ErrGCSConfig)
	require.ErrorContains(t, err, "Application Default Credentials")

	// STORAGE_EMULATOR_HOST, as the client reads it: no credentials needed.
	t.Setenv("STORAGE_EMULATOR_HOST", gcsEndpoint(t))
	s, err := NewGCS(t.Context(), GCSConfig{Bucket: freshBucket(), CreateBucket: true, Project: "sluice-test", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	res, err := s.Write(t.Context(), []ingest.Record{{ID: "a", Value: []byte(`{"mag":1}`)}})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered}, outcomesOf(res))
	require.NoError(t, s.Close())
	t.Setenv("STORAGE_EMULATOR_HOST", "")

	garbled := filepath.Join(t.TempDir(), "key.json")
	require.NoError(t, os.WriteFile(garbled, []byte(`{"type":"service_account"`), 0o600))
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", garbled)
	_, err = NewGCS(t.Context(), GCSConfig{Bucket: "quakes"})
	require.ErrorIs(t, err, ErrGCSConfig)
}

func TestOpenGCSFromURL(t *testing.T) {
	t.Parallel()
	endpoint := gcsEndpoint(t)
	bucket := freshBucket()
	s, err := Open(t.Context(), "gs://"+bucket+"/loads/2025?create_bucket=true&layout=batch&gzip=true&spread=4&endpoint="+endpoint,
		OpenConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer s.Close()
	gs := s.(*GCSSink)
	require.Equal(t, "loads/2025/", gs.prefix)
	require.Equal(t, GCSPerBatch, gs.layout)
	require.True(t, gs.gzip)
	require.Equal(t, 4, gs.spread)
	require.NoError(t, gs.Warm(t.Context(), 4))
	res, err := s.Write(t.Context(), []ingest.Record{{ID: "x", Value: []byte(`{}`)}})
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)

	for _, bad := range []string{
		"gs://ab/p",
		"gs://Quakes/p",
		"gs://quakes/p?layout=tree",
		"gs://quakes/p?gzip=true",
		"gs://quakes/p?layout=batch&spread=0",
		"gs://quakes/p?endpoint=localhost:4443",
		"gs://quakes/p?create_buckets=true",
		"gs://quakes/p?create_bucket=true",
		"gs://key:secret@quakes/p",
	} {
		require.ErrorIs(t, CheckURL(bad), ErrSinkURL, bad)
	}
	require.NoError(t, CheckURL("gs://quakes_2025?create_bucket=true&project=sluice-prod"))
}

// BenchmarkGCSWrite measures unthrottled writes into fake-gcs-server, by
// layout and batch size: go test -run '^$' -bench GCSWrite ./sink/
func BenchmarkGCSWrite(b *testing.B) {
	for _, layout := range []GCSLayout{GCSPerRecord, GCSPerBatch} {
		for _, size := range []int{25, 100, 500} {
			b.Run(fmt.Sprintf("layout=%s/batch=%d", layout, size), func(b *testing.B) {
				s := openGCS(b, func(c *GCSConfig) { c.Layout = layout })
				value := []byte(`{"mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`)
				n := 0
				for b.Loop() {
					batch := make([]ingest.Record, size)
					for i := range batch {
						n++
						batch[i] = ingest.Record{ID: fmt.Sprintf("r%09d", n), SinkKey: fmt.Sprintf("%02x/r%09d", n%256, n), Value: value}
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
}
