package sink

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/placeholder"
)

// RESTConfig configures a RESTSink.
type RESTConfig struct {
	// URL is the request URL template: an absolute http:// or https:// URL
	// whose {name} placeholders, in the path or the query, are replaced by
	// the record's top-level JSON field name (its text: a string's value,
	// a number's digits), path-escaped in the path (a '/' in a value
	// cannot add a segment) and query-escaped in the query. {$id} is the
	// record's ID and {$key} its sink key (its ID when it has none). A
	// record without a field the URL names is refused for good, unsent,
	// with a reason naming the field. Required; with Array, it takes no
	// record fields.
	URL string
	// Method is POST, PUT or PATCH. Defaults to POST.
	Method string
	// Array sends each write's records as one JSON array, one request per
	// write (up to the pipeline's batch size), instead of one request per
	// record.
	Array bool
	// Body is a JSON body template (see the package doc): each string
	// that is exactly "{name}" stands for the field's JSON value,
	// "{$record}" for the whole record, and placeholders inside a longer
	// string for the fields' text. Empty: the record's value as is (a
	// record whose value is not valid JSON is refused for good, unsent).
	Body string
	// Status classifies the answers; empty lists take their defaults
	// (DefaultRetryOn, DefaultDeadLetterOn, DefaultDuplicateOn).
	Status StatusRules
	// Header is added to every request, e.g. an Authorization read from a
	// file or the environment; it may set Content-Type and Accept
	// (defaults application/json). Its values are never logged.
	Header http.Header
	// Timeout bounds each request, connection and response body included.
	// Default 0: only the caller's deadline (the pipeline puts its request
	// timeout on every write).
	Timeout time.Duration
	// Parallel is the most requests of one write in flight at once (one
	// record per request). Defaults to ingest.DefaultConcurrency (16).
	Parallel int
	// Client sends the requests. Default: a client with its own pooled
	// transport (HTTP/1.1, TLS as CAFile and InsecureSkipVerify say,
	// connections opened ahead by Warm) that does not follow redirects.
	Client *http.Client
	// CAFile and InsecureSkipVerify are as in HTTPConfig. Ignored when
	// Client is set.
	CAFile             string
	InsecureSkipVerify bool
}

// RESTSink writes records to a plain REST API that sluice does not control:
// one request per record (or one JSON array per write), any 2xx answer a
// success, every other status classified by StatusRules and by the scope
// rule of the package doc. Safe for concurrent use.
type RESTSink struct {
	url      *urlTemplate
	body     *bodyTemplate // nil: the record as is
	method   string
	array    bool
	rules    StatusRules
	header   http.Header
	timeout  time.Duration
	parallel int
	client   *http.Client
	warm     *warmPool // nil with a caller's Client

	refusals refusals

	rateMu sync.Mutex
	rate   ingest.Window // requests sent in the last second
	epoch  time.Time

	limitMu   sync.Mutex
	limit     float64 // the rate the API's latest answer announced, requests/s; 0 none
	limitFrom string
}

var (
	_ ingest.Sink   = (*RESTSink)(nil)
	_ ingest.Warmer = (*RESTSink)(nil)
)

// NewREST validates cfg and returns a RESTSink. It returns an error for a
// URL or body template that does not parse, a method other than POST, PUT
// or PATCH, record fields in the URL of an Array sink, status lists that
// contradict themselves (a status in two lists; 401, 407 or 429 as a
// dead-letter or duplicate status), or a negative Timeout or Parallel.
func NewREST(cfg RESTConfig) (*RESTSink, error) {
	ut, err := parseURLTemplate(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	method := strings.ToUpper(cmp.Or(cfg.Method, http.MethodPost))
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		return nil, fmt.Errorf("sink: method %q: want POST, PUT or PATCH", cfg.Method)
	}
	if cfg.Array && len(ut.parts) > 1 {
		return nil, fmt.Errorf("sink: url %q: one request carries many records, so its URL cannot name a record's fields", cfg.URL)
	}
	if cfg.Timeout < 0 || cfg.Parallel < 0 {
		return nil, errors.New("sink: timeout and parallel requests must not be negative")
	}
	s := &RESTSink{url: ut, method: method, array: cfg.Array, rules: cfg.Status.withDefaults(), header: cfg.Header.Clone(),
		timeout: cfg.Timeout, parallel: cmp.Or(cfg.Parallel, ingest.DefaultConcurrency), client: cfg.Client,
		rate: ingest.NewWindow(time.Second), epoch: time.Now()}
	if err := s.rules.Validate(); err != nil {
		return nil, fmt.Errorf("sink: status rules: %w", err)
	}
	if cfg.Body != "" {
		if s.body, err = parseBodyTemplate(cfg.Body); err != nil {
			return nil, fmt.Errorf("sink: %w", err)
		}
	}
	if s.header == nil {
		s.header = http.Header{}
	}
	if s.header.Get("Content-Type") == "" {
		s.header.Set("Content-Type", "application/json")
	}
	if s.header.Get("Accept") == "" {
		s.header.Set("Accept", "application/json")
	}
	if s.client == nil {
		if s.client, s.warm, err = newRESTClient(ut, cfg.CAFile, cfg.InsecureSkipVerify); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// newRESTClient is the default client: HTTP/1.1 (one connection per
// request in flight, as the pacer counts them), no redirects, and a dialer
// that hands out the connections Warm opened.
func newRESTClient(ut *urlTemplate, caFile string, insecure bool) (*http.Client, *warmPool, error) {
	t, err := newTransport(caFile, insecure)
	if err != nil {
		return nil, nil, err
	}
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 256, 256
	t.ForceAttemptHTTP2 = false
	u, _ := url.Parse(strings.ReplaceAll(ut.shown, "{…}", "x"))
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	w := &warmPool{target: u, addr: net.JoinHostPort(u.Hostname(), port), proxy: t.Proxy}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if u.Scheme == "https" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if t.TLSClientConfig != nil {
			tc = t.TLSClientConfig.Clone()
		}
		tc.NextProtos = []string{"http/1.1"}
		w.dial = (&tls.Dialer{NetDialer: d, Config: tc}).DialContext
		t.DialTLSContext = w.dialContext
	} else {
		w.dial = d.DialContext
		t.DialContext = w.dialContext
	}
	return &http.Client{Transport: t, CheckRedirect: noRedirects}, w, nil
}

// restAnswer is the answer to one request, about the records it carried.
type restAnswer struct {
	recs       []int // the records' indexes in the batch
	status     int
	body       string // lower case, for status entries with text
	excerpt    string // for reasons
	err        error  // the request failed before an answer
	throttled  bool
	retryAfter time.Duration
	near       bool
}

// Write implements ingest.Sink: one request per record, up to Parallel at
// once (or, with Array, one request for the batch), classified as the
// package doc says:
//
//   - 2xx: Delivered; a DuplicateOn status: Duplicate;
//   - a RetryOn status: Retryable — Throttled, with the answer's wait, for
//     429, 503 with Retry-After, and 403 or 429 with a rate-limit
//     remaining count of 0;
//   - a DeadLetterOn status: Permanent, reason "HTTP <status>: <body
//     excerpt>", unless the write is a suspect refusal of every record
//     (the package doc's scope rule), which is an error;
//   - a record its templates cannot fill (a field missing, a value that
//     is not JSON): Permanent, unsent, the reason naming the field;
//   - a request that failed before an answer: Retryable, unless every
//     request failed so, which is an error.
//
// Any other status (401, 403, 404, 405, 407, 501, 505, a 3xx, a status in
// no list) fails the write as a whole: an *ingest.SinkError naming the
// method, the URL without its query, the status and the answer's
// beginning. Every result of a request whose rate-limit headers say the
// quota will run out before it resets carries NearLimit. Once ctx is done
// Write returns context.Cause(ctx).
func (s *RESTSink) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	if len(batch) == 0 {
		return []ingest.Result{}, nil
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	out := make([]ingest.Result, len(batch))
	var answers []*restAnswer
	var wg sync.WaitGroup
	sem := make(chan struct{}, s.parallel)
	send := func(a *restAnswer, target string, body []byte, recs []ingest.Record) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			s.send(ctx, a, target, body, batchKey(recs))
		})
	}
	if s.array {
		var body bytes.Buffer
		body.WriteByte('[')
		a := &restAnswer{}
		var recs []ingest.Record
		for i, rec := range batch {
			mark := body.Len()
			if len(a.recs) > 0 {
				body.WriteByte(',')
			}
			if err := s.renderBody(rec, &body); err != nil {
				body.Truncate(mark)
				out[i] = unfit(err)
				continue
			}
			a.recs = append(a.recs, i)
			recs = append(recs, rec)
		}
		body.WriteByte(']')
		if len(a.recs) > 0 {
			answers = append(answers, a)
			send(a, s.url.parts[0], body.Bytes(), recs)
		}
	} else {
		for i, rec := range batch {
			f := placeholder.Of(rec)
			target, err := s.url.render(f)
			var body bytes.Buffer
			if err == nil {
				err = s.renderBodyFields(f, &body)
			}
			if err != nil {
				out[i] = unfit(err)
				continue
			}
			a := &restAnswer{recs: []int{i}}
			answers = append(answers, a)
			send(a, target, body.Bytes(), batch[i:i+1])
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if err := s.judge(batch, answers, out); err != nil {
		return nil, err
	}
	return out, nil
}

// unfit is the result of a record its templates cannot fill.
func unfit(err error) ingest.Result {
	return ingest.Result{Outcome: ingest.Permanent, Reason: "not sent: " + err.Error()}
}

// renderBody appends rec's request body to buf.
func (s *RESTSink) renderBody(rec ingest.Record, buf *bytes.Buffer) error {
	return s.renderBodyFields(placeholder.Of(rec), buf)
}

func (s *RESTSink) renderBodyFields(f *placeholder.Values, buf *bytes.Buffer) error {
	if s.body != nil {
		return s.body.render(f, buf)
	}
	v, err := f.JSON(placeholder.Record)
	if err != nil {
		return err
	}
	buf.Write(v)
	return nil
}

// maxMatchBytes is how much of an answer's body status entries with text
// are matched against; the rest is read and dropped so the connection is
// reused.
const maxMatchBytes = 64 << 10

// send makes one request and fills a with its answer.
func (s *RESTSink) send(ctx context.Context, a *restAnswer, target string, body []byte, idemKey string) {
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if s.timeout > 0 {
		rctx, cancel = context.WithTimeout(ctx, s.timeout)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, s.method, target, bytes.NewReader(body))
	if err != nil {
		a.err = err
		return
	}
	req.Header = s.header.Clone()
	req.Header.Set(HeaderIdempotencyKey, idemKey)
	now := s.noteSend()
	resp, err := s.client.Do(oneShot(req))
	if err != nil {
		a.err = err
		var ue *url.Error
		if errors.As(err, &ue) {
			a.err = ue.Err // the URL may hold a record's fields; the write names it once
		}
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxMatchBytes))
	if err != nil {
		a.err = fmt.Errorf("read answer: %w", err)
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	a.status = resp.StatusCode
	a.body = strings.ToLower(string(data))
	a.excerpt = excerpt(data, resp.Header.Get("Content-Type"))
	a.retryAfter = retryAfterOf(resp.Header, now)
	s.noteLimit(resp.Header)
	rl, _ := parseRateLimit(resp.Header, now)
	a.throttled = a.status == http.StatusTooManyRequests ||
		(a.status == http.StatusServiceUnavailable && a.retryAfter > 0) ||
		(a.status == http.StatusForbidden && rl.remaining == 0)
	if a.throttled && a.retryAfter == 0 && rl.remaining == 0 && rl.reset > 0 {
		a.retryAfter = rl.reset
	}
	a.near = rl.nearLimit(s.ownRate(now))
}

// noteLimit keeps the rate an answer announces (announcedLimit).
func (s *RESTSink) noteLimit(h http.Header) {
	v, field, value, ok := announcedLimit(h)
	if !ok {
		return
	}
	s.limitMu.Lock()
	defer s.limitMu.Unlock()
	if v != s.limit {
		s.limit = v
		s.limitFrom = fmt.Sprintf("from the REST API %s: %s %s", s.url.shown, field, value)
	}
}

// SinkCapacity returns the rate, in requests (records) per second, that
// the API's latest answer announced in its rate-limit headers (see
// announcedLimit), or 0 before an answer announced one
// (lease.CapacityReader). It sends nothing: the pool follows what the
// answers to its writes say.
func (s *RESTSink) SinkCapacity(context.Context) (float64, string, error) {
	s.limitMu.Lock()
	defer s.limitMu.Unlock()
	return s.limit, s.limitFrom, nil
}

// Passive reports that SinkCapacity sends no request, so it may be read
// as often as wanted.
func (s *RESTSink) Passive() bool { return true }

// noteSend counts a request in the sink's own rate and returns now.
func (s *RESTSink) noteSend() time.Time {
	now := time.Now()
	s.rateMu.Lock()
	s.rate.Add(now.Sub(s.epoch), 1)
	s.rateMu.Unlock()
	return now
}

// ownRate is the requests/s the sink sent over the last second.
func (s *RESTSink) ownRate(now time.Time) float64 {
	s.rateMu.Lock()
	defer s.rateMu.Unlock()
	return float64(s.rate.Sum(now.Sub(s.epoch)))
}

// judge classifies a write's answers into out (which holds the unsent
// records' verdicts already), or returns the error of a write that failed
// as a whole.
func (s *RESTSink) judge(batch []ingest.Record, answers []*restAnswer, out []ingest.Result) error {
	var (
		classes                  = make([]statusClass, len(answers))
		failed, records, status  int
		stored, refused, uniform = false, false, true
		firstErr                 error
		sentRecs                 []ingest.Record
	)
	for i, a := range answers {
		records += len(a.recs)
		for _, r := range a.recs {
			sentRecs = append(sentRecs, batch[r])
		}
		if a.err != nil {
			failed++
			firstErr = cmp.Or(firstErr, a.err)
			uniform = false
			continue
		}
		c := s.rules.classify(a.status, a.body)
		if a.throttled {
			c = classRetry // throttling is never a verdict about a record
		}
		classes[i] = c
		switch c {
		case classSinkWide:
			return &ingest.SinkError{Throttled: a.throttled, RetryAfter: a.retryAfter,
				Err: fmt.Errorf("sink: %s %s: HTTP %d: %s", s.method, s.url.shown, a.status, a.excerpt)}
		case classSuccess, classDuplicate:
			stored = true
		case classDeadLetter:
			refused = true
		}
		if c != classDeadLetter || (status != 0 && a.status != status) {
			uniform = false
		}
		status = a.status
	}
	if len(answers) == 0 {
		return nil
	}
	if failed == len(answers) {
		return fmt.Errorf("sink: %s %s: %w", s.method, s.url.shown, firstErr)
	}
	if left := s.refusals.observe(batchKey(sentRecs), records, stored, refused, uniform); left > 0 {
		return &ingest.SinkError{Err: fmt.Errorf("sink: %s %s: HTTP %d: %s: every request of the write was refused so with nothing stored since: taken for a refusal of every record (these are dead-lettered if refused so %d more times)",
			s.method, s.url.shown, status, answers[0].excerpt, left)}
	}
	for i, a := range answers {
		var res ingest.Result
		reason := fmt.Sprintf("HTTP %d: %s", a.status, a.excerpt)
		switch {
		case a.err != nil:
			res = ingest.Result{Outcome: ingest.Retryable, Reason: "request failed: " + a.err.Error()}
		case classes[i] == classSuccess:
			res = ingest.Result{Outcome: ingest.Delivered}
		case classes[i] == classDuplicate:
			res = ingest.Result{Outcome: ingest.Duplicate}
		case classes[i] == classRetry:
			res = ingest.Result{Outcome: ingest.Retryable, Throttled: a.throttled, RetryAfter: a.retryAfter, Reason: reason}
		default:
			res = ingest.Result{Outcome: ingest.Permanent, Reason: reason}
		}
		res.NearLimit = a.near
		for _, r := range a.recs {
			out[r] = res
		}
	}
	return nil
}

// excerpt is the beginning of an answer's body for reasons and errors: one
// line, at most 200 characters, HTML tags dropped.
func excerpt(body []byte, contentType string) string {
	s := string(body[:min(len(body), 4096)])
	if strings.Contains(strings.ToLower(contentType), "html") {
		var b strings.Builder
		in := false
		for _, r := range s {
			switch {
			case r == '<':
				in = true
				b.WriteByte(' ')
			case r == '>':
				in = false
			case !in:
				b.WriteRune(r)
			}
		}
		s = html.UnescapeString(b.String())
	}
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	if s == "" {
		return "(empty answer)"
	}
	return s
}

// Warm implements ingest.Warmer: it opens up to conns connections to the
// API (TCP, and TLS for https) without sending a request — a HEAD or
// OPTIONS is not safe to send to an API sluice does not know, and would
// count against its rate limit — and keeps them for the first requests
// (for at most 10 s). It returns an error naming the API when no
// connection opens. With a caller's Client, or behind a proxy, it does
// nothing.
func (s *RESTSink) Warm(ctx context.Context, conns int) error {
	if s.warm == nil {
		return nil
	}
	if err := s.warm.fill(ctx, max(conns, 1)); err != nil {
		return fmt.Errorf("sink: %s does not answer: %w", s.url.shown, err)
	}
	return nil
}

// Close closes the sink's idle and warmed connections. It never fails.
func (s *RESTSink) Close() error {
	if s.warm != nil {
		s.warm.close()
	}
	s.client.CloseIdleConnections()
	return nil
}

// restTarget returns the http(s) URL template of a rest+http:// or
// rest+https:// sink URL.
func restTarget(raw string) (string, bool) {
	scheme, _, _ := strings.Cut(raw, "://")
	switch strings.ToLower(scheme) {
	case "rest+http", "rest+https":
		return raw[len("rest+"):], true
	}
	return "", false
}
