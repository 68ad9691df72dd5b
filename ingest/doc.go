// Package ingest is sluice's ground floor: the record model, the worker
// pipeline, bulk-load orchestration and the run summary.
//
// The pipeline releases work in slices. Every slice it asks its Pacer for a
// budget in units, dequeues at most that much from its Source, writes the
// records in batches to its Sink with bounded concurrency, retries retryable
// results (each attempt is charged to the budget again), dead-letters
// permanent ones, and marks every finished record Done so the Source can
// commit. It fetches nothing while its in-flight window is full, so memory
// does not grow with the backlog, and a crash loses nothing: unfinished
// records are still in the queue.
//
// ingest imports none of sluice's adapters; it declares the small interfaces
// it needs (Source, DeadLetters, Sink, RetryPolicy, Pacer, Capacity) and the
// adapters implement them.
package ingest
