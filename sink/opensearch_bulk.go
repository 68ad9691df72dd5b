package sink

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluicehq/sluice/ingest"
)

// One _bulk request of the OpenSearch sink: its body, and how its answer
// is read, item by item.

// bulkChunk is one _bulk request of a Write: the batch indexes of its
// records and its NDJSON body.
type bulkChunk struct {
	recs []int
	body []byte
}

// encode renders a record as its two _bulk lines: the action with the
// record's ID, and its value compacted onto one line. ok is false for a
// value that is not one JSON object.
func (s *OpenSearchSink) encode(r ingest.Record) (doc []byte, ok bool) {
	if !ingest.IsJSONObject(r.Value) {
		return nil, false
	}
	buf := make([]byte, 0, len(r.Value)+len(r.ID)+32)
	buf = append(buf, `{"`...)
	buf = append(buf, s.action...)
	buf = append(buf, `":{"_id":`...)
	buf, _ = jsontext.AppendQuote(buf, r.ID)
	buf = append(buf, "}}\n"...)
	var value bytes.Buffer
	if err := json.Compact(&value, r.Value); err != nil {
		return nil, false
	}
	buf = append(buf, value.Bytes()...)
	return append(buf, '\n'), true
}

// bulkAnswer is the _bulk answer, trimmed by opensearchFilter.
type bulkAnswer struct {
	Errors bool       `json:"errors"`
	Items  []bulkItem `json:"items"`
}

// bulkItem is one item of the answer, keyed by its action.
type bulkItem struct {
	Create *bulkOutcome `json:"create"`
	Index  *bulkOutcome `json:"index"`
}

type bulkOutcome struct {
	ID     string     `json:"_id"`
	Status int        `json:"status"`
	Result string     `json:"result"`
	Error  *bulkError `json:"error"`
}

// bulkError is an error of OpenSearch and Elasticsearch: an item's, or
// the whole request's under "error".
type bulkError struct {
	Type     string     `json:"type"`
	Reason   string     `json:"reason"`
	CausedBy *bulkError `json:"caused_by"`
}

func (e *bulkError) String() string {
	if e == nil {
		return ""
	}
	s := e.Type
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.CausedBy != nil && (e.CausedBy.Type != e.Type || e.CausedBy.Reason != e.Reason) {
		s += " (caused by " + e.CausedBy.String() + ")"
	}
	return s
}

// send sends one chunk and sets the results of its records in out (under
// mu); it returns the failures: the whole request's, or its items' that
// are about the index or the cluster.
func (s *OpenSearchSink) send(ctx context.Context, batch []ingest.Record, c *bulkChunk, out []ingest.Result, mu *sync.Mutex) []failure {
	status, hdr, body, err := s.do(ctx, http.MethodPost, s.bulk, c.body)
	if err != nil {
		for _, i := range c.recs {
			s.pending.add(s.pendingKey(batch[i].ID))
		}
		return []failure{{recs: c.recs, err: err}}
	}
	set := func(res ingest.Result) {
		mu.Lock()
		defer mu.Unlock()
		for _, i := range c.recs {
			out[i] = res
		}
	}
	switch {
	case status == http.StatusOK:
	case status == http.StatusTooManyRequests || (status == http.StatusServiceUnavailable && hdr.Get("Retry-After") != ""):
		set(ingest.Result{Outcome: ingest.Retryable, Throttled: true, RetryAfter: retryAfterOf(hdr, time.Now()),
			Reason: "opensearch: " + answerError(status, body)})
		return nil
	case status == http.StatusRequestEntityTooLarge && len(c.recs) == 1:
		set(ingest.Result{Outcome: ingest.Permanent,
			Reason: fmt.Sprintf("opensearch: HTTP 413: a document of %d bytes is over the node's http.max_content_length", len(c.body))})
		return nil
	case status == http.StatusRequestEntityTooLarge:
		return []failure{{recs: c.recs, err: fmt.Errorf("HTTP 413: a _bulk request of %d bytes is over the node's http.max_content_length; lower max_bytes", len(c.body))}}
	default:
		return []failure{{recs: c.recs, err: errors.New(answerError(status, body))}}
	}
	var ans bulkAnswer
	if err := json.Unmarshal(body, &ans); err != nil {
		return []failure{{recs: c.recs, err: fmt.Errorf("%w: _bulk answer: %v", ErrProtocol, err)}}
	}
	if len(ans.Items) != len(c.recs) {
		return []failure{{recs: c.recs, err: fmt.Errorf("%w: _bulk answered %d items for %d documents", ErrProtocol, len(ans.Items), len(c.recs))}}
	}
	results := make([]ingest.Result, len(c.recs))
	var wide []int
	var wideErr error
	for k, it := range ans.Items {
		i := c.recs[k]
		o := it.Create
		if s.action == OpenSearchIndex {
			o = it.Index
		}
		if o == nil || o.ID != batch[i].ID {
			return []failure{{recs: c.recs, err: fmt.Errorf("%w: _bulk item %d is not the %s of _id %q", ErrProtocol, k, s.action, batch[i].ID)}}
		}
		res, ok := s.itemResult(o, batch[i].ID)
		if !ok {
			wide = append(wide, i)
			wideErr = cmp.Or(wideErr, error(fmt.Errorf("item %s", answerReason(o.Status, o.Error))))
			continue
		}
		results[k] = res
	}
	mu.Lock()
	for k, i := range c.recs {
		if !slices.Contains(wide, i) {
			out[i] = results[k]
		}
	}
	mu.Unlock()
	if len(wide) > 0 {
		return []failure{{recs: wide, err: wideErr}}
	}
	return nil
}

// itemResult classifies one item of a _bulk answer; ok is false for an
// error about the index or the cluster, not the document.
func (s *OpenSearchSink) itemResult(o *bulkOutcome, id string) (res ingest.Result, ok bool) {
	reason := "opensearch: " + answerReason(o.Status, o.Error)
	key := s.pendingKey(id)
	switch {
	case o.Status == http.StatusCreated, o.Status == http.StatusOK && o.Result != "updated":
		s.pending.take(key)
		return ingest.Result{Outcome: ingest.Delivered}, true
	case o.Status == http.StatusOK: // index: updated
		if s.pending.take(key) {
			return ingest.Result{Outcome: ingest.Delivered}, true
		}
		return ingest.Result{Outcome: ingest.Duplicate}, true
	case o.Status == http.StatusConflict && s.action == OpenSearchCreate:
		if s.pending.take(key) {
			return ingest.Result{Outcome: ingest.Delivered}, true
		}
		return ingest.Result{Outcome: ingest.Duplicate}, true
	case o.Status == http.StatusTooManyRequests:
		return ingest.Result{Outcome: ingest.Retryable, Throttled: true, Reason: reason}, true
	case o.Error != nil && indexWideError(o.Error.Type):
		return ingest.Result{}, false
	case o.Status == http.StatusBadRequest:
		return ingest.Result{Outcome: ingest.Permanent, Reason: reason}, true
	case o.Status == http.StatusConflict, RetryableStatus(o.Status):
		return ingest.Result{Outcome: ingest.Retryable, Reason: reason}, true
	}
	return ingest.Result{}, false
}

// indexWideError reports whether an item's error type is about the
// index or the cluster rather than the document (OpenSearch's and
// Elasticsearch's exception names).
func indexWideError(typ string) bool {
	switch typ {
	case "index_not_found_exception", "index_closed_exception", "invalid_index_name_exception",
		"cluster_block_exception", "security_exception", "no_shard_available_action_exception",
		"validation_exception":
		return true
	}
	return false
}

func (s *OpenSearchSink) pendingKey(id string) string { return s.index + "/" + id }

// answerError describes a whole-request answer: its status and the
// error's type and reason, or the start of its body.
func answerError(status int, body []byte) string {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && len(e.Error) > 0 {
		var be bulkError
		if json.Unmarshal(e.Error, &be) == nil && be.Type != "" {
			return answerReason(status, &be)
		}
		var msg string
		if json.Unmarshal(e.Error, &msg) == nil {
			return "HTTP " + strconv.Itoa(status) + ": " + msg
		}
	}
	return "HTTP " + strconv.Itoa(status) + ": " + excerpt(body, "application/json")
}

func answerReason(status int, e *bulkError) string {
	if e == nil {
		return "HTTP " + strconv.Itoa(status)
	}
	return "HTTP " + strconv.Itoa(status) + " " + e.String()
}
