package ingest

import "time"

// Defaults of the pipeline, and of the components that must agree with it:
// the pacer slices at DefaultSlice, the lease margin covers
// DefaultRequestTimeout, and the CLI shows these values. Each is defined
// here and only here.
const (
	// DefaultSlice is how often work is released: 200 ms.
	DefaultSlice = 200 * time.Millisecond
	// DefaultRequestTimeout is the deadline of one sink write: 2 s. The
	// lease safety margin covers it, so a write paced under a lease ends
	// before the lease can be taken by a peer.
	DefaultRequestTimeout = 2 * time.Second
	// DefaultMaxBatch is the most records in one sink request: 100.
	DefaultMaxBatch = 100
	// DefaultConcurrency is the most sink requests in flight: 16.
	DefaultConcurrency = 16
	// DefaultMaxInFlightBytes is the most bytes of records fetched and not
	// finished: 64 MiB (at most 262,144 records, each counted at least
	// RecordOverhead bytes).
	DefaultMaxInFlightBytes = 64 << 20
	// DefaultMaxRetryAfter caps how long a sink's Retry-After may hold a
	// write back, for a paused sink and a throttled key range alike: 30 s,
	// so that a sink that asks for an hour is probed again within 30 s.
	DefaultMaxRetryAfter = 30 * time.Second
	// DefaultGrace is how long in-flight writes may go on at shutdown: 10 s.
	DefaultGrace = 10 * time.Second
	// DefaultReadyAfter is how long a failure (sink paused, dead-letter
	// topic or queue unreachable) may last before the pipeline reports
	// itself not ready: 30 s.
	DefaultReadyAfter = 30 * time.Second
)

// RecordOverhead is what a record in flight is counted as beyond its key
// and value, in bytes: its bookkeeping (the item, the Record, the queue's
// message and offset entry, its ID). It keeps a byte budget a bound on
// memory for records of a few bytes, too: a budget of B bytes holds at most
// B ÷ RecordOverhead records.
const RecordOverhead = 256
