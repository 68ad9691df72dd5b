// Package sink writes records to throttled services: the retry policy, the
// sinks (HTTPSink, PostgresSink, AzureTablesSink, DynamoDBSink, S3Sink;
// Open selects one by the --sink URL's scheme), and the throttled sink
// emulator (`sluice sink-sim`) that is the oracle of every end-to-end test
// and benchmark.
//
// # Failure scope
//
// Every sink classifies each answer by its scope before the records are
// touched: a verdict about one record (a constraint violation, an item
// DynamoDB refuses, an object name S3 refuses) is that record's Permanent
// result and dead-letters it alone; a failure of the whole request or of
// the sink (refused credentials, a missing table or bucket, an endpoint
// that does not answer, an answer that cannot be read) is the error of
// Write, which pauses the worker and never consumes a record. Throttling
// (HTTP 429, 503 SlowDown, ServerBusy, DynamoDB's
// ProvisionedThroughputExceededException) is Retryable with Throttled set
// per record, or an *ingest.SinkError with Throttled set when it hit the
// whole request; it is never a reason to dead-letter. The sinks that send
// a Write as several requests (DynamoDB's puts, S3's objects) report the
// error of a failed request as Write's error only when no record of the
// Write was stored, so that the stored ones are not counted twice.
//
// # Cloud sinks
//
// DynamoDBSink and S3Sink use the AWS SDK for Go v2 with its default
// credential chain, and no SDK retries: every attempt goes through the
// worker, which paces it and charges it. DynamoDBSink writes conditional
// PutItems (a redelivery is a Duplicate) or BatchWriteItems of 25 (a
// redelivery is rewritten), and reports the write capacity units consumed
// when the pool counts WCU; S3Sink writes one object per record named by
// its sink key, or one NDJSON object per batch, with If-None-Match: * so
// that an object stored already is a Duplicate.
//
// # Retry policy
//
// Policy implements ingest.RetryPolicy with the exponential backoff and
// jitter of the cloud storage vendors' retry guidance (Google Cloud Storage,
// Azure Storage): after failed attempt x, y = rand(0.8z, 1.2z)·(2^x − 1) and
// wait = min(zmin + y, zmax), never shorter than the server's Retry-After
// (capped). RetryableStatus is the same guidance's status list: 408, 429 and
// 5xx except 501 and 505.
//
// # Wire protocol
//
// A sink is addressed by a base URL; all bodies are JSON.
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
// SimConfig.Charge, its own rule (e.g. 20 % above the client's estimate).
// Records are admitted in order while capacity lasts: after the first
// record throttled for capacity every later valid record is throttled too.
// With SimConfig.PartitionLimit a record whose key range is at its limit is
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
// GET /v1/stats returns SimStats: the fields of ingest.SinkStats (requests,
// records, accepted, duplicates, throttled, rejected, failed,
// units_accepted, max_units_1s, max_units_200ms, capacity_units_per_s) and
// the emulator's extras (mode, unit, units_charged, throttled_requests,
// malformed_requests); with ?series=1 also series_start and units_per_200ms,
// the units charged in each 200 ms bucket since the start.
//
// POST /v1/reset clears the stored ids and the statistics and refills the
// bucket; it answers 204.
//
// # Emulator guarantees
//
// The emulator enforces Capacity units/s in one of two modes: "bucket", a
// token bucket holding one second of capacity refilled at Capacity/s (the
// per-second budget of Cosmos DB provisioned RU/s), or "window", a strict
// sliding one-second window that never admits more than Capacity units in
// any (t−1 s, t]. Both are computed in exact integer arithmetic. Each
// request is admitted atomically at one instant. max_units_1s and
// max_units_200ms are exact: the largest number of charged units (stored
// plus duplicates) admitted in any half-open window (t−w, t] since the
// start, over the emulator's clock.
package sink
