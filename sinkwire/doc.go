// Package sinkwire is sluice's own batch protocol over HTTP, which the
// HTTP sink (package sink) speaks and the throttled emulator (package
// sinksim) serves: its paths, per-record statuses, headers and bodies.
// It depends on nothing but the record model, so the emulator links no
// cloud SDK.
//
// The HTTP sink (http://, https://) and the emulator speak sluice's own
// batch protocol. A sink is addressed by a base URL; all bodies are JSON.
//
// POST /v1/records writes one batch. The body is a JSON array of records
//
//	[{"id": "nc75191211", "cost": 10, "value": {"mag": 2.1, ...}}, ...]
//
// id is the idempotency key (a non-empty string); cost is the units the
// record is charged, an integer ≥ 1 (absent: 1, or len(value) when the sink
// counts bytes); value is the payload, which the emulator requires to be a
// JSON object; an optional key is the record's sink key (the key a
// range-partitioned store orders it by; absent: the id). The answer always
// carries one result per array element, in order:
//
//	{"results": [{"id": "nc75191211", "status": 201}, {"id": "x", "status": 400, "error": "missing required field \"mag\""}]}
//
// Per-record status: 201 stored; 200 duplicate (the id was already stored; a
// real service charges the write, and so does the emulator); 429 throttled
// (no capacity left); 400 rejected for good (no id, value not a JSON object,
// a required field missing or null, cost < 1 or above the capacity); 503
// failed (an injected transient error). Only stored and duplicate records
// are charged; their result carries "charge", the units charged, and every
// answer carries x-ms-request-charge, the request's total (as Cosmos DB
// reports RU). The emulator charges the record's cost, or, with
// sinksim.Config.Charge, its own rule (e.g. 20 % above the client's estimate).
// Records are admitted in order while capacity lasts: after the first
// record throttled for capacity every later valid record is throttled too.
// With sinksim.Config.PartitionLimit a record whose key range is at its limit is
// throttled alone.
//
// The HTTP status is 200 when every record was stored or a duplicate (an
// empty array included), 429 when every record was throttled, 207 (Multi-
// Status) otherwise. Whenever a record was throttled the answer carries
// Retry-After (whole seconds, ≥ 1) and x-ms-retry-after-ms (milliseconds, as
// Cosmos DB sends it): the time until the capacity for the first throttled
// record is back. A body that is not a JSON array is answered 400, a body
// over the limit (8 MiB by default) 413, both with {"results": [],
// "error": "..."} and nothing admitted.
//
// GET /v1/stats returns Stats: the fields of ingest.SinkStats (requests,
// records, accepted, duplicates, throttled, rejected, failed,
// units_accepted, max_units_1s, max_units_200ms, capacity_units_per_s) and
// the emulator's extras (mode, unit, units_charged, throttled_requests,
// malformed_requests); with ?series=1 also series_start and units_per_200ms,
// the units charged in each 200 ms bucket since the start.
//
// POST /v1/reset clears the stored ids and the statistics and refills the
// bucket; it answers 204.
package sinkwire
