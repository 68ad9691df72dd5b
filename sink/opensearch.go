package sink

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/ingest"
)

// OpenSearchAction is the _bulk action an OpenSearchSink writes each
// record with.
type OpenSearchAction string

const (
	// OpenSearchCreate writes a document only when none has its _id: a
	// redelivery answers 409 version_conflict_engine_exception and is a
	// Duplicate. Data streams take only this action.
	OpenSearchCreate OpenSearchAction = "create"
	// OpenSearchIndex writes the document whether or not one has its _id,
	// replacing it (an upsert): a redelivery answers 200 "updated" and is
	// a Duplicate, its value written again.
	OpenSearchIndex OpenSearchAction = "index"
)

// Defaults and limits of OpenSearchConfig.
const (
	// DefaultOpenSearchMaxBytes bounds the body of one _bulk request: 5
	// MiB, the low end of the field's rule of thumb for bulk requests of
	// 5-15 MiB ("Tune for indexing speed" in the Elasticsearch guide, and
	// OpenSearch's own tuning advice), well inside the node's
	// http.max_content_length.
	DefaultOpenSearchMaxBytes = 5 << 20
	// DefaultOpenSearchMaxRecords bounds the documents of one _bulk
	// request: 1,000.
	DefaultOpenSearchMaxRecords = 1000
	// OpenSearchMaxContentLength is the default http.max_content_length
	// of OpenSearch and Elasticsearch, 100 MiB: the node refuses a larger
	// request body with 413, so MaxBytes may not exceed it.
	OpenSearchMaxContentLength = 100 << 20
	// opensearchMaxID is the longest _id OpenSearch takes, in bytes; a
	// longer one fails the whole _bulk request's validation.
	opensearchMaxID = 512
	// opensearchParallel is how many _bulk requests one Write has in
	// flight at most, when its records need several.
	opensearchParallel = 4
	// opensearchFilter trims the answer to what the sink reads.
	opensearchFilter = "errors,items.*._id,items.*.status,items.*.result,items.*.error"
)

// ErrOpenSearchConfig is wrapped by NewOpenSearch errors about its
// configuration.
var ErrOpenSearchConfig = errors.New("sink: opensearch config")

// OpenSearchConfig configures an OpenSearchSink.
type OpenSearchConfig struct {
	// URL is the node's (or the cluster's load balancer's) base URL,
	// http:// or https://, e.g. "https://search.example.com:9200";
	// required.
	URL string
	// Index is the index, alias or data stream written to; required. It
	// follows OpenSearch's index naming rules: lower case, at most 255
	// bytes, not starting with '_', '-' or '+', none of \ / * ? " < > | ,
	// # : or a space.
	Index string
	// Action is the _bulk action. Default OpenSearchCreate.
	Action OpenSearchAction
	// MaxRecords bounds the documents of one _bulk request; a Write of
	// more is sent as several requests. Default
	// DefaultOpenSearchMaxRecords.
	MaxRecords int
	// MaxBytes bounds the body of one _bulk request, in bytes; a Write
	// whose records need more is sent as several requests (a record larger
	// than MaxBytes alone goes alone). Default DefaultOpenSearchMaxBytes,
	// at most OpenSearchMaxContentLength.
	MaxBytes int
	// Username and Password, when Username is set, authenticate every
	// request with HTTP basic authentication (the security plugin's
	// internal users, Elasticsearch's native realm).
	Username, Password string
	// APIKey, when set, authenticates every request with
	// "Authorization: ApiKey <APIKey>": the base64 encoding of id:key that
	// Elasticsearch's create-API-key answer calls "encoded".
	APIKey string
	// Header is added to every request, e.g. an Authorization read from a
	// file or the environment (used when neither Username nor APIKey is
	// set). Its values are never logged.
	Header http.Header
	// CAFile and InsecureSkipVerify are the TLS settings of an https://
	// URL, as in HTTPConfig.
	CAFile             string
	InsecureSkipVerify bool
	// Timeout bounds each _bulk request. Default
	// ingest.DefaultRequestTimeout.
	Timeout time.Duration
	// Logger receives the sink's events. Default slog.Default().
	Logger *slog.Logger
}

// OpenSearchSink writes records as documents of an OpenSearch (or
// Elasticsearch 7 or 8) index through the _bulk API: each record is one
// document whose _id is the record's ID and whose source is the record's
// JSON object, written with a create action (or index; see
// OpenSearchAction). A Write is one _bulk request, or several (up to 4 at
// once) when its records exceed MaxRecords or MaxBytes.
//
// Why plain net/http and not a client library: the clients' transports
// retry failed requests on their own (opensearch-go retries 502, 503, 504
// and connection errors, up to 3 times, by default) and their bulk
// helpers buffer and flush on their own schedule, while every request
// sluice sends must be one send its pacer admitted and charged; the _bulk
// request and answer are two small JSON shapes. Requests carry no GetBody
// and no Idempotency-Key, so net/http's transport never sends one again
// by itself on a new connection.
//
// Results, item by item (the answer's status per document):
//   - 201 created → Delivered; with index, 200 updated → Duplicate (the
//     document was there and is replaced);
//   - 409 version_conflict_engine_exception with create → Duplicate;
//   - 429 (es_rejected_execution_exception, rejected_execution_exception:
//     the node's write queue is full) → Retryable and Throttled, that
//     record only;
//   - 400 (mapper_parsing_exception, document_parsing_exception,
//     illegal_argument_exception, strict_dynamic_mapping_exception, ...)
//     → Permanent, with the server's type and reason: a verdict about the
//     document;
//   - 408 and 5xx but 501 and 505 → Retryable;
//   - an error about the index or the cluster rather than the document
//     (index_not_found_exception, index_closed_exception,
//     cluster_block_exception, security_exception, and any other status:
//     401, 403, 404, ...) is a failure of the request: the Write's error
//     when no record of it was stored, else Retryable.
//
// Before any request: a value that is not a JSON object, and an ID over
// 512 bytes (which would fail the whole request's validation) or not
// valid UTF-8, are Permanent for their record.
//
// The request as a whole: 429, and 503 with Retry-After, are throttling
// (an *ingest.SinkError with Throttled set, Retry-After honoured, when no
// record of the Write was stored; else the request's records are
// Retryable and Throttled); 413 is Permanent for a request of one record
// (larger than the node's http.max_content_length) and the Write's error
// otherwise; any other status, a transport error, a timeout, or an answer
// that cannot be read (not JSON, items missing or out of order) is a
// failure of the request, reported as settle does for the sinks that
// send a Write as several requests. A Write whose every record was
// throttled is an *ingest.SinkError with Throttled set. When the request
// deadline ends a Write, the answers in stand and the records without one
// are Retryable and Throttled; a create whose answer was lost and whose
// retry answers 409 is Delivered, not Duplicate (see unanswered).
//
// Safe for concurrent use.
type OpenSearchSink struct {
	client     *http.Client
	bulk       string // the _bulk URL
	base       string // the node's base URL
	index      string
	action     OpenSearchAction
	maxRecords int
	maxBytes   int
	header     http.Header
	timeout    time.Duration
	log        *slog.Logger
	pending    unanswered // index/_id of creates without an answer
}

var (
	_ ingest.Sink   = (*OpenSearchSink)(nil)
	_ ingest.Warmer = (*OpenSearchSink)(nil)
)

// NewOpenSearch validates cfg and checks that the node answers (GET /,
// which also checks the credentials). It returns an error wrapping
// ErrOpenSearchConfig for a bad config, and the node's error otherwise
// (a refused connection, 401 or 403).
func NewOpenSearch(ctx context.Context, cfg OpenSearchConfig) (*OpenSearchSink, error) {
	cfg.Action = cmp.Or(cfg.Action, OpenSearchCreate)
	cfg.MaxRecords = cmp.Or(cfg.MaxRecords, DefaultOpenSearchMaxRecords)
	cfg.MaxBytes = cmp.Or(cfg.MaxBytes, DefaultOpenSearchMaxBytes)
	cfg.Timeout = cmp.Or(cfg.Timeout, ingest.DefaultRequestTimeout)
	u, err := url.Parse(cfg.URL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, fmt.Errorf("%w: url %q: want http(s)://host[:port]", ErrOpenSearchConfig, cfg.URL)
	case u.User != nil:
		return nil, fmt.Errorf("%w: url %q: credentials do not belong in the URL; set Username and Password or APIKey", ErrOpenSearchConfig, u.Redacted())
	case !validIndex(cfg.Index):
		return nil, fmt.Errorf("%w: index %q: want at most 255 bytes of lower-case characters, not starting with '_', '-' or '+', without \\ / * ? \" < > | , # : or spaces", ErrOpenSearchConfig, cfg.Index)
	case cfg.Action != OpenSearchCreate && cfg.Action != OpenSearchIndex:
		return nil, fmt.Errorf("%w: action %q: want create or index", ErrOpenSearchConfig, cfg.Action)
	case cfg.MaxRecords < 1:
		return nil, fmt.Errorf("%w: max records %d: want at least 1", ErrOpenSearchConfig, cfg.MaxRecords)
	case cfg.MaxBytes < 1 || cfg.MaxBytes > OpenSearchMaxContentLength:
		return nil, fmt.Errorf("%w: max bytes %d: want 1 to %d (http.max_content_length's default, 100 MiB)", ErrOpenSearchConfig, cfg.MaxBytes, OpenSearchMaxContentLength)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: timeout %v is negative", ErrOpenSearchConfig, cfg.Timeout)
	case cfg.Username == "" && cfg.Password != "":
		return nil, fmt.Errorf("%w: a password without a username", ErrOpenSearchConfig)
	case cfg.Username != "" && cfg.APIKey != "":
		return nil, fmt.Errorf("%w: both a username and an API key; give one", ErrOpenSearchConfig)
	}
	t, err := newTransport(cfg.CAFile, cfg.InsecureSkipVerify)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOpenSearchConfig, err)
	}
	// HTTP/1.1, the protocol the _bulk API is served over, whose
	// transport re-sends nothing without GetBody (see OpenSearchSink).
	t.ForceAttemptHTTP2 = false
	t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	header := cfg.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	switch {
	case cfg.Username != "":
		header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(cfg.Username+":"+cfg.Password)))
	case cfg.APIKey != "":
		header.Set("Authorization", "ApiKey "+cfg.APIKey)
	}
	base := strings.TrimRight(u.String(), "/")
	s := &OpenSearchSink{
		client:     &http.Client{Transport: t, CheckRedirect: noRedirects},
		bulk:       base + "/" + url.PathEscape(cfg.Index) + "/_bulk?filter_path=" + opensearchFilter,
		base:       base,
		index:      cfg.Index,
		action:     cfg.Action,
		maxRecords: cfg.MaxRecords,
		maxBytes:   cfg.MaxBytes,
		header:     header,
		timeout:    cfg.Timeout,
		log:        cmp.Or(cfg.Logger, slog.Default()),
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	info, err := s.info(sctx)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("sink: opensearch %s: %w", base, err)
	}
	s.log.Info("opensearch node", "url", base, "index", cfg.Index, "distribution", cmp.Or(info.Version.Distribution, "elasticsearch"),
		"version", info.Version.Number, "action", string(cfg.Action))
	return s, nil
}

// nodeInfo is what GET / answers.
type nodeInfo struct {
	Version struct {
		Distribution string `json:"distribution"`
		Number       string `json:"number"`
	} `json:"version"`
}

// info asks the node who it is.
func (s *OpenSearchSink) info(ctx context.Context) (nodeInfo, error) {
	var info nodeInfo
	status, _, body, err := s.do(ctx, http.MethodGet, s.base+"/", nil)
	if err != nil {
		return info, err
	}
	if status != http.StatusOK {
		return info, fmt.Errorf("GET /: %s", answerError(status, body))
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return info, fmt.Errorf("GET /: not an OpenSearch or Elasticsearch node: %w", err)
	}
	return info, nil
}

// Warm implements ingest.Warmer: it asks the node who it is (GET /) once
// per connection wanted, up to conns at once, which opens the connections
// and checks the credentials.
func (s *OpenSearchSink) Warm(ctx context.Context, conns int) error {
	return warmWith(ctx, conns, "opensearch "+s.base, func(ctx context.Context) error {
		_, err := s.info(ctx)
		return err
	})
}

// Close closes the idle connections. It never fails.
func (s *OpenSearchSink) Close() error {
	s.client.CloseIdleConnections()
	return nil
}

// Index is the index the sink writes to.
func (s *OpenSearchSink) Index() string { return s.index }

// Write makes one attempt to write batch; see OpenSearchSink.
func (s *OpenSearchSink) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	out := make([]ingest.Result, len(batch))
	var (
		sent   []int
		chunks []bulkChunk
		cur    bulkChunk
	)
	for i, r := range batch {
		if len(r.ID) > opensearchMaxID {
			out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: fmt.Sprintf("opensearch: _id of %d bytes: OpenSearch takes at most %d", len(r.ID), opensearchMaxID)}
			continue
		}
		if !utf8.ValidString(r.ID) {
			out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: "opensearch: the record ID, the document's _id, is not valid UTF-8"}
			continue
		}
		doc, ok := s.encode(r)
		if !ok {
			out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: "opensearch: value is not a JSON object"}
			continue
		}
		if len(cur.recs) > 0 && (len(cur.recs) == s.maxRecords || len(cur.body)+len(doc) > s.maxBytes) {
			chunks = append(chunks, cur)
			cur = bulkChunk{}
		}
		cur.recs = append(cur.recs, i)
		cur.body = append(cur.body, doc...)
		sent = append(sent, i)
	}
	if len(cur.recs) > 0 {
		chunks = append(chunks, cur)
	}
	if len(sent) == 0 {
		return out, nil
	}
	var (
		mu    sync.Mutex
		fails []failure
	)
	unstarted := fanOut(ctx, len(chunks), opensearchParallel, func(k int) {
		f := s.send(ctx, batch, &chunks[k], out, &mu)
		if len(f) > 0 {
			mu.Lock()
			fails = append(fails, f...)
			mu.Unlock()
		}
	})
	for _, k := range unstarted {
		fails = append(fails, failure{recs: chunks[k].recs, err: context.Cause(ctx)})
	}
	return settle(ctx, "opensearch", sent, out, fails)
}

// do sends one request under the sink's timeout and reads the whole
// answer (up to maxResponseBytes). The request has no GetBody, so the
// transport cannot send it again by itself.
func (s *OpenSearchSink) do(ctx context.Context, method, target string, body []byte) (int, http.Header, []byte, error) {
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(rctx, method, target, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.GetBody = nil
	for k, vs := range s.header {
		req.Header[k] = vs
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/x-ndjson")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, nil, context.Cause(ctx)
		}
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, nil, context.Cause(ctx)
		}
		return 0, nil, nil, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, resp.Header, data, nil
}

// validIndex applies OpenSearch's index naming rules ("Index naming
// restrictions", OpenSearch documentation; the same in Elasticsearch's
// create index API).
func validIndex(s string) bool {
	if s == "" || len(s) > 255 || s == "." || s == ".." || strings.ContainsAny(s[:1], "_-+") {
		return false
	}
	if strings.ContainsAny(s, "\\/*?\"<>|, #:") {
		return false
	}
	return strings.ToLower(s) == s
}
