// Package api is sluice's intake HTTP server: producers POST records of a
// record type (see recordtype.Type); every record of a request is
// validated before any is produced, then all are produced durably to the
// type's topic. api/openapi.yaml documents the routes.
//
// With Config.Registry set, the handler serves GET /metrics with these
// metrics (type is a configured type's name, "" for requests naming none):
//
//	sluice_api_requests_total{type,code}              counter   requests answered, by HTTP status code
//	sluice_api_records_accepted_total{type}           counter   records produced and acknowledged (202)
//	sluice_api_request_bytes_total{type}              counter   request body bytes read
//	sluice_api_request_duration_seconds{type}         histogram time from request to answer (seconds)
package api

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/recordtype"
)

// DefaultMaxBody is the default request body limit, in bytes (8 MiB).
const DefaultMaxBody = 8 << 20

// ErrConfig is returned by New for an invalid Config.
var ErrConfig = errors.New("api: invalid config")

// Config configures the handler.
type Config struct {
	// Types are the record types accepted, by name. Required.
	Types map[string]*recordtype.Type
	// Producer takes the accepted records. Required.
	Producer ingest.Producer
	// Tokens maps the SHA-256 of each bearer token to the type names it may
	// post ("*": all). Tokens are never stored or logged in clear.
	Tokens map[[32]byte][]string
	// MaxBody is the request body limit in bytes; default DefaultMaxBody.
	MaxBody int64
	// Ready reports whether the queue can take writes (GET /readyz answers
	// 503 while it returns an error); nil: always ready. It is called with
	// a 2 s deadline (see metrics.Handler).
	Ready func(ctx context.Context) error
	// Registry, when set, receives the API's metrics (see the package doc)
	// and is served on GET /metrics.
	Registry *prometheus.Registry
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Handler serves POST /v1/records/{type}, and GET /healthz, GET /readyz
// and, with a Registry, GET /metrics (metrics.Handler).
type Handler struct {
	cfg Config
	mux *http.ServeMux
	m   *apiMetrics // nil without a Registry
}

type apiMetrics struct {
	accepted *prometheus.CounterVec
	bytes    *prometheus.CounterVec
}

// typeKey carries the request's record type (a configured one, else "")
// in its context, for the metrics' type label.
type typeKey struct{}

func typeOf(ctx context.Context) string { s, _ := ctx.Value(typeKey{}).(string); return s }

// New validates cfg and returns the handler.
func New(cfg Config) (*Handler, error) {
	if len(cfg.Types) == 0 || cfg.Producer == nil {
		return nil, fmt.Errorf("%w: Types and Producer are required", ErrConfig)
	}
	cfg.MaxBody = cmp.Or(cfg.MaxBody, DefaultMaxBody)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	h := &Handler{cfg: cfg}
	var gather prometheus.Gatherer
	var records http.Handler = http.HandlerFunc(h.serveRecords)
	if cfg.Registry != nil {
		gather = cfg.Registry
		requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_api_requests_total", Help: "Intake requests answered, by record type and HTTP status code."}, []string{"type", "code"})
		duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_api_request_duration_seconds", Help: "Time from request to answer, in seconds.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"type"})
		m := &apiMetrics{
			accepted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_api_records_accepted_total", Help: "Records produced and acknowledged, by record type."}, []string{"type"}),
			bytes:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_api_request_bytes_total", Help: "Request body bytes read, by record type."}, []string{"type"}),
		}
		for _, c := range []prometheus.Collector{requests, duration, m.accepted, m.bytes} {
			if err := cfg.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("%w: register metrics: %w", ErrConfig, err)
			}
		}
		h.m = m
		byType := promhttp.WithLabelFromCtx("type", typeOf)
		records = promhttp.InstrumentHandlerCounter(requests, promhttp.InstrumentHandlerDuration(duration, records, byType), byType)
	}
	h.mux = metrics.Handler(gather, cfg.Ready)
	h.mux.Handle("POST /v1/records/{type}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		typ := r.PathValue("type")
		if h.cfg.Types[typ] == nil {
			typ = ""
		}
		records.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), typeKey{}, typ)))
	}))
	return h, nil
}

// HashToken returns the stored form of a bearer token.
func HashToken(token string) [32]byte { return sha256.Sum256([]byte(token)) }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

type apiError struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Records []recordReason `json:"records,omitempty"`
}

type recordReason struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

func fail(w http.ResponseWriter, status int, code, msg string) {
	httpserver.WriteJSON(w, status, apiError{Code: code, Message: msg})
}

func (h *Handler) allowed(r *http.Request, typ string) (ok, authed bool) {
	tok, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !found || tok == "" {
		return false, false
	}
	sum := HashToken(tok)
	for k, types := range h.cfg.Tokens {
		if subtle.ConstantTimeCompare(k[:], sum[:]) == 1 {
			for _, t := range types {
				if t == "*" || t == typ {
					return true, true
				}
			}
			return false, true
		}
	}
	return false, false
}

// countingReader counts the bytes read from a request body.
type countingReader struct {
	io.ReadCloser
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n += int64(n)
	return n, err
}

func (h *Handler) serveRecords(w http.ResponseWriter, r *http.Request) {
	if h.m != nil {
		counted := &countingReader{ReadCloser: r.Body}
		r.Body = counted
		defer func() { h.m.bytes.WithLabelValues(typeOf(r.Context())).Add(float64(counted.n)) }()
	}
	typName := r.PathValue("type")
	ok, authed := h.allowed(r, typName)
	if !authed {
		fail(w, http.StatusUnauthorized, "unauthorized", "missing or invalid bearer token")
		return
	}
	typ := h.cfg.Types[typName]
	if typ == nil {
		fail(w, http.StatusNotFound, "unknown_type", fmt.Sprintf("unknown record type %q", typName))
		return
	}
	if !ok {
		fail(w, http.StatusForbidden, "forbidden", fmt.Sprintf("token may not post %q", typName))
		return
	}
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	ct = strings.TrimSpace(ct)
	if ct != "application/x-ndjson" && ct != "application/json" {
		fail(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "want application/x-ndjson or application/json")
		return
	}
	body := http.MaxBytesReader(w, r.Body, h.cfg.MaxBody)
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(body); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			fail(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("body over %d bytes", h.cfg.MaxBody))
			return
		}
		fail(w, http.StatusBadRequest, "bad_body", err.Error())
		return
	}
	values, lines, err := split(ct, buf.Bytes())
	if err != nil {
		fail(w, http.StatusBadRequest, "bad_body", err.Error())
		return
	}
	if len(values) == 0 {
		fail(w, http.StatusBadRequest, "no_records", "the body holds no records")
		return
	}
	idem := r.Header.Get("Idempotency-Key")
	recs := make([]ingest.Record, 0, len(values))
	ids := make([]string, 0, len(values))
	var bad []recordReason
	for i, v := range values {
		if err := typ.Validate(v); err != nil {
			bad = append(bad, recordReason{Line: lines[i], Reason: err.Error()})
			continue
		}
		id, err := recordID(v, typ.IDField, idem, i)
		if err != nil {
			bad = append(bad, recordReason{Line: lines[i], Reason: err.Error()})
			continue
		}
		recs = append(recs, ingest.Record{ID: id, Key: []byte(id), Value: v})
		ids = append(ids, id)
	}
	if len(bad) > 0 {
		httpserver.WriteJSON(w, http.StatusBadRequest, apiError{Code: "invalid_records",
			Message: fmt.Sprintf("%d of %d records invalid; nothing produced", len(bad), len(values)), Records: bad})
		return
	}
	if err := h.cfg.Producer.Produce(r.Context(), typ.Topic, recs); err != nil {
		h.cfg.Logger.WarnContext(r.Context(), "api: produce failed", "type", typName, "err", err)
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusServiceUnavailable, "unavailable", "the queue cannot take the write; retry")
		return
	}
	if h.m != nil {
		h.m.accepted.WithLabelValues(typName).Add(float64(len(recs)))
	}
	httpserver.WriteJSON(w, http.StatusAccepted, map[string]any{"accepted": len(recs), "ids": ids})
}

// recordID is the type's ID field when present, else Idempotency-Key#index,
// else the content hash.
func recordID(v []byte, idField, idem string, i int) (string, error) {
	if idField != "" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err == nil {
			if raw, ok := obj[idField]; ok && string(raw) != "null" {
				return ingest.RecordID(v, idField)
			}
		}
	}
	if idem != "" {
		return idem + "#" + strconv.Itoa(i), nil
	}
	return ingest.ContentID(v), nil
}

// split returns the request's records and where each was: the elements of
// a JSON array (1-based index), or the non-blank lines of NDJSON (line
// number).
func split(ct string, body []byte) (values [][]byte, lines []int, err error) {
	if ct == "application/json" {
		var arr []json.RawMessage
		if err := json.Unmarshal(body, &arr); err != nil {
			return nil, nil, fmt.Errorf("body is not a JSON array: %w", err)
		}
		for i, a := range arr {
			values, lines = append(values, a), append(lines, i+1)
		}
		return values, lines, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), len(body)+1)
	for n := 1; sc.Scan(); n++ {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
			values, lines = append(values, bytes.Clone(line)), append(lines, n)
		}
	}
	return values, lines, sc.Err()
}
