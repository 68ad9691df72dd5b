// Package sink writes records to throttled services: the retry policy, the
// sinks (HTTPSink, RESTSink, PostgresSink, AzureTablesSink, DynamoDBSink,
// S3Sink, GCSSink, OpenSearchSink; Open selects one by the --sink URL's
// scheme), and the wire
// protocol of the throttled sink emulator (`sluice sink-sim`, package
// sinksim) that is the oracle of every end-to-end test and benchmark.
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
// # Cloud Storage
//
// GCSSink (--sink gs://bucket/prefix) writes objects with the official
// client, cloud.google.com/go/storage, over the JSON API, with
// Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, the
// gcloud CLI's application-default login, the metadata server of GCE,
// GKE and Cloud Run), or none with ?endpoint= (an emulator such as
// fake-gcs-server). Like S3Sink it writes one object per record named by
// its sink key (layout=record) or one NDJSON object per batch
// (layout=batch, optionally gzip). Every upload is one request with the
// precondition ifGenerationMatch=0: an object that exists answers 412
// and its record is a Duplicate, never overwritten. 429 and 503 are
// throttling, 408 and other 5xx retried; a name over 1,024 bytes is
// dead-lettered before any request. The client's retries are off, and
// its transport cannot re-send a request on its own, so every attempt is
// one the worker paced and charged. Cloud Storage's
// request-rate guidance ("Request rate and access distribution
// guidelines") is the seed of two of sluice's defaults: spread names
// with --sink-key-strategy hash-prefix:N, and ramp a new bucket or
// prefix up from about 1,000 writes/s, doubling at most every 20 minutes
// (--ramp gcs).
//
// # OpenSearch and Elasticsearch
//
// OpenSearchSink (--sink opensearch://host:port/index, opensearchs://
// for HTTPS; elasticsearch:// and elasticsearchs:// are aliases, as
// Elasticsearch 7 and 8 answer _bulk the same way) writes each record as
// one document, _id = the record ID, through the _bulk API over net/http:
// the clients add retries of their own and a bulk helper that flushes on
// its own schedule, which sluice's pacer must not have under it. A create
// action (the default) makes a redelivery a Duplicate (409); index
// upserts (a redelivery, answered 200 updated, is a Duplicate whose value
// replaced the old one). Each item of the answer is classified by scope:
// 429 (the node's write queue is full) throttles that record alone; 400
// (a mapping or parsing error) dead-letters it with the node's type and
// reason; an error about the index or the cluster (index_not_found,
// index_closed, cluster_block, security) fails the request. A request
// answered 429 (or 503 with Retry-After) as a whole is throttling and
// pauses the worker. Requests are bounded by max_records (1,000) and
// max_bytes (5 MiB, the low end of the field's 5-15 MiB rule of thumb;
// at most 100 MiB, the default http.max_content_length). Credentials come
// as an Authorization header (Basic for a user, ApiKey for an API key)
// from SLUICE_SINK_AUTHORIZATION or --sink-headers-file; --sink-ca-file
// and --sink-insecure-skip-verify apply to opensearchs://.
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
// # REST sink
//
// RESTSink (--sink rest+https://api.example.com/v1/items/{id}) writes to a
// plain REST API that sluice does not control. Each record is one request
// (POST by default, PUT or PATCH) to the URL template filled with the
// record's fields, with the record as the body or a JSON body template
// filled from it; Parallel requests of a write go at once. With Array, a
// write is one request whose body is the JSON array of its records' bodies.
// Every request carries an Idempotency-Key, the hex SHA-256 prefix of its
// records' IDs, the same on every retry.
//
// Pacing. With one record per request, a record is a request: --unit
// records (the default) makes the pool's capacity requests/s at the API,
// and the pacer's guarantee (no sliding second over capacity) holds for
// the API's request count, every request of a write falling between the
// write's send and its answer. With Array a request carries up to the
// batch size: the pool counts records (or bytes), which suits APIs that
// limit records or payload; an API that limits requests is then used below
// its limit, never above it.
//
// Classification. A 2xx answer is a success, whatever its body. Other
// statuses are classified by StatusRules — RetryOn (default 408, 429, 5xx),
// DeadLetterOn (default 4xx), DuplicateOn (default none) — where the most
// specific entry wins (an entry with :TEXT that the body contains, then an
// exact status, then a class or range). 401, 403, 404, 405, 407, 501 and
// 505 beat classes and ranges: they are about the request or the API, not
// the record, unless a list names one exactly (404 for PATCH of items that
// may not exist). A status no list names, a 3xx (redirects are not
// followed) among them, fails the write as a whole, as does a write whose
// every request failed before an answer; a request that failed beside
// answered ones is retried alone. Throttling is never a verdict about a
// record: 429, 503 with Retry-After, and 403 or 429 with a rate-limit
// remaining count of 0 (GitHub's primary rate limit) are Retryable and
// Throttled whatever the lists say, with the wait of Retry-After (seconds
// or an HTTP date), x-ms-retry-after-ms, or else the rate limit's reset.
//
// Scope of refusals. The API answers each request alone and never says
// whether a 400 is about the record or about every request (a schema it
// changed, a body template it no longer accepts). A write is refused when
// none of its records was stored (2xx or duplicate) and one was refused
// (a dead-letter status); refused writes in a row count from 1 and a stored
// record resets them. A write is suspect when every request it sent
// answered the same dead-letter status and it carried two or more records
// or followed another refused write. A suspect write fails as a whole (an
// *ingest.SinkError: the pipeline pauses the sink and keeps the records)
// as many times as there were refused writes in a row before it (at least
// once, at most 16); the pipeline probes the paused sink with that write
// alone, and once its records have been refused that often they are
// dead-lettered. A lone bad record among stored ones is dead-lettered at
// once, a bad batch after one probe; an API that refuses everything
// dead-letters one write before the refusal is recognised, then each
// further write only after 3, 7, 15 and then 16 failed probes, each after
// the pipeline's pause (up to 5 s): a stream waits for the API to be fixed
// instead of draining into the dead-letter topic.
//
// Rate-limit feedback. The answers' RateLimit (the IETF httpapi draft's
// combined field, both shapes, with RateLimit-Policy), RateLimit-Remaining
// / -Limit / -Reset and X-RateLimit-Remaining / -Limit / -Reset headers
// set Result.NearLimit, which slows the worker as a whole (as throttling
// of a whole request does), when the quota left would run out before its
// reset at the sink's own request rate over the last second with a margin
// of 10 % of the limit (without a reset: at most 10 % of the limit left, or
// none). A worker alone at the
// API's limit ends each window with about nothing left and is not slowed;
// one sharing the API with another client is, before it is refused.
//
// Warm-up. Warm opens connections (TCP, and TLS for https) without sending
// anything: a HEAD or OPTIONS is not known to be safe on an API sluice
// does not control and would count against its rate limit. The first
// requests take them (each for at most 10 s).
//
// # Wire protocol
//
// The HTTP sink (http://, https://) speaks sluice's own batch protocol, the
// one the emulator (package sinksim) serves; package sinkwire defines it.
package sink
