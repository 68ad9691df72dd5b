package sink

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
	htransport "google.golang.org/api/transport/http"

	"github.com/sluicehq/sluice/ingest"
)

// GCSLayout is how a GCSSink names and fills its objects.
type GCSLayout string

const (
	// GCSPerRecord writes one object per record, named by its sink key.
	GCSPerRecord GCSLayout = "record"
	// GCSPerBatch writes one NDJSON object per Write, named by a spread
	// prefix and the batch's first key.
	GCSPerBatch GCSLayout = "batch"
)

// Defaults and limits of GCSConfig.
const (
	// DefaultGCSSpread is the number of hex digits of the spread prefix
	// of per-batch object names: 2 digits, 256 prefixes.
	DefaultGCSSpread = 2
	// gcsMaxName is the longest object name Cloud Storage takes, in bytes
	// of UTF-8 ("Object naming requirements", Cloud Storage
	// documentation).
	gcsMaxName = 1024
	// gcsParallel is how many uploads one Write has in flight at most.
	gcsParallel = 32
)

// ErrGCSConfig is wrapped by NewGCS errors about its configuration.
var ErrGCSConfig = errors.New("sink: gcs config")

// GCSConfig configures a GCSSink. Credentials come from Application
// Default Credentials: GOOGLE_APPLICATION_CREDENTIALS (a service account
// key or a workload identity federation file), the gcloud CLI's
// application-default login, or the metadata server of GCE, GKE (workload
// identity) and Cloud Run. With an Endpoint (an emulator) no credentials
// are sent.
type GCSConfig struct {
	// Bucket is the bucket's name; required.
	Bucket string
	// Prefix starts every object name, e.g. "quakes/" (a "/" is added
	// when missing). Default: none.
	Prefix string
	// Endpoint is an emulator's base URL, e.g. "http://127.0.0.1:4443"
	// (fake-gcs-server); the JSON API's path /storage/v1/ is appended.
	// Default: Cloud Storage itself (or STORAGE_EMULATOR_HOST when set).
	Endpoint string
	// Layout is how objects are named and filled. Default GCSPerRecord.
	Layout GCSLayout
	// Gzip compresses per-batch objects (Content-Encoding: gzip, name
	// ending in .ndjson.gz).
	Gzip bool
	// Spread is the number of hex digits (1-32) of the MD5 prefix of
	// per-batch object names. Default DefaultGCSSpread.
	Spread int
	// CreateBucket creates the bucket in Project when it is missing.
	// Default false: a missing bucket is an error.
	CreateBucket bool
	// Project is the Google Cloud project a missing bucket is created in;
	// required with CreateBucket outside an emulator.
	Project string
	// Timeout bounds each upload. Default ingest.DefaultRequestTimeout.
	Timeout time.Duration
	// Logger receives the sink's events. Default slog.Default().
	Logger *slog.Logger
}

// GCSSink writes records as objects of a Cloud Storage bucket through the
// official client (cloud.google.com/go/storage, JSON API), following
// Cloud Storage's request-rate guidance ("Request rate and access
// distribution guidelines"): object names spread over the key range, so
// that writes do not all land on the range of the newest name, and a new
// key range ramped up from about 1,000 writes/s, doubling at most every
// 20 minutes (--ramp gcs).
//
// GCSPerRecord (the default): each record is one object, named Prefix +
// the record's SinkKey (its ID when empty) + ".json" with EscapeObjectKey's
// escapes, holding the record's JSON; a sink key strategy (hash-prefix:N)
// spreads the names. Each record is one upload, up to 32 at once; a pool
// in records/s is then a pool of writes/s.
//
// GCSPerBatch: each Write is one object of newline-delimited JSON (one
// record a line, in batch order; gzip-compressed with Gzip), named Prefix
// + the first Spread hex digits of the MD5 of the batch's first key + "/"
// + that key + "-" + 16 hex digits of the SHA-256 of the batch's record
// IDs + ".ndjson" (".ndjson.gz"), as S3Sink names them. A batch written
// again as it was is a Duplicate; a record whose batch was formed
// differently is stored again in another object, so readers dedupe by
// record ID.
//
// Every upload is a single request (no resumable session) with the
// precondition ifGenerationMatch=0, so an object that exists is never
// replaced: Cloud Storage answers 412 Precondition Failed and the records
// are Duplicate. Each carries its CRC32C, which the server checks. The
// client's own retries are off and its transport never sends a request
// again by itself: every attempt goes through the worker, which paces and
// charges it.
//
// Results and errors:
//   - 429 and 503 are throttling: Retryable and Throttled per object, and
//     an *ingest.SinkError with Throttled set when every record of the
//     Write was throttled (Retry-After honoured);
//   - 408, other 5xx (but 501 and 505) and 409 are Retryable;
//   - a name Cloud Storage cannot take (over 1,024 bytes) and a value
//     that is not a JSON object are Permanent for their record, without a
//     request;
//   - refused credentials (401, 403), a missing bucket (404), a refused
//     request (400), an endpoint that does not answer: the error of Write
//     when no record of it was stored, else Retryable for the records of
//     the failed uploads. In the per-batch layout every failure of the
//     upload is the Write's error, so that the batch is retried whole,
//     under the same name;
//   - when the request deadline ends a Write with some answers in, they
//     stand and the records without one are Retryable and Throttled; an
//     upload that went unanswered and whose retry finds its object stored
//     (412) is Delivered, not Duplicate (see unanswered).
//
// Safe for concurrent use.
type GCSSink struct {
	client    *storage.Client
	bucket    *storage.BucketHandle
	transport *http.Transport
	name      string // the bucket's
	prefix    string
	layout    GCSLayout
	gzip      bool
	spread    int
	timeout   time.Duration
	log       *slog.Logger
	pending   unanswered // names of uploads without an answer
}

var (
	_ ingest.Sink   = (*GCSSink)(nil)
	_ ingest.Warmer = (*GCSSink)(nil)
)

// NewGCS validates cfg, finds the credentials (unless Endpoint is set),
// and checks that the bucket answers (with CreateBucket, creates a missing
// bucket). It returns an error wrapping ErrGCSConfig for a bad config or
// missing credentials, and the service's error otherwise.
func NewGCS(ctx context.Context, cfg GCSConfig) (*GCSSink, error) {
	cfg.Layout = cmp.Or(cfg.Layout, GCSPerRecord)
	cfg.Spread = cmp.Or(cfg.Spread, DefaultGCSSpread)
	cfg.Timeout = cmp.Or(cfg.Timeout, ingest.DefaultRequestTimeout)
	switch {
	case !validGCSBucket(cfg.Bucket):
		return nil, fmt.Errorf("%w: bucket %q: want 3-63 lower-case letters, digits, '-', '_' or '.', starting and ending with a letter or digit", ErrGCSConfig, cfg.Bucket)
	case cfg.Layout != GCSPerRecord && cfg.Layout != GCSPerBatch:
		return nil, fmt.Errorf("%w: layout %q: want record or batch", ErrGCSConfig, cfg.Layout)
	case cfg.Spread < 1 || cfg.Spread > 32:
		return nil, fmt.Errorf("%w: spread %d: want 1..32 hex digits", ErrGCSConfig, cfg.Spread)
	case cfg.Gzip && cfg.Layout != GCSPerBatch:
		return nil, fmt.Errorf("%w: gzip needs the batch layout", ErrGCSConfig)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: timeout %v is negative", ErrGCSConfig, cfg.Timeout)
	case cfg.CreateBucket && cfg.Project == "" && cfg.Endpoint == "":
		return nil, fmt.Errorf("%w: creating a bucket needs the project to create it in", ErrGCSConfig)
	case strings.Contains(cfg.Prefix, "\r") || strings.Contains(cfg.Prefix, "\n") || !utf8.ValidString(cfg.Prefix):
		return nil, fmt.Errorf("%w: prefix %q: Cloud Storage names are UTF-8 without carriage returns or line feeds", ErrGCSConfig, cfg.Prefix)
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	transport, client, err := gcsClient(ctx, cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	s := &GCSSink{
		client:    client,
		bucket:    client.Bucket(cfg.Bucket),
		transport: transport,
		name:      cfg.Bucket,
		prefix:    cfg.Prefix,
		layout:    cfg.Layout,
		gzip:      cfg.Gzip,
		spread:    cfg.Spread,
		timeout:   cfg.Timeout,
		log:       cmp.Or(cfg.Logger, slog.Default()),
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := s.ensureBucket(sctx, cfg.CreateBucket, cmp.Or(cfg.Project, "sluice")); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// gcsClient makes the storage client: its own pooled transport (up to 256
// idle connections), wrapped so that no request is sent again by the
// transport, under Application Default Credentials' OAuth 2 tokens (none
// for an emulator: an endpoint, or STORAGE_EMULATOR_HOST as the client
// reads it); the client's retries off, its metrics export off.
func gcsClient(ctx context.Context, endpoint string) (*http.Transport, *storage.Client, error) {
	transport, err := newTransport("", false)
	if err != nil {
		return nil, nil, err
	}
	transport.MaxIdleConns, transport.MaxIdleConnsPerHost = 256, 256
	auth := []option.ClientOption{option.WithScopes(storage.ScopeReadWrite)}
	emulator := endpoint != "" || os.Getenv("STORAGE_EMULATOR_HOST") != ""
	if emulator {
		auth = []option.ClientOption{option.WithoutAuthentication()}
	}
	rt, err := htransport.NewTransport(ctx, noReplay{transport}, auth...)
	if err != nil {
		transport.CloseIdleConnections()
		return nil, nil, fmt.Errorf("%w: credentials (Application Default Credentials): %w", ErrGCSConfig, err)
	}
	opts := []option.ClientOption{option.WithHTTPClient(&http.Client{Transport: rt}), storage.WithDisabledClientMetrics()}
	if endpoint != "" {
		// Without credentials, so that the client does not look for
		// Application Default Credentials (which would ask the metadata
		// server when there are none).
		opts = append(opts, option.WithEndpoint(strings.TrimRight(endpoint, "/")+"/storage/v1/"), option.WithoutAuthentication())
	}
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		transport.CloseIdleConnections()
		return nil, nil, fmt.Errorf("%w: %w", ErrGCSConfig, err)
	}
	client.SetRetry(storage.WithPolicy(storage.RetryNever))
	return transport, client, nil
}

// noReplay is a RoundTripper that takes GetBody off every request with a
// body before base sends it. net/http's transport sends a request again
// on a new connection by itself when a kept-alive connection fails and it
// can rewind the body (GetBody) and thinks the request idempotent; a
// request the server may have stored must instead go back to the worker,
// which paces and charges every attempt.
type noReplay struct{ base http.RoundTripper }

func (n noReplay) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.GetBody != nil {
		r := *req // a RoundTripper must not change the caller's request
		r.GetBody = nil
		req = &r
	}
	return n.base.RoundTrip(req)
}

func (s *GCSSink) ensureBucket(ctx context.Context, create bool, project string) error {
	_, err := s.bucket.Attrs(ctx)
	if err == nil {
		return nil
	}
	if !create || !errors.Is(err, storage.ErrBucketNotExist) {
		return fmt.Errorf("sink: gcs: bucket %s: %w", s.name, err)
	}
	if err := s.bucket.Create(ctx, project, nil); err != nil {
		if gcsStatus(err) != http.StatusConflict {
			return fmt.Errorf("sink: gcs: create bucket %s: %w", s.name, err)
		}
	}
	s.log.Info("gcs bucket created", "bucket", s.name, "project", project)
	return nil
}

// Warm implements ingest.Warmer: it asks for the bucket's metadata once
// per connection wanted (up to conns at once), which opens the connections
// and checks the credentials and the bucket.
func (s *GCSSink) Warm(ctx context.Context, conns int) error {
	return warmWith(ctx, conns, "gcs bucket "+s.name, func(ctx context.Context) error {
		_, err := s.bucket.Attrs(ctx)
		return err
	})
}

// Close closes the client and its idle connections.
func (s *GCSSink) Close() error {
	err := s.client.Close()
	s.transport.CloseIdleConnections()
	return err
}

// ObjectName is the object a record is stored in with the per-record
// layout; see GCSSink.
func (s *GCSSink) ObjectName(r ingest.Record) string {
	return s.prefix + EscapeObjectKey(cmp.Or(r.SinkKey, r.ID)) + ".json"
}

// Write makes one attempt to write batch; see GCSSink.
func (s *GCSSink) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	out := make([]ingest.Result, len(batch))
	var sent []int
	seen := make(map[string]bool, len(batch))
	for i, r := range batch {
		if !ingest.IsJSONObject(r.Value) {
			out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: "gcs: value is not a JSON object"}
			continue
		}
		if s.layout == GCSPerRecord {
			name := s.ObjectName(r)
			if len(name) > gcsMaxName {
				out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: fmt.Sprintf("gcs: object name of %d bytes: Cloud Storage takes at most %d", len(name), gcsMaxName)}
				continue
			}
			if seen[name] {
				out[i] = ingest.Result{Outcome: ingest.Duplicate}
				continue
			}
			seen[name] = true
		}
		sent = append(sent, i)
	}
	if len(sent) == 0 {
		return out, nil
	}
	if s.layout == GCSPerBatch {
		return s.writeBatch(ctx, batch, sent, out)
	}
	var (
		mu    sync.Mutex
		fails []failure
	)
	unstarted := fanOut(ctx, len(sent), gcsParallel, func(k int) {
		i := sent[k]
		res, err := s.put(ctx, s.ObjectName(batch[i]), batch[i].Value, "application/json", "")
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			fails = append(fails, failure{recs: []int{i}, err: err})
			return
		}
		out[i] = res
	})
	for _, k := range unstarted {
		fails = append(fails, failure{recs: []int{sent[k]}, err: context.Cause(ctx)})
	}
	return settle(ctx, "gcs", sent, out, fails)
}

// writeBatch writes batch[sent] as one NDJSON object.
func (s *GCSSink) writeBatch(ctx context.Context, batch []ingest.Record, sent []int, out []ingest.Result) ([]ingest.Result, error) {
	name, body, err := s.batchObject(batch, sent)
	if err != nil {
		return nil, err
	}
	encoding := ""
	if s.gzip {
		encoding = "gzip"
	}
	res, err := s.put(ctx, name, body, "application/x-ndjson", encoding)
	if err == nil && res.Outcome == ingest.Retryable {
		return nil, &ingest.SinkError{Throttled: res.Throttled, RetryAfter: res.RetryAfter, Err: errors.New(res.Reason)}
	}
	if err != nil {
		if ctxErr := context.Cause(ctx); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, fmt.Errorf("sink: gcs: %s: %w", name, err)
	}
	for _, i := range sent {
		out[i] = res
	}
	return out, nil
}

// batchObject names and fills the per-batch object of batch[sent]; see
// GCSSink.
func (s *GCSSink) batchObject(batch []ingest.Record, sent []int) (string, []byte, error) {
	var body bytes.Buffer
	ids := sha256.New()
	var w interface{ Write([]byte) (int, error) } = &body
	var zw *gzip.Writer
	if s.gzip {
		zw = gzip.NewWriter(&body)
		w = zw
	}
	for _, i := range sent {
		_, _ = w.Write(bytes.TrimSpace(batch[i].Value))
		_, _ = w.Write([]byte{'\n'})
		_, _ = ids.Write([]byte(batch[i].ID))
		_, _ = ids.Write([]byte{0})
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return "", nil, fmt.Errorf("sink: gcs: gzip: %w", err)
		}
	}
	first := cmp.Or(batch[sent[0]].SinkKey, batch[sent[0]].ID)
	sum := md5.Sum([]byte(first))
	key := EscapeObjectKey(first)
	if room := gcsMaxName - len(s.prefix) - s.spread - 64; len(key) > room {
		// The name stays unique through the IDs' hash: cut the key at a
		// character boundary to fit Cloud Storage's 1,024 bytes.
		key = strings.ToValidUTF8(key[:max(room, 0)], "")
	}
	name := s.prefix + hex.EncodeToString(sum[:])[:s.spread] + "/" + key + "-" + hex.EncodeToString(ids.Sum(nil))[:16] + ".ndjson"
	if s.gzip {
		name += ".gz"
	}
	return name, body.Bytes(), nil
}

// castagnoli is the CRC32C table, the checksum Cloud Storage verifies.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// put uploads one object unless it exists; err is a failure of the
// request as a whole (not about the object). An object found stored is a
// Duplicate, or Delivered when an upload of it here went unanswered
// before (see unanswered).
func (s *GCSSink) put(ctx context.Context, name string, body []byte, contentType, encoding string) (ingest.Result, error) {
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	w := s.bucket.Object(name).If(storage.Conditions{DoesNotExist: true}).NewWriter(rctx)
	w.ChunkSize = 0 // one request, no resumable session
	w.ContentType = contentType
	w.ContentEncoding = encoding
	w.CRC32C = crc32.Checksum(body, castagnoli)
	w.SendCRC32C = true
	_, err := w.Write(body)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		s.pending.take(name)
		return ingest.Result{Outcome: ingest.Delivered}, nil
	}
	if res, perObject := classifyGCS(err); perObject {
		if res.Outcome == ingest.Duplicate && s.pending.take(name) {
			res.Outcome = ingest.Delivered
		}
		return res, nil
	}
	if gcsStatus(err) == 0 {
		s.pending.add(name)
	}
	return ingest.Result{}, err
}

// classifyGCS maps an upload's error to a result for the object;
// perObject is false for failures of the whole request or the sink
// (refused credentials, a missing bucket, a transport error), which fail
// the attempt. Statuses: "HTTP status and error codes for JSON" and
// "Retry strategy" in the Cloud Storage documentation.
func classifyGCS(err error) (res ingest.Result, perObject bool) {
	status := gcsStatus(err)
	if status == 0 {
		return ingest.Result{}, false
	}
	reason := "gcs: HTTP " + fmt.Sprint(status)
	if ge, ok := errors.AsType[*googleapi.Error](err); ok && ge.Message != "" {
		reason += ": " + ge.Message
	}
	switch {
	case status == http.StatusPreconditionFailed:
		return ingest.Result{Outcome: ingest.Duplicate}, true
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable:
		return ingest.Result{Outcome: ingest.Retryable, Throttled: true, RetryAfter: gcsRetryAfter(err), Reason: reason}, true
	case status == http.StatusConflict, RetryableStatus(status):
		return ingest.Result{Outcome: ingest.Retryable, RetryAfter: gcsRetryAfter(err), Reason: reason}, true
	}
	return ingest.Result{}, false
}

// gcsStatus is the HTTP status of a service answer, 0 for errors without
// one (transport, ctx).
func gcsStatus(err error) int {
	if ge, ok := errors.AsType[*googleapi.Error](err); ok {
		return ge.Code
	}
	return 0
}

// gcsRetryAfter reads a Retry-After header of the answer, 0 when none.
func gcsRetryAfter(err error) time.Duration {
	ge, ok := errors.AsType[*googleapi.Error](err)
	if !ok {
		return 0
	}
	wait, _ := ParseRetryAfter(ge.Header.Get("Retry-After"), time.Now())
	return wait
}

// validGCSBucket applies Cloud Storage's bucket naming rules ("Bucket
// naming", Cloud Storage documentation) for names without dots' longer
// form: 3-63 characters of lower-case letters, digits, '-', '_' and '.',
// starting and ending with a letter or a digit.
func validGCSBucket(s string) bool {
	if len(s) < 3 || len(s) > 63 {
		return false
	}
	alnum := func(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') }
	if !alnum(s[0]) || !alnum(s[len(s)-1]) {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}
