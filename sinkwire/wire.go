package sinkwire

import (
	"encoding/json"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Wire protocol paths, relative to the sink's base URL. See the package doc.
const (
	PathRecords = "/v1/records"
	PathStats   = "/v1/stats"
	PathReset   = "/v1/reset"
)

// Per-record statuses of the wire protocol (Result.Status).
const (
	StatusStored    = 201 // stored for the first time
	StatusDuplicate = 200 // ID already stored; charged, not stored again
	StatusThrottled = 429 // no capacity left; retry after Retry-After
	StatusRejected  = 400 // invalid record; permanent
	StatusFailed    = 503 // injected transient failure; retryable
)

// Headers of a throttled answer.
const (
	// HeaderRetryAfter is the RFC 9110 Retry-After, in whole seconds (≥ 1).
	HeaderRetryAfter = "Retry-After"
	// HeaderRetryAfterMs is Cosmos DB's millisecond-precision companion of
	// Retry-After (x-ms-retry-after-ms); the client prefers it, because a
	// whole second is five 200 ms slices.
	HeaderRetryAfterMs = "x-ms-retry-after-ms"
	// HeaderRequestCharge is the units a write request was charged in all
	// (Cosmos DB's x-ms-request-charge, in RU); the emulator sends it on
	// every /v1/records answer.
	HeaderRequestCharge = "x-ms-request-charge"
)

// Record is one element of the JSON array POSTed to /v1/records.
type Record struct {
	// ID is the idempotency key; required, non-empty.
	ID string `json:"id"`
	// Cost is the units the record is charged, ≥ 1. When absent the sink
	// charges by its unit: 1 for records and cost, len(value) for bytes.
	Cost *int64 `json:"cost,omitempty"`
	// Value is the payload; the emulator requires a JSON object.
	Value json.RawMessage `json:"value"`
	// Key is the record's sink key (ingest.Record.SinkKey), which a
	// range-partitioned emulator places it by; empty: the ID.
	Key string `json:"key,omitempty"`
}

// Result is the sink's answer for one record, in request order.
type Result struct {
	ID     string `json:"id"`
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`
	// Charge is the units the record was charged (stored and duplicate
	// records); absent when none.
	Charge int64 `json:"charge,omitempty"`
}

// Response is the body of every /v1/records answer. Results has one
// entry per request element when the body was a JSON array; Error explains
// a whole-request failure (malformed body, too large).
type Response struct {
	Results []Result `json:"results"`
	Error   string   `json:"error,omitempty"`
}

// Stats is the body of GET /v1/stats: ingest.SinkStats plus the
// emulator's own figures. A client that decodes it into ingest.SinkStats
// ignores the extras.
type Stats struct {
	ingest.SinkStats
	// Mode is "bucket" or "window".
	Mode string `json:"mode"`
	// Unit is what Capacity counts.
	Unit ingest.Unit `json:"unit"`
	// UnitsCharged counts every admitted unit: accepted records and
	// duplicates (a real service charges both). The window maxima count
	// these units.
	UnitsCharged int64 `json:"units_charged"`
	// MaxUnits200msSteady is the most units charged in any sliding 200 ms
	// window that starts a second or more after the first charge: how
	// evenly a load flows once its first slices (which go out at once) are
	// over.
	MaxUnits200msSteady int64 `json:"max_units_200ms_steady"`
	// ThrottledRequests counts requests with at least one record answered
	// 429 (the "throttles" measure is ThrottledRequests ÷ Requests).
	ThrottledRequests int64 `json:"throttled_requests"`
	// Malformed counts requests refused as a whole (bad body, too large).
	Malformed int64 `json:"malformed_requests"`
	// FirstChargeAt and LastChargeAt are when the first and the latest
	// units were charged (zero before any): the sink's own view of how
	// long a load took.
	FirstChargeAt time.Time `json:"first_charge_at,omitzero"`
	LastChargeAt  time.Time `json:"last_charge_at,omitzero"`
	// SeriesStart is when the first 200 ms bucket of UnitsPer200ms starts
	// (the emulator's start or last reset). Only with ?series=1.
	SeriesStart time.Time `json:"series_start,omitzero"`
	// UnitsPer200ms is the units charged in each consecutive 200 ms bucket
	// since SeriesStart, up to the last admission. Only with ?series=1.
	UnitsPer200ms []int64 `json:"units_per_200ms,omitempty"`
	// Partitions is the range layout with sinksim.Config.PartitionLimit, in key
	// order; Splits counts the splits so far.
	Partitions []PartitionStats `json:"partitions,omitempty"`
	Splits     int              `json:"splits,omitempty"`
}

// PartitionStats is one range partition of the emulator.
type PartitionStats struct {
	// Low is the range's first key (inclusive; "" for the first range),
	// High the next range's first key ("" for the last range).
	Low  string `json:"low"`
	High string `json:"high,omitempty"`
	// Accepted counts the operations (records, duplicates included) the
	// range admitted, Throttled those it refused with 429.
	Accepted  int64 `json:"accepted"`
	Throttled int64 `json:"throttled"`
	// MaxOps1s is the most operations the range admitted in any sliding
	// second since it was created.
	MaxOps1s int64 `json:"max_ops_1s"`
}
