// Package ingest is sluice's ground floor: the record model (Record, its ID
// and cost), the ports the adapters implement, and the worker pipeline that
// drains a queue into a throttled sink at a leased rate.
//
// The pipeline releases work in slices. Every slice it asks its Pacer for a
// budget in units, dequeues at most that much from its Source, writes the
// records in batches to its Sink with bounded concurrency (a slice's sends
// spread evenly over the slice, each under the request deadline), retries
// retryable results (each attempt is charged to the budget again),
// dead-letters the records the sink refused for good through a bounded
// queue of its own, and marks every finished record Done so the Source can
// commit. It fetches nothing while its in-flight window is full, so memory
// does not grow with the backlog, and a crash loses nothing: unfinished
// records are still in the queue.
//
// Every sink answer is classified by its scope. A verdict about one record
// dead-letters that record; a failure of the whole request or of the sink
// (a transport error, a timeout, 401, 403, 404, a 5xx outage, throttling,
// an answer the adapter cannot parse) pauses the sink behind a circuit
// breaker (capped backoff, one probe at a time), spends no budget and uses
// up no record's attempts. Ready reports a pause, an unreachable dead-letter
// topic or queue once it has lasted PipelineConfig.ReadyAfter, and Run
// returns a *StalledError after PipelineConfig.StallTimeout.
//
// ingest imports none of sluice's packages; it declares the small
// interfaces it needs (Source, DeadLetters, Sink, RetryPolicy, Pacer,
// Capacity) and the adapters implement them. Package worker assembles a
// pipeline with its adapters; packages bulkload and recordtype build on it.
package ingest
