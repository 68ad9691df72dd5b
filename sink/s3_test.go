package sink

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink/sinktest"
)

// s3Endpoint is the endpoint of a real S3-compatible server (MinIO):
// SLUICE_TEST_S3_URL, or the one scripts/s3.sh starts (idempotent; the
// Makefile stops it). Its credentials are awsTestCredentials'.
func s3Endpoint(t testing.TB) string {
	t.Helper()
	awsTestCredentials()
	return s3Service.URL(t)
}

func freshBucket() string { return strings.ReplaceAll(freshTable("b"), "_", "-") }

// openS3 opens an S3Sink on a fresh bucket, with objects under "quakes/".
func openS3(t testing.TB, tweak ...func(*S3Config)) *S3Sink {
	t.Helper()
	cfg := S3Config{Bucket: freshBucket(), Prefix: "quakes", Endpoint: s3Endpoint(t), CreateBucket: true,
		Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	for _, f := range tweak {
		f(&cfg)
	}
	s, err := NewS3(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// s3Stopped is a sink whose endpoint nothing listens on.
func s3Stopped(t *testing.T, layout S3Layout) ingest.Sink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return s3Client(t, "http://"+addr, layout)
}

// s3Client is a sink on endpoint without the bucket check of NewS3.
func s3Client(t *testing.T, endpoint string, layout S3Layout) *S3Sink {
	awsTestCredentials()
	cfg, transport, err := awsConfig(t.Context(), "us-east-1")
	require.NoError(t, err)
	client := s3.NewFromConfig(cfg, func(o *s3.Options) { o.BaseEndpoint, o.UsePathStyle = aws.String(endpoint), true })
	s := &S3Sink{client: client, transport: transport, bucket: "quakes", layout: layout, spread: DefaultS3Spread,
		timeout: 2 * time.Second, log: slog.New(slog.DiscardHandler)}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func deleteBucket(t *testing.T, s *S3Sink) {
	t.Helper()
	_, err := s.client.DeleteBucket(t.Context(), &s3.DeleteBucketInput{Bucket: aws.String(s.bucket)})
	require.NoError(t, err)
}

// objects lists the names under the sink's prefix.
func objects(t testing.TB, s *S3Sink) []string {
	t.Helper()
	var names []string
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(t.Context())
		require.NoError(t, err)
		for _, o := range page.Contents {
			names = append(names, aws.ToString(o.Key))
		}
	}
	return names
}

func getObject(t *testing.T, s *S3Sink, name string) []byte {
	t.Helper()
	out, err := s.client.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(name)})
	require.NoError(t, err)
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	require.NoError(t, err)
	return data
}

// s3Answer is S3's XML error answer with code and status, as the service
// sends it.
func s3Answer(status int, code, message string) serverAnswer {
	return serverAnswer{status: status, header: http.Header{"Content-Type": {"application/xml"}},
		body: `<?xml version="1.0" encoding="UTF-8"?>` + "\n" + `<Error><Code>` + code + `</Code><Message>` + message +
			`</Message><RequestId>4442587FB7D0A2F9</RequestId><HostId>sluice-test</HostId></Error>`}
}

// s3Through is a sink on the bucket of s in MinIO, through a proxy that
// answers the PUTs of objects whose name starts with marker with answer,
// as S3 answers under load, and forwards the other requests to MinIO. At
// the test's end it checks that MinIO holds the unmarked objects of
// s3Mixed, and no marked one.
func s3Through(t *testing.T, s *S3Sink, marker string, answer serverAnswer) *S3Sink {
	t.Helper()
	p := newAnswerProxy(t, s3Endpoint(t), func(r *http.Request, _ []byte) (serverAnswer, bool) {
		return answer, r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/"+s.prefix+marker)
	})
	through := s3Client(t, p.url, S3PerRecord)
	through.bucket, through.prefix, through.timeout = s.bucket, s.prefix, s.timeout
	t.Cleanup(func() {
		require.Positive(t, p.answered.Load(), "the proxy answered no request itself")
		var names []string
		out, err := s.client.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket)})
		require.NoError(t, err)
		for _, o := range out.Contents {
			names = append(names, aws.ToString(o.Key))
		}
		require.ElementsMatch(t, []string{s.prefix + "cold-0.json", s.prefix + "cold-1.json", s.prefix + "cold-2.json"}, names,
			"the objects forwarded are stored, the answered ones are not")
	})
	return through
}

// s3Mixed is 3 records and 2 whose names start with marker.
func s3Mixed(marker string) []ingest.Record {
	return []ingest.Record{
		{ID: "cold-0", Value: []byte(`{"mag":1}`), Cost: 1}, {ID: marker + "-0", Value: []byte(`{"mag":2}`), Cost: 1},
		{ID: "cold-1", Value: []byte(`{"mag":1}`), Cost: 1}, {ID: marker + "-1", Value: []byte(`{"mag":2}`), Cost: 1},
		{ID: "cold-2", Value: []byte(`{"mag":1}`), Cost: 1},
	}
}

// MinIO does not throttle nor fail a PUT on demand (its only request limit,
// api requests_max, is the whole server's, shared by every test), so the
// retryable and throttled cases put a proxy in front of it that answers
// the PUTs of chosen objects as S3 does — 500 InternalError; 503 SlowDown
// — and forwards the others, which MinIO stores. A stopped server (nothing
// listens) is a failure of the whole write. The per-batch layout, one
// object per Write, has no per-record answer: see TestS3BatchLayout.
func TestS3Conformance(t *testing.T) {
	t.Parallel()
	sinktest.Suite{
		Open: func(t *testing.T) ingest.Sink { return openS3(t) },
		Retryable: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			fail := s3Answer(http.StatusInternalServerError, "InternalError", "We encountered an internal error. Please try again.")
			return s3Through(t, s.(*S3Sink), "fail", fail), s3Mixed("fail")
		},
		Throttled: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			return s3Through(t, s.(*S3Sink), "hot", s3Answer(http.StatusServiceUnavailable, "SlowDown", "Please reduce your request rate.")), s3Mixed("hot")
		},
		// The bucket is deleted under the sink: 404 NoSuchBucket.
		Down: func(t *testing.T) ingest.Sink {
			s := openS3(t)
			deleteBucket(t, s)
			return s
		},
		Stopped: func(t *testing.T) ingest.Sink { return s3Stopped(t, S3PerRecord) },
		// An object name over S3's 1,024 bytes: 400 KeyTooLongError.
		Bad: func(id string) ingest.Record {
			return ingest.Record{ID: id, SinkKey: strings.Repeat("k", 1100), Value: []byte(`{"mag":1}`), Cost: 1}
		},
	}.Run(t)
}

// The per-batch layout cannot tell one record's redelivery from a new
// record (a batch formed again differently is another object); it passes
// the suite's cases in their per-batch form.
func TestS3BatchLayout(t *testing.T) {
	t.Parallel()
	good := func(id string) ingest.Record { return ingest.Record{ID: id, Value: []byte(`{"mag":1.5}`), Cost: 1} }
	for _, gz := range []bool{false, true} {
		t.Run(fmt.Sprintf("gzip=%v", gz), func(t *testing.T) {
			t.Parallel()
			s := openS3(t, func(c *S3Config) { c.Layout, c.Gzip, c.Spread = S3PerBatch, gz, 3 })
			batch := []ingest.Record{good("a"), {ID: "b", Value: []byte(`[1]`)}, good("c"), {ID: "d", Value: []byte(`{not json`)}, good("e")}
			res, err := s.Write(t.Context(), batch)
			require.NoError(t, err)
			require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Delivered, ingest.Permanent, ingest.Delivered}, outcomesOf(res))

			names := objects(t, s)
			require.Len(t, names, 1)
			suffix := ".ndjson"
			if gz {
				suffix += ".gz"
			}
			require.Regexp(t, `^quakes/[0-9a-f]{3}/a-[0-9a-f]{16}`+strings.ReplaceAll(suffix, ".", `\.`)+`$`, names[0])
			body := getObject(t, s, names[0])
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
			require.Len(t, objects(t, s), 2)
		})
	}
	t.Run("down", func(t *testing.T) {
		t.Parallel()
		s := openS3(t, func(c *S3Config) { c.Layout = S3PerBatch })
		deleteBucket(t, s)
		res, err := s.Write(t.Context(), []ingest.Record{good("x1"), good("x2")})
		require.ErrorContains(t, err, "NoSuchBucket")
		require.Nil(t, res)
		res, err = s3Stopped(t, S3PerBatch).Write(t.Context(), []ingest.Record{good("x1")})
		require.Error(t, err)
		require.Nil(t, res)
	})
}

func TestS3ObjectNames(t *testing.T) {
	t.Parallel()
	s := openS3(t)
	recs := []ingest.Record{
		{ID: "us1", SinkKey: "3f/2025-05-01T00:00:00Z/us1", Value: []byte(`{"mag":4.5}`)},
		{ID: "us2", Value: []byte(` {"mag":1} `)},
		{ID: "odd", SinkKey: `a//b/./c\d%e`, Value: []byte(`{"mag":2}`)},
		{ID: "us2-again", SinkKey: "us2", Value: []byte(`{"mag":1}`)}, // the same name in the batch
	}
	res, err := s.Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered, ingest.Delivered, ingest.Duplicate}, outcomesOf(res))
	require.ElementsMatch(t, []string{"quakes/3f/2025-05-01T00:00:00Z/us1.json", "quakes/us2.json", `quakes/a/%2F/b/%2E/c%5Cd%25e.json`}, objects(t, s))
	require.JSONEq(t, `{"mag":4.5}`, string(getObject(t, s, "quakes/3f/2025-05-01T00:00:00Z/us1.json")))

	for k, want := range map[string]string{
		"a/b":    "a/b",
		"/a":     "%2F/a",
		"a/":     "a/%2F",
		"..":     "%2E%2E",
		"a\x01":  "a%01",
		"50%":    "50%25",
		"ü/ß":    "ü/ß",
		"a\xffb": "a%FFb",
	} {
		require.Equal(t, want, EscapeObjectKey(k), k)
	}
}

// s3Fake answers every PUT with answer's status, headers and body, the way
// S3 answers under throttling (MinIO does not throttle).
func s3Fake(t *testing.T, layout S3Layout, answer func(key string) (int, http.Header, string)) *S3Sink {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		status, hdr, body := answer(r.URL.Path)
		for k, v := range hdr {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return s3Client(t, srv.URL, layout)
}

func s3Error(code string) string {
	return `<?xml version="1.0" encoding="UTF-8"?><Error><Code>` + code + `</Code><Message>m</Message><RequestId>r</RequestId></Error>`
}

func TestS3Throttling(t *testing.T) {
	t.Parallel()
	recs := []ingest.Record{{ID: "a", Value: []byte(`{"mag":1}`)}, {ID: "b", Value: []byte(`{"mag":2}`)}}
	slowDown := func(string) (int, http.Header, string) {
		return 503, http.Header{"Retry-After": {"3"}}, s3Error("SlowDown")
	}
	for _, layout := range []S3Layout{S3PerRecord, S3PerBatch} {
		_, err := s3Fake(t, layout, slowDown).Write(t.Context(), recs)
		se := (*ingest.SinkError)(nil)
		require.ErrorAs(t, err, &se, layout)
		require.True(t, se.Throttled, layout)
		require.Equal(t, 3*time.Second, se.RetryAfter, layout)

		_, err = s3Fake(t, layout, func(string) (int, http.Header, string) { return 429, nil, s3Error("TooManyRequests") }).Write(t.Context(), recs)
		require.ErrorAs(t, err, &se, layout)
		require.True(t, se.Throttled, layout)
	}

	// One object throttled, the other stored: per-record results.
	res, err := s3Fake(t, S3PerRecord, func(key string) (int, http.Header, string) {
		if strings.HasSuffix(key, "/b.json") {
			return 503, nil, s3Error("SlowDown")
		}
		return 200, nil, ""
	}).Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Retryable}, outcomesOf(res))
	require.True(t, res[1].Throttled)

	// A 500 next to a stored object: retried, not throttled.
	res, err = s3Fake(t, S3PerRecord, func(key string) (int, http.Header, string) {
		if strings.HasSuffix(key, "/b.json") {
			return 500, nil, s3Error("InternalError")
		}
		return 200, nil, ""
	}).Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Retryable}, outcomesOf(res))
	require.False(t, res[1].Throttled)

	// The request deadline with one answer in: it stands, and the record
	// without one is retried as throttled (the server is too slow).
	release := make(chan struct{})
	var calls atomic.Int32
	slow := s3Fake(t, S3PerRecord, func(key string) (int, http.Header, string) {
		if !strings.HasSuffix(key, "/b.json") {
			return 200, nil, ""
		}
		if calls.Add(1) == 1 {
			<-release // stored, but the answer comes too late
			return 200, nil, ""
		}
		return 412, nil, s3Error("PreconditionFailed")
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	res, err = slow.Write(ctx, recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Retryable}, outcomesOf(res))
	require.True(t, res[1].Throttled)
	require.Contains(t, res[1].Reason, "no answer within the request deadline")
	close(release)
	// Its retry finds it stored: its own unanswered PUT stored it, so it
	// is delivered, not a duplicate; a later redelivery is a duplicate.
	res, err = slow.Write(t.Context(), recs[1:])
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered}, outcomesOf(res))
	res, err = slow.Write(t.Context(), recs[1:])
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Duplicate}, outcomesOf(res))

	// No answer at all: the write failed as a whole.
	hang := make(chan struct{})
	defer close(hang)
	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	res, err = s3Fake(t, S3PerRecord, func(string) (int, http.Header, string) { <-hang; return 200, nil, "" }).Write(ctx, recs)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Nil(t, res)

	// Refused credentials for every PUT: the whole write failed.
	res, err = s3Fake(t, S3PerRecord, func(string) (int, http.Header, string) { return 403, nil, s3Error("InvalidAccessKeyId") }).Write(t.Context(), recs)
	require.ErrorContains(t, err, "InvalidAccessKeyId")
	require.Nil(t, res)
}

func TestNewS3RejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []S3Config{
		{Bucket: "ab"},
		{Bucket: "Quakes"},
		{Bucket: "quakes", Layout: "tree"},
		{Bucket: "quakes", Spread: 33},
		{Bucket: "quakes", Gzip: true},
		{Bucket: "quakes", Timeout: -1},
	} {
		_, err := NewS3(t.Context(), cfg)
		require.ErrorIs(t, err, ErrS3Config, "%+v", cfg)
	}
	_, err := NewS3(t.Context(), S3Config{Bucket: "missing-bucket", Endpoint: s3Endpoint(t)})
	require.ErrorContains(t, err, "missing-bucket", "a missing bucket without create_bucket")
}

func TestOpenS3FromURL(t *testing.T) {
	t.Parallel()
	endpoint := s3Endpoint(t)
	bucket := freshBucket()
	s, err := Open(t.Context(), "s3://"+bucket+"/loads/2025?create_bucket=true&layout=batch&gzip=true&spread=4&endpoint="+endpoint, OpenConfig{})
	require.NoError(t, err)
	defer s.Close()
	ss := s.(*S3Sink)
	require.Equal(t, "loads/2025/", ss.prefix)
	require.Equal(t, S3PerBatch, ss.layout)
	require.True(t, ss.gzip)
	require.Equal(t, 4, ss.spread)
	require.NoError(t, ss.Warm(t.Context(), 4))
	res, err := s.Write(t.Context(), []ingest.Record{{ID: "x", Value: []byte(`{}`)}})
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)

	for _, bad := range []string{
		"s3://ab/p",
		"s3://Quakes/p",
		"s3://quakes/p?layout=tree",
		"s3://quakes/p?gzip=true",
		"s3://quakes/p?layout=batch&spread=0",
		"s3://quakes/p?endpoint=localhost:9000",
		"s3://quakes/p?create_buckets=true",
		"s3://key:secret@quakes/p",
	} {
		require.ErrorIs(t, CheckURL(bad), ErrSinkURL, bad)
	}
	require.NoError(t, CheckURL("s3://quakes?region=eu-west-1"))
}

// BenchmarkS3Write measures unthrottled writes into MinIO, by layout and
// batch size: go test -run '^$' -bench S3Write ./sink/
func BenchmarkS3Write(b *testing.B) {
	for _, layout := range []S3Layout{S3PerRecord, S3PerBatch} {
		for _, size := range []int{25, 100, 500} {
			b.Run(fmt.Sprintf("layout=%s/batch=%d", layout, size), func(b *testing.B) {
				s := openS3(b, func(c *S3Config) { c.Layout = layout })
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
