// Package api is sluice's intake HTTP server: producers POST records of a
// record type (see ingest.RecordType); every record of a request is
// validated before any is produced, then all are produced durably to the
// type's topic.
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
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/ingest"
)

// DefaultMaxBody is the default request body limit, in bytes (8 MiB).
const DefaultMaxBody = 8 << 20

// ErrConfig is returned by New for an invalid Config.
var ErrConfig = errors.New("api: invalid config")

// Producer produces records durably (all replicas acknowledged).
type Producer interface {
	Produce(ctx context.Context, topic string, recs []ingest.Record) error
}

// Config configures the handler.
type Config struct {
	// Types are the record types accepted, by name. Required.
	Types map[string]*ingest.RecordType
	// Producer takes the accepted records. Required.
	Producer Producer
	// Tokens maps the SHA-256 of each bearer token to the type names it may
	// post ("*": all). Tokens are never stored or logged in clear.
	Tokens map[[32]byte][]string
	// MaxBody is the request body limit in bytes; default DefaultMaxBody.
	MaxBody int64
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Handler serves POST /v1/records/{type} and GET /healthz.
type Handler struct {
	cfg Config
	mux *http.ServeMux
}

// New validates cfg and returns the handler.
func New(cfg Config) (*Handler, error) {
	if len(cfg.Types) == 0 || cfg.Producer == nil {
		return nil, fmt.Errorf("%w: Types and Producer are required", ErrConfig)
	}
	cfg.MaxBody = cmp.Or(cfg.MaxBody, DefaultMaxBody)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	h.mux.HandleFunc("POST /v1/records/{type}", h.post)
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, apiError{Code: code, Message: msg})
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

func (h *Handler) post(w http.ResponseWriter, r *http.Request) {
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
	values, err := split(ct, buf.Bytes())
	if err != nil {
		fail(w, http.StatusBadRequest, "bad_body", err.Error())
		return
	}
	idem := r.Header.Get("Idempotency-Key")
	recs := make([]ingest.Record, 0, len(values))
	ids := make([]string, 0, len(values))
	var bad []recordReason
	for i, v := range values {
		if err := typ.Validate(v); err != nil {
			bad = append(bad, recordReason{Line: i + 1, Reason: err.Error()})
			continue
		}
		id, err := recordID(v, typ.IDField, idem, i)
		if err != nil {
			bad = append(bad, recordReason{Line: i + 1, Reason: err.Error()})
			continue
		}
		recs = append(recs, ingest.Record{ID: id, Key: []byte(id), Value: v})
		ids = append(ids, id)
	}
	if len(bad) > 0 {
		writeJSON(w, http.StatusBadRequest, apiError{Code: "invalid_records",
			Message: fmt.Sprintf("%d of %d records invalid; nothing produced", len(bad), len(values)), Records: bad})
		return
	}
	if err := h.cfg.Producer.Produce(r.Context(), typ.Topic, recs); err != nil {
		h.cfg.Logger.WarnContext(r.Context(), "api: produce failed", "type", typName, "err", err)
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusServiceUnavailable, "unavailable", "the queue cannot take the write; retry")
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"accepted": len(recs), "ids": ids})
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

// split returns the request's records: the elements of a JSON array, or the
// non-blank lines of NDJSON.
func split(ct string, body []byte) ([][]byte, error) {
	if ct == "application/json" {
		var arr []json.RawMessage
		if err := json.Unmarshal(body, &arr); err != nil {
			return nil, fmt.Errorf("body is not a JSON array: %w", err)
		}
		out := make([][]byte, len(arr))
		for i, a := range arr {
			out[i] = a
		}
		return out, nil
	}
	var out [][]byte
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), len(body)+1)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		out = append(out, bytes.Clone(line))
	}
	return out, sc.Err()
}
