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
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/sluicehq/sluice/ingest"
)

// S3Layout is how an S3Sink names and fills its objects.
type S3Layout string

const (
	// S3PerRecord writes one object per record, named by its sink key.
	S3PerRecord S3Layout = "record"
	// S3PerBatch writes one NDJSON object per Write, named by a spread
	// prefix and the batch's first key.
	S3PerBatch S3Layout = "batch"
)

// Defaults and limits of S3Config.
const (
	// DefaultS3Spread is the number of hex digits of the spread prefix of
	// per-batch object names: 2 digits, 256 prefixes.
	DefaultS3Spread = 2
	// s3MaxKey is the longest object name S3 takes, in bytes ("Naming
	// Amazon S3 objects", Amazon S3 user guide).
	s3MaxKey = 1024
	// s3Parallel is how many PUTs one Write has in flight at most.
	s3Parallel = 32
)

// ErrS3Config is wrapped by NewS3 errors about its configuration.
var ErrS3Config = errors.New("sink: s3 config")

// S3Config configures an S3Sink. Credentials come from the AWS SDK's
// default chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and
// AWS_SESSION_TOKEN), AWS_PROFILE and the shared config files, web
// identity, the container or instance role.
type S3Config struct {
	// Bucket is the bucket's name; required.
	Bucket string
	// Prefix starts every object name, e.g. "quakes/" (a "/" is added
	// when missing). Default: none.
	Prefix string
	// Region is the bucket's region. Defaults to the SDK's (AWS_REGION,
	// the profile), else "us-east-1", which S3-compatible servers accept.
	Region string
	// Endpoint is the S3-compatible server's URL, e.g.
	// "http://127.0.0.1:9000". Default: Amazon S3 in Region.
	Endpoint string
	// VirtualHost addresses the bucket as a host name
	// (bucket.endpoint) instead of a path (endpoint/bucket). Default
	// false with an Endpoint (S3-compatible servers serve paths), and
	// always true without one.
	VirtualHost bool
	// Layout is how objects are named and filled. Default S3PerRecord.
	Layout S3Layout
	// Gzip compresses per-batch objects (Content-Encoding: gzip, name
	// ending in .ndjson.gz).
	Gzip bool
	// Spread is the number of hex digits (1-32) of the MD5 prefix of
	// per-batch object names. Default DefaultS3Spread.
	Spread int
	// CreateBucket creates the bucket when it is missing. Default false:
	// a missing bucket is an error.
	CreateBucket bool
	// Timeout bounds each PUT. Default ingest.DefaultRequestTimeout.
	Timeout time.Duration
	// Logger receives the sink's events. Default slog.Default().
	Logger *slog.Logger
}

// S3Sink writes records as objects of an S3 bucket (Amazon S3 or an
// S3-compatible store: MinIO, Cloud Storage's XML API, OSS, ...),
// following the request-rate guidance of Cloud Storage and OSS: object
// names spread over the key range so that writes do not all land on the
// range partition of the newest name.
//
// S3PerRecord (the default): each record is one object, named Prefix +
// the record's SinkKey (its ID when empty) + ".json", holding the record's
// JSON; a sink key strategy (hash-prefix:N, reverse) spreads the names.
// Characters S3 advises against in names (control characters, '\', '%',
// and path segments "", "." and "..") are percent-encoded. Each record is
// one PUT, up to 32 at once; a pool in records/s is then a pool of PUT
// requests/s.
//
// S3PerBatch: each Write is one object of newline-delimited JSON (one
// record a line, in batch order; gzip-compressed with Gzip), named Prefix +
// the first Spread hex digits of the MD5 of the batch's first key + "/" +
// that key + "-" + 16 hex digits of the SHA-256 of the batch's record IDs
// + ".ndjson" (".ndjson.gz"). The name identifies the batch's content, so
// a batch written again as it was is a Duplicate; a record whose batch
// was formed differently (after a crash, or a retry alone) is stored
// again in another object, so readers dedupe by record ID.
//
// Every PUT carries If-None-Match: *, so an object that exists is never
// replaced: the server answers 412 Precondition Failed and the records
// are Duplicate (delivered means stored for the first time). A server that
// ignores the header overwrites instead, and a rewrite counts as
// delivered.
//
// Results and errors:
//   - 503 SlowDown and 429 are throttling: Retryable and Throttled per
//     object, and an *ingest.SinkError with Throttled set when every
//     record of the Write was throttled (Retry-After honoured);
//   - other 5xx and 409 (a conditional write racing another) are
//     Retryable;
//   - EntityTooLarge, KeyTooLongError and invalid object names are
//     Permanent for their record (per-record layout); a value that is not
//     a JSON object is Permanent without a request;
//   - refused credentials, a missing bucket, a wrong region, an endpoint
//     that does not answer, any other answer: the error of Write when no
//     record of it was stored, else Retryable for the records of the
//     failed PUTs. In the per-batch layout every failure of the PUT is the
//     Write's error, so that the batch is retried whole, under the same
//     name.
//   - when the request deadline ends a Write with some answers in, they
//     stand and the records without one are Retryable and Throttled (the
//     store is slower than the pool's rate); a PUT that went unanswered
//     and whose retry finds its object stored (412) is Delivered, not
//     Duplicate (see unanswered).
//
// Safe for concurrent use.
type S3Sink struct {
	client    *s3.Client
	transport *http.Transport
	bucket    string
	prefix    string
	layout    S3Layout
	gzip      bool
	spread    int
	timeout   time.Duration
	log       *slog.Logger
	pending   unanswered // names of PUTs without an answer
}

var (
	_ ingest.Sink   = (*S3Sink)(nil)
	_ ingest.Warmer = (*S3Sink)(nil)
)

// NewS3 validates cfg, checks that the bucket answers (HeadBucket; with
// CreateBucket, creates a missing bucket). It returns an error wrapping
// ErrS3Config for a bad config and the service's error otherwise.
func NewS3(ctx context.Context, cfg S3Config) (*S3Sink, error) {
	cfg.Layout = cmp.Or(cfg.Layout, S3PerRecord)
	cfg.Spread = cmp.Or(cfg.Spread, DefaultS3Spread)
	cfg.Timeout = cmp.Or(cfg.Timeout, ingest.DefaultRequestTimeout)
	switch {
	case !validBucket(cfg.Bucket):
		return nil, fmt.Errorf("%w: bucket %q: want 3-63 lower-case letters, digits, '.' or '-'", ErrS3Config, cfg.Bucket)
	case cfg.Layout != S3PerRecord && cfg.Layout != S3PerBatch:
		return nil, fmt.Errorf("%w: layout %q: want record or batch", ErrS3Config, cfg.Layout)
	case cfg.Spread < 1 || cfg.Spread > 32:
		return nil, fmt.Errorf("%w: spread %d: want 1..32 hex digits", ErrS3Config, cfg.Spread)
	case cfg.Gzip && cfg.Layout != S3PerBatch:
		return nil, fmt.Errorf("%w: gzip needs the batch layout", ErrS3Config)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: timeout %v is negative", ErrS3Config, cfg.Timeout)
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	awsCfg, transport, err := awsConfig(ctx, cfg.Region)
	if err != nil {
		return nil, fmt.Errorf("%w: AWS configuration: %w", ErrS3Config, err)
	}
	awsCfg.Region = cmp.Or(cfg.Region, awsCfg.Region, "us-east-1")
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
			o.UsePathStyle = !cfg.VirtualHost
		}
	})
	s := &S3Sink{
		client:    client,
		transport: transport,
		bucket:    cfg.Bucket,
		prefix:    cfg.Prefix,
		layout:    cfg.Layout,
		gzip:      cfg.Gzip,
		spread:    cfg.Spread,
		timeout:   cfg.Timeout,
		log:       cmp.Or(cfg.Logger, slog.Default()),
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := s.ensureBucket(sctx, cfg.CreateBucket); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *S3Sink) ensureBucket(ctx context.Context, create bool) error {
	_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.bucket)})
	if err == nil {
		return nil
	}
	if !create || s3Status(err) != http.StatusNotFound {
		return fmt.Errorf("sink: s3: bucket %s: %w", s.bucket, err)
	}
	in := &s3.CreateBucketInput{Bucket: aws.String(s.bucket)}
	if region := s.client.Options().Region; region != "us-east-1" {
		// Amazon S3 creates a bucket outside us-east-1 only when told where.
		in.CreateBucketConfiguration = &types.CreateBucketConfiguration{LocationConstraint: types.BucketLocationConstraint(region)}
	}
	if _, err := s.client.CreateBucket(ctx, in); err != nil {
		if code := s3Code(err); code != "BucketAlreadyOwnedByYou" {
			return fmt.Errorf("sink: s3: create bucket %s: %w", s.bucket, err)
		}
	}
	s.log.Info("s3 bucket created", "bucket", s.bucket)
	return nil
}

// Warm implements ingest.Warmer: it asks for the bucket (HeadBucket) once
// per connection wanted (up to conns at once), which opens the connections
// and checks the credentials and the bucket.
func (s *S3Sink) Warm(ctx context.Context, conns int) error {
	return warmWith(ctx, conns, "s3 bucket "+s.bucket, func(ctx context.Context) error {
		_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.bucket)})
		return err
	})
}

// Close closes the idle connections.
func (s *S3Sink) Close() error {
	if s.transport != nil {
		s.transport.CloseIdleConnections()
	}
	return nil
}

// ObjectName is the object a record is stored in with the per-record
// layout; see S3Sink.
func (s *S3Sink) ObjectName(r ingest.Record) string {
	return s.prefix + EscapeObjectKey(cmp.Or(r.SinkKey, r.ID)) + ".json"
}

// Write makes one attempt to write batch; see S3Sink.
func (s *S3Sink) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	out := make([]ingest.Result, len(batch))
	var sent []int
	seen := make(map[string]bool, len(batch))
	for i, r := range batch {
		if !ingest.IsJSONObject(r.Value) {
			out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: "s3: value is not a JSON object"}
			continue
		}
		if s.layout == S3PerRecord {
			name := s.ObjectName(r)
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
	if s.layout == S3PerBatch {
		return s.writeBatch(ctx, batch, sent, out)
	}
	var (
		mu    sync.Mutex
		fails []failure
	)
	unstarted := fanOut(ctx, len(sent), s3Parallel, func(k int) {
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
	return settle(ctx, "s3", sent, out, fails)
}

// writeBatch writes batch[sent] as one NDJSON object.
func (s *S3Sink) writeBatch(ctx context.Context, batch []ingest.Record, sent []int, out []ingest.Result) ([]ingest.Result, error) {
	var body bytes.Buffer
	ids := sha256.New()
	var w interface {
		Write([]byte) (int, error)
	} = &body
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
	encoding := ""
	if zw != nil {
		if err := zw.Close(); err != nil {
			return nil, fmt.Errorf("sink: s3: gzip: %w", err)
		}
		encoding = "gzip"
	}
	first := cmp.Or(batch[sent[0]].SinkKey, batch[sent[0]].ID)
	sum := md5.Sum([]byte(first))
	key := EscapeObjectKey(first)
	if room := s3MaxKey - len(s.prefix) - s.spread - 64; len(key) > room {
		// The name stays unique through the IDs' hash: cut the key at a
		// character boundary to fit S3's 1,024 bytes.
		key = strings.ToValidUTF8(key[:max(room, 0)], "")
	}
	name := s.prefix + hex.EncodeToString(sum[:])[:s.spread] + "/" + key + "-" + hex.EncodeToString(ids.Sum(nil))[:16] + ".ndjson"
	if s.gzip {
		name += ".gz"
	}
	res, err := s.put(ctx, name, body.Bytes(), "application/x-ndjson", encoding)
	if err == nil && res.Outcome == ingest.Permanent {
		// A refused object is the batch's, not one record's: never a
		// reason to dead-letter its records.
		err = errors.New(res.Reason)
	}
	if err == nil && res.Outcome == ingest.Retryable {
		return nil, &ingest.SinkError{Throttled: res.Throttled, RetryAfter: res.RetryAfter, Err: errors.New(res.Reason)}
	}
	if err != nil {
		if ctxErr := context.Cause(ctx); ctxErr != nil {
			return nil, ctxErr
		}
		return nil, fmt.Errorf("sink: s3: %s: %w", name, err)
	}
	for _, i := range sent {
		out[i] = res
	}
	return out, nil
}

// put writes one object unless it exists; err is a failure of the request
// as a whole (not about the object). An object found stored is a
// Duplicate, or Delivered when a PUT of it here went unanswered before (see
// unanswered).
func (s *S3Sink) put(ctx context.Context, name string, body []byte, contentType, encoding string) (ingest.Result, error) {
	in := &s3.PutObjectInput{
		Bucket:      aws.String(s.bucket),
		Key:         aws.String(name),
		Body:        bytes.NewReader(body),
		ContentType: aws.String(contentType),
		IfNoneMatch: aws.String("*"),
	}
	if encoding != "" {
		in.ContentEncoding = aws.String(encoding)
	}
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.client.PutObject(rctx, in)
	if err == nil {
		s.pending.take(name)
		return ingest.Result{Outcome: ingest.Delivered}, nil
	}
	if res, perObject := classifyS3(err); perObject {
		if res.Outcome == ingest.Duplicate && s.pending.take(name) {
			res.Outcome = ingest.Delivered
		}
		return res, nil
	}
	if !hasAnswer(err) {
		s.pending.add(name)
	}
	return ingest.Result{}, err
}

// classifyS3 maps an S3 error to a result for the object; perObject is
// false for failures of the whole request or the sink (refused
// credentials, a missing bucket, a transport error), which fail the
// attempt. Codes: "Error responses" in the Amazon S3 API reference, and
// "Conditional requests" in the Amazon S3 user guide.
func classifyS3(err error) (res ingest.Result, perObject bool) {
	status, code := s3Status(err), s3Code(err)
	if status == 0 {
		return ingest.Result{}, false
	}
	reason := fmt.Sprintf("s3: HTTP %d %s", status, code)
	switch {
	case status == http.StatusPreconditionFailed:
		return ingest.Result{Outcome: ingest.Duplicate}, true
	case status == http.StatusTooManyRequests, code == "SlowDown", code == "RequestLimitExceeded":
		return ingest.Result{Outcome: ingest.Retryable, Throttled: true, RetryAfter: s3RetryAfter(err), Reason: reason}, true
	case status == http.StatusConflict, RetryableStatus(status) && status >= 500:
		return ingest.Result{Outcome: ingest.Retryable, RetryAfter: s3RetryAfter(err), Reason: reason}, true
	case code == "EntityTooLarge", code == "KeyTooLongError", code == "XMinioInvalidObjectName", code == "InvalidObjectName":
		return ingest.Result{Outcome: ingest.Permanent, Reason: reason}, true
	}
	return ingest.Result{}, false
}

// s3Status is the HTTP status of a service answer, 0 for errors without
// one (transport, ctx).
func s3Status(err error) int {
	if re, ok := errors.AsType[*awshttp.ResponseError](err); ok {
		return re.HTTPStatusCode()
	}
	return 0
}

func s3Code(err error) string {
	if ae, ok := errors.AsType[smithy.APIError](err); ok {
		return ae.ErrorCode()
	}
	return ""
}

// s3RetryAfter reads a Retry-After header of the answer, 0 when none.
func s3RetryAfter(err error) time.Duration {
	re, ok := errors.AsType[*awshttp.ResponseError](err)
	if !ok || re.Response == nil {
		return 0
	}
	wait, _ := ParseRetryAfter(re.Response.Header.Get("Retry-After"), time.Now())
	return wait
}

// EscapeObjectKey makes a sink key an object name S3 and S3-compatible
// stores take as it is: control characters, '\', '%' and bytes that are
// not UTF-8 are percent-encoded, and so are the path segments that are empty, "." or
// ".." (MinIO refuses them, and they confuse file-system gateways; an
// empty segment becomes "%2F"); '/' stays, so that the key's first
// component is a prefix. Distinct keys get distinct names.
func EscapeObjectKey(k string) string {
	segs := strings.Split(k, "/")
	for n, seg := range segs {
		switch seg {
		case "":
			segs[n] = "%2F"
			continue
		case ".", "..":
			segs[n] = strings.ReplaceAll(seg, ".", "%2E")
			continue
		}
		var b strings.Builder
		for len(seg) > 0 {
			r, size := utf8.DecodeRuneInString(seg)
			c := seg[0]
			if (r == utf8.RuneError && size == 1) || c < 0x20 || c == 0x7f || c == '\\' || c == '%' {
				fmt.Fprintf(&b, "%%%02X", c)
				seg = seg[1:]
				continue
			}
			b.WriteString(seg[:size])
			seg = seg[size:]
		}
		segs[n] = b.String()
	}
	return strings.Join(segs, "/")
}

func validBucket(s string) bool {
	if len(s) < 3 || len(s) > 63 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '.' && c != '-' {
			return false
		}
	}
	return true
}
