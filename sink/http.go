package sink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinkwire"
	"github.com/sluicehq/sluice/tlsfiles"
)

// maxResponseBytes bounds how much of a response HTTPSink reads.
const maxResponseBytes = 32 << 20

// ErrProtocol is wrapped by HTTPSink errors about answers that break the
// wire protocol (wrong number of results, unexpected status, bad JSON).
var ErrProtocol = errors.New("sink: protocol violation")

// HTTPConfig configures an HTTPSink.
type HTTPConfig struct {
	// URL is the sink's base URL, e.g. "http://127.0.0.1:8088"; required,
	// http or https. The wire paths (/v1/records, /v1/stats) are appended.
	URL string
	// Timeout bounds each request, connection and response body included.
	// Default 0: only the caller's deadline (the pipeline puts its request
	// timeout on every write).
	Timeout time.Duration
	// Client sends the requests. Default: a client with its own pooled
	// transport (up to 64 idle connections to the sink, TLS as CAFile and
	// InsecureSkipVerify say) that does not follow redirects.
	Client *http.Client
	// NDJSON sends the batch as newline-delimited JSON records
	// (Content-Type application/x-ndjson) instead of a JSON array.
	NDJSON bool
	// Header is added to every request, e.g. an Authorization read from a
	// file or the environment. Its values are never logged.
	Header http.Header
	// CAFile names a PEM file of certificate authorities trusted for an
	// https:// sink besides the system's. Ignored when Client is set.
	CAFile string
	// InsecureSkipVerify skips the verification of the sink's TLS
	// certificate (tests only). Ignored when Client is set.
	InsecureSkipVerify bool
}

// HTTPSink writes batches to a sink that speaks the wire protocol of the
// package doc: the emulator, or a user's service behind an adapter. Safe for
// concurrent use.
type HTTPSink struct {
	records, stats string
	timeout        time.Duration
	client         *http.Client
	ndjson         bool
	header         http.Header
}

var _ ingest.StatsSink = (*HTTPSink)(nil)

// NewHTTP validates cfg and returns an HTTPSink. It returns an error when
// URL is missing or not an absolute http(s) URL, or Timeout is negative.
func NewHTTP(cfg HTTPConfig) (*HTTPSink, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("sink: url %q: %w", cfg.URL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("sink: url %q: want an absolute http:// or https:// URL", cfg.URL)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("sink: timeout %v is negative", cfg.Timeout)
	}
	if cfg.Client == nil {
		t, err := newTransport(cfg.CAFile, cfg.InsecureSkipVerify)
		if err != nil {
			return nil, err
		}
		cfg.Client = &http.Client{Transport: t, CheckRedirect: noRedirects}
	}
	base := strings.TrimRight(u.String(), "/")
	return &HTTPSink{records: base + sinkwire.PathRecords, stats: base + sinkwire.PathStats, timeout: cfg.Timeout, client: cfg.Client,
		ndjson: cfg.NDJSON, header: cfg.Header.Clone()}, nil
}

// Write implements ingest.Sink: it POSTs batch as one request and maps the
// answer to one Result per record, in order:
//
//   - per record: 201 → Delivered, 200 → Duplicate, 429 → Retryable and
//     Throttled with the answer's Retry-After, other retryable statuses (408,
//     5xx but 501/505; see RetryableStatus) → Retryable, anything else (400,
//     other 4xx) → Permanent; Reason is "HTTP <status>: <error>";
//   - a whole-request 429 with one result per record is read record by
//     record.
//
// It returns an error — the request failed as a whole, and the pipeline
// pauses the sink — on a transport error, a timeout, an answer that breaks
// the protocol (ErrProtocol), and any error status for the whole request:
// an *ingest.SinkError, Throttled for 429 and for 503 with Retry-After.
// Once ctx is done it returns context.Cause(ctx).
func (h *HTTPSink) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	if len(batch) == 0 {
		return []ingest.Result{}, nil
	}
	resp, body, err := h.do(ctx, http.MethodPost, h.records, encodeBatch(batch, h.ndjson), batchKey(batch))
	if err != nil {
		return nil, fmt.Errorf("sink: write %d records: %w", len(batch), err)
	}
	retryAfter := retryAfterOf(resp.Header, time.Now())
	var wr sinkwire.Response
	jsonErr := json.Unmarshal(body, &wr)
	code := resp.StatusCode

	switch {
	case code == http.StatusOK || code == http.StatusMultiStatus ||
		(code == http.StatusTooManyRequests && jsonErr == nil && len(wr.Results) == len(batch)):
		if jsonErr != nil {
			return nil, fmt.Errorf("%w: HTTP %d with an undecodable body: %v", ErrProtocol, code, jsonErr)
		}
		if len(wr.Results) != len(batch) {
			return nil, fmt.Errorf("%w: %d results for %d records", ErrProtocol, len(wr.Results), len(batch))
		}
		out := make([]ingest.Result, len(batch))
		for i, r := range wr.Results {
			if r.ID != batch[i].ID {
				return nil, fmt.Errorf("%w: result %d is for id %q, want %q", ErrProtocol, i, r.ID, batch[i].ID)
			}
			out[i] = recordResult(r.Status, r.Error, retryAfter)
			out[i].Charge = r.Charge
		}
		chargeRequest(out, batch, resp.Header)
		return out, nil
	case code >= 400:
		// A status for the whole request is about the request or the sink
		// (credentials, a wrong URL or format, an outage, throttling),
		// never a verdict about each record in it.
		msg := wr.Error
		if jsonErr != nil || msg == "" {
			msg = strings.TrimSpace(string(body[:min(len(body), 512)]))
		}
		return nil, &ingest.SinkError{
			Throttled:  code == http.StatusTooManyRequests || (code == http.StatusServiceUnavailable && retryAfter > 0),
			RetryAfter: retryAfter,
			Err:        fmt.Errorf("sink: HTTP %d: %s", code, msg),
		}
	}
	return nil, fmt.Errorf("%w: unexpected HTTP %d", ErrProtocol, code)
}

// newTransport is the pooled transport of the HTTP sinks: up to 64 idle
// connections to the sink, TLS as caFile (a PEM file of certificate
// authorities trusted besides the system's) and insecure say.
func newTransport(caFile string, insecure bool) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 64, 64
	if caFile != "" || insecure {
		tc, err := tlsfiles.Files{CAFile: caFile, SystemRoots: true, InsecureSkipVerify: insecure}.Config()
		if err != nil {
			return nil, fmt.Errorf("sink: %w", err)
		}
		t.TLSClientConfig = tc
	}
	return t, nil
}

// noRedirects is the HTTP sinks' redirect policy: a redirected POST would
// turn into a GET, so the 3xx answer is returned (and reported) instead.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Warm implements ingest.Warmer: it sends up to conns concurrent GET
// /v1/stats requests, which opens that many connections (kept idle for
// the writes), and returns an error when the sink does not answer at all.
// Any HTTP status counts as an answer.
func (h *HTTPSink) Warm(ctx context.Context, conns int) error {
	return warmWith(ctx, conns, h.records, func(ctx context.Context) error {
		_, _, err := h.do(ctx, http.MethodGet, h.stats, nil, "")
		return err
	})
}

// chargeRequest attributes a request charge header to the results when the
// answer gave no per-record charges: what the header says beyond the
// estimated costs of the stored and duplicate records goes to the first of
// them (the worker charges the pacer the sum of the excesses).
func chargeRequest(out []ingest.Result, batch []ingest.Record, hdr http.Header) {
	total, err := strconv.ParseInt(strings.TrimSpace(hdr.Get(sinkwire.HeaderRequestCharge)), 10, 64)
	if err != nil || total <= 0 {
		return
	}
	first, estimate := -1, int64(0)
	for i, r := range out {
		if r.Charge > 0 {
			return // per-record charges are more precise
		}
		if r.Outcome == ingest.Delivered || r.Outcome == ingest.Duplicate {
			if first < 0 {
				first = i
			}
			estimate += batch[i].Cost
		}
	}
	if first >= 0 && total > estimate {
		out[first].Charge = batch[first].Cost + total - estimate
	}
}

// recordResult maps one wire status to an ingest.Result.
func recordResult(status int, msg string, retryAfter time.Duration) ingest.Result {
	switch status {
	case sinkwire.StatusStored:
		return ingest.Result{Outcome: ingest.Delivered}
	case sinkwire.StatusDuplicate:
		return ingest.Result{Outcome: ingest.Duplicate}
	}
	reason := "HTTP " + strconv.Itoa(status)
	if msg != "" {
		reason += ": " + msg
	}
	switch {
	case status == http.StatusTooManyRequests:
		return ingest.Result{Outcome: ingest.Retryable, Throttled: true, RetryAfter: retryAfter, Reason: reason}
	case RetryableStatus(status):
		return ingest.Result{Outcome: ingest.Retryable, Reason: reason}
	}
	return ingest.Result{Outcome: ingest.Permanent, Reason: reason}
}

// retryAfterOf reads the wait an answer asks for: x-ms-retry-after-ms when
// present (millisecond precision), else Retry-After; 0 when neither parses.
func retryAfterOf(hdr http.Header, now time.Time) time.Duration {
	if v := hdr.Get(sinkwire.HeaderRetryAfterMs); v != "" {
		if ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && ms >= 0 && ms <= math.MaxInt64/int64(time.Millisecond) {
			return time.Duration(ms) * time.Millisecond
		}
	}
	d, _ := ParseRetryAfter(hdr.Get(sinkwire.HeaderRetryAfter), now)
	return d
}

// Close closes the sink's idle connections. It never fails.
func (h *HTTPSink) Close() error {
	h.client.CloseIdleConnections()
	return nil
}

// Stats implements ingest.StatsSink: it GETs /v1/stats.
func (h *HTTPSink) Stats(ctx context.Context) (ingest.SinkStats, error) {
	resp, body, err := h.do(ctx, http.MethodGet, h.stats, nil, "")
	if err != nil {
		return ingest.SinkStats{}, fmt.Errorf("sink: stats: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return ingest.SinkStats{}, fmt.Errorf("sink: stats: %w: HTTP %d: %.200s", ErrProtocol, resp.StatusCode, body)
	}
	var st ingest.SinkStats
	if err := json.Unmarshal(body, &st); err != nil {
		return ingest.SinkStats{}, fmt.Errorf("sink: stats: %w: %v", ErrProtocol, err)
	}
	return st, nil
}

// do sends one request under the sink's timeout and reads the whole answer.
func (h *HTTPSink) do(ctx context.Context, method, url string, body []byte, idemKey string) (*http.Response, []byte, error) {
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if h.timeout > 0 {
		rctx, cancel = context.WithTimeout(ctx, h.timeout)
	}
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(rctx, method, url, rd)
	if err != nil {
		return nil, nil, err
	}
	for k, vs := range h.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
		if h.ndjson {
			req.Header.Set("Content-Type", "application/x-ndjson")
		}
	}
	if idemKey != "" {
		req.Header.Set(HeaderIdempotencyKey, idemKey)
	}
	resp, err := h.client.Do(oneShot(req))
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, context.Cause(ctx)
		}
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, context.Cause(ctx)
		}
		return nil, nil, fmt.Errorf("read answer: %w", err)
	}
	return resp, data, nil
}

// oneShot makes req a request the transport sends once: Go's transport
// re-sends on a fresh connection, on its own, a request it takes for
// idempotent (one with an Idempotency-Key, or a body it can rewind) when
// the connection drops after the request went out. Such a re-send would
// reach the sink without going through the pacer, so only the pipeline
// retries, as paced attempts.
func oneShot(req *http.Request) *http.Request {
	if req.Body != nil && req.Body != http.NoBody {
		req.GetBody = nil
	}
	return req
}

// HeaderIdempotencyKey carries the batch's idempotency key: the same batch
// retried carries the same key (each record's own key is its "id").
const HeaderIdempotencyKey = "Idempotency-Key"

// batchKey is the batch's idempotency key: the hex SHA-256 of its record IDs,
// so that a retry of the same batch carries the same key.
func batchKey(batch []ingest.Record) string {
	h := sha256.New()
	for _, r := range batch {
		h.Write([]byte(r.ID))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// encodeBatch writes batch as the wire's JSON array, or with ndjson as one
// record per line, into one buffer sized for it up front: each record's
// bytes are copied once, with no intermediate encoding. A record's
// non-empty SinkKey is sent as "key". A value that is valid JSON is copied
// byte for byte (so a bytes-unit sink sees the record's length); any other
// value is sent as a JSON string, which the emulator rejects for that
// record alone instead of failing the whole request. Cost is omitted when
// < 1 (the sink then charges its default).
func encodeBatch(batch []ingest.Record, ndjson bool) []byte {
	n := 2
	for _, r := range batch {
		n += len(r.ID) + len(r.SinkKey) + len(r.Value) + 64
	}
	buf := make([]byte, 0, n)
	if !ndjson {
		buf = append(buf, '[')
	}
	for i, r := range batch {
		if i > 0 && !ndjson {
			buf = append(buf, ',')
		}
		// Invalid UTF-8 is sent as U+FFFD, as encoding/json sends it.
		buf = append(buf, `{"id":`...)
		buf, _ = jsontext.AppendQuote(buf, r.ID)
		if r.SinkKey != "" {
			buf = append(buf, `,"key":`...)
			buf, _ = jsontext.AppendQuote(buf, r.SinkKey)
		}
		if r.Cost >= 1 {
			buf = append(buf, `,"cost":`...)
			buf = strconv.AppendInt(buf, r.Cost, 10)
		}
		buf = append(buf, `,"value":`...)
		if jsontext.Value(r.Value).IsValid(lenient...) {
			buf = append(buf, r.Value...)
		} else {
			buf, _ = jsontext.AppendQuote(buf, r.Value)
		}
		buf = append(buf, '}')
		if ndjson {
			buf = append(buf, '\n')
		}
	}
	if !ndjson {
		buf = append(buf, ']')
	}
	return buf
}

// lenient accepts what encoding/json accepts: repeated names and invalid
// UTF-8 in strings.
var lenient = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}
