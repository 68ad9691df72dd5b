// Package ingest is sluice's ground floor: the record model (Record, its
// position, ID and cost), the small interfaces the engine needs and the
// adapters implement (Source, DeadLetters, Sink, RetryPolicy, Pacer,
// Capacity, Producer, Offsets), the pool's units and pricing, the running
// totals (Counters), the sliding-window account (Window), entity-group
// batching, the lifecycle contract (Runner, RunStack) and the defaults the
// components must agree on.
//
// ingest imports none of sluice's packages, and every other package may
// import it: the engine (package pipeline) drives the ports, the adapters
// (queue, lease, pacing, sink) implement them and never import each other,
// and package worker assembles them.
//
// A record's ID is its idempotency key: an explicit field (RecordID), else
// a hash of its content (ContentID). ScanObject checks in one pass that a
// value is one JSON object and reads its ID field without decoding the rest.
//
// Every sink answer is classified by its scope (see Sink): a verdict about
// one record is that record's Result; a failure of the whole request or of
// the sink is Write's error, which pauses the sink instead of consuming
// records.
package ingest
