package ingest

import (
	"context"
	"errors"
	"time"
)

// ErrNoRate is what Pacer.Spend returns when the worker has held no rate
// for a whole slice while the units waited: its leases went meanwhile (a
// demand that fell to nothing while the sink was paused), and they come
// back only once the pipeline announces its demand again, which it does
// after putting the units back in line.
var ErrNoRate = errors.New("ingest: no leased rate to send at")

// The interfaces below are what the pipeline needs from the adapters. They
// live here, with their consumer; queue, lease, pacing and sink implement
// them and never import each other.

// Source yields records from the queue and takes back the ones that are
// finished. Implementations commit, per queue partition, only offsets below
// which every record is Done, so a crash redelivers instead of losing.
type Source interface {
	// Fetch blocks until the next record is available or ctx is done, and
	// returns it with Pos, Key and Value set (ID and Cost are set by the
	// pipeline). It returns ctx's error once ctx is done.
	Fetch(ctx context.Context) (Record, error)
	// Done marks a fetched record as finished: delivered, a duplicate at the
	// sink, or dead-lettered. Safe for concurrent use, in any order.
	Done(rec Record)
}

// Lagger is implemented by sources that know their consumer lag: how many
// records wait in the queue beyond those fetched (0 when caught up, -1 when
// unknown). A caught-up worker hands its capacity to its peers sooner.
type Lagger interface {
	Lag() int64
}

// Owner is implemented by sources whose records can be taken away, such as
// a consumer group that rebalanced. The pipeline sends only records the
// source still owns; the others are dropped unsent (not Done) and are
// redelivered to their new owner, so a hand-over does not write them twice.
type Owner interface {
	Owns(rec Record) bool
}

// DeadLetter is a record that can never be written, with the reason.
type DeadLetter struct {
	Record Record
	// Reason names what is wrong and where, e.g. "record t/0@42 (id a1):
	// HTTP 400: field mag is not a number".
	Reason string
}

// DeadLetters takes records that can never be written (invalid, too large,
// or refused by the sink for good).
type DeadLetters interface {
	// DeadLetter durably stores every letter before returning nil; the
	// pipeline marks the records Done only after that. On an error none
	// of them counts as stored (a retry may store some twice).
	DeadLetter(ctx context.Context, letters ...DeadLetter) error
}

// Processor is a record type's processing step: it validates a fetched
// record, enriches it and sets its SinkKey and PartitionKey.
type Processor interface {
	// Process returns rec validated and enriched (Value may change; ID and
	// Pos must not), or an error naming what is wrong with it, e.g. `field
	// "mag": want number`; the record is then dead-lettered with that
	// reason. It must be safe for concurrent use.
	Process(rec Record) (Record, error)
}

// ProcessorFunc adapts a function to a Processor.
type ProcessorFunc func(Record) (Record, error)

// Process calls f(rec).
func (f ProcessorFunc) Process(rec Record) (Record, error) { return f(rec) }

// Chain returns a Processor that applies ps in order, stopping at the first
// error; nil entries are skipped. With no non-nil entry it returns nil.
func Chain(ps ...Processor) Processor {
	var live []Processor
	for _, p := range ps {
		if p != nil {
			live = append(live, p)
		}
	}
	switch len(live) {
	case 0:
		return nil
	case 1:
		return live[0]
	}
	return ProcessorFunc(func(rec Record) (Record, error) {
		var err error
		for _, p := range live {
			if rec, err = p.Process(rec); err != nil {
				return rec, err
			}
		}
		return rec, nil
	})
}

// Sink writes batches of records to the throttled target.
//
// Every answer is classified by its scope before anything is done with the
// records. A verdict about one record (a per-record 4xx in a partial
// answer, a constraint violation) is that record's Result. A failure of the
// whole request or of the sink — a transport error, a timeout, 401, 403,
// 404, 405, a 5xx outage, throttling of any length, an answer the adapter
// cannot parse — is the error: the pipeline then pauses the sink, keeps
// the records and their Kafka positions, and never uses up their attempts.
type Sink interface {
	// Write makes one attempt to write batch and returns one Result per
	// record, in batch order, or an error when the attempt failed as a
	// whole (a *SinkError to say it was throttled or when to retry). ctx
	// carries the pipeline's request deadline; once ctx is done Write
	// returns context.Cause(ctx).
	Write(ctx context.Context, batch []Record) ([]Result, error)
}

// Warmer is implemented by sinks that can open their connections and check
// that the target answers before the first slice is released, so that the
// first requests do not pay the handshakes (and land later than paced).
type Warmer interface {
	// Warm opens up to conns connections (the pipeline's concurrency) and
	// returns an error naming the target when it does not answer.
	Warm(ctx context.Context, conns int) error
}

// SinkError is a write that failed as a whole. Sinks return it to say
// that the sink throttled the request or asked for a wait; any other error
// from Write is treated as an outage.
type SinkError struct {
	// Throttled: the sink refused the request for lack of capacity (HTTP
	// 429, 503 with Retry-After, ServerBusy, a provisioned-throughput
	// error). Throttling pauses the sink and slows the worker; it never
	// dead-letters.
	Throttled bool
	// RetryAfter is the wait the sink asked for (Retry-After), 0 if none.
	RetryAfter time.Duration
	// Err is what happened, e.g. "HTTP 401: invalid token".
	Err error
}

func (e *SinkError) Error() string {
	if e.Err == nil {
		return "sink: write failed"
	}
	return e.Err.Error()
}

func (e *SinkError) Unwrap() error { return e.Err }

// RetryPolicy decides when a failed attempt is tried again.
type RetryPolicy interface {
	// Backoff returns the wait before attempt number attempt+1 of one
	// record, given that attempt (1-based) just failed with a retryable
	// result whose server-suggested wait is retryAfter (0 when none). ok is
	// false when no attempts are left.
	Backoff(attempt int, retryAfter time.Duration) (wait time.Duration, ok bool)
	// Pause returns how long to pause the sink after failures (≥ 1)
	// consecutive failures of whole requests, honouring retryAfter as
	// Backoff does. It never gives up: a pause ends with a probe.
	Pause(failures int, retryAfter time.Duration) time.Duration
}

// Pacer releases capacity in slices (200 ms by default).
type Pacer interface {
	// Next blocks until the next slice starts and returns its budget in
	// units (≥ 0). want is the cost of the record waiting at the head of the
	// line (0 when none): a pacer may return a budget ≥ want for a record
	// costing more than one slice, charging the excess as debt against the
	// following slices. It returns ctx's error once ctx is done.
	Next(ctx context.Context, want int64) (budget int64, err error)
	// Spend waits until units may be sent now (the pacer's sliding account
	// has room for them; within the budget Next gave it normally has) and
	// records them as sent; the pacer carries units beyond the budget as
	// debt. The pipeline calls the Send's Answered once the sink's answer
	// to that send has arrived (or the send was abandoned): a request is
	// accepted by the sink somewhere between its send and its answer, so
	// the pacer keeps the send in its account until one window after the
	// answer. It returns ctx's error once ctx is done, and ErrNoRate after
	// a slice at no rate.
	Spend(ctx context.Context, units int64) (Send, error)
}

// Send is a send the pacer admitted.
type Send struct {
	// At is when the pacer recorded the send in its account. The send
	// side of the rate promise is judged at these instants.
	At time.Time
	// Answered marks the send answered; calls after the first do nothing.
	Answered func()
}

// GuardReporter is implemented by pacers that plan their slices with a
// measured send-to-accept allowance (the guard in effect); the pipeline
// reports it in its Counters.
type GuardReporter interface {
	Guard() time.Duration
}

// RiseReporter is implemented by pacers that open the next slice at once
// when the worker's rate rose since the current one opened (leases just
// gained): Rose reports whether it has. The pipeline then stops sending
// the current slice's budget and asks Next for the next slice, so that
// the gain flows at once rather than from the next slice on.
type RiseReporter interface {
	Rose() bool
}

// BacklogReporter is implemented by capacities that publish the worker's
// backlog, for the pool's ETA: the units waiting for it (queue lag and
// what it fetched), -1 when unknown.
type BacklogReporter interface {
	SetBacklog(units float64)
}

// ThrottleFeedback is implemented by pacers that slow down when the sink
// throttles although the worker kept to its leases (another application
// shares the service). The worker reports each request throttled as a
// whole and each answer that says the sink's limit is nearly used up; a
// record throttled alone slows only its key range (see the package doc).
type ThrottleFeedback interface {
	Throttled()
}

// Capacity is the worker's view of its leased share of the pool.
type Capacity interface {
	// Rate returns the rate, in units/s, that the worker may use at now:
	// the sum of its provably valid leases.
	Rate(now time.Time) float64
	// Credit returns the integral of Rate over [from, to), in units: what
	// the worker's leases entitled it to send in that interval. A lease
	// counts from the moment it is taken until the moment it stops
	// counting (released, failed to renew, or within the safety margin of
	// its expiry), exactly, so a pacer that never sends more than its
	// Credit over any window cannot overlap with a peer taking the same
	// partition afterwards.
	Credit(from, to time.Time) float64
	// SetDemand announces how many units/s the worker could use: +Inf
	// while it has a backlog it cannot drain at its current rate, the
	// observed arrival rate otherwise, 0 when idle.
	SetDemand(unitsPerSecond float64)
}

// Outcome is the fate of one record in one write attempt.
type Outcome int

const (
	// Delivered: the sink stored the record.
	Delivered Outcome = iota
	// Duplicate: the sink already had a record with this ID (a redelivery);
	// it is finished, but counted apart from the records delivered.
	Duplicate
	// Retryable: the attempt failed for this record for a reason that may
	// pass (the record's own 5xx in a partial answer, or Throttled); it is
	// written again after a backoff. A record that keeps failing without
	// being throttled is dead-lettered after the retry policy's attempts;
	// when every record of a request comes back Retryable, the pipeline
	// treats the request as failed as a whole instead.
	Retryable
	// Permanent: the sink refused the record for good (invalid, a
	// per-record 4xx, a constraint violation); it goes to the dead-letter
	// topic.
	Permanent
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "delivered"
	case Duplicate:
		return "duplicate"
	case Retryable:
		return "retryable"
	case Permanent:
		return "permanent"
	}
	return "unknown"
}

// Result is the sink's answer for one record of a batch.
type Result struct {
	Outcome Outcome
	// Throttled is set on Retryable results caused by the sink's rate
	// limit (a per-record 429), as opposed to other transient failures.
	// A throttled attempt never uses up the record's attempts.
	Throttled bool
	// RetryAfter is the wait the sink asked for (Retry-After), 0 if none.
	RetryAfter time.Duration
	// Reason explains a Retryable or Permanent outcome, e.g. "HTTP 400:
	// field mag is not a number". It becomes the dead-letter reason.
	Reason string
	// NearLimit is set on the results of a request whose answer said the
	// sink's own rate limit is nearly used up (RateLimit-Remaining,
	// X-RateLimit-Remaining): the pipeline slows down as it does for
	// throttling, before the sink has to refuse anything. The records'
	// outcomes are unaffected.
	NearLimit bool
	// Charge is what the sink reports it charged for a Delivered or
	// Duplicate record, in the pool's unit (e.g. Cosmos DB's
	// x-ms-request-charge); 0 when it does not say. A charge above the
	// record's estimated Cost is charged to the pacer at the next slice, so
	// an estimate that is too low cannot drift the long-run rate over
	// capacity.
	Charge int64
}

// SinkStats is what a sink that keeps statistics (the sink emulator) reports
// about everything it received. Units are the pool's unit.
type SinkStats struct {
	Requests       int64 `json:"requests"`        // write requests received
	Records        int64 `json:"records"`         // record attempts received
	Accepted       int64 `json:"accepted"`        // records stored for the first time
	Duplicates     int64 `json:"duplicates"`      // records whose ID was already stored
	Throttled      int64 `json:"throttled"`       // record attempts answered 429
	Rejected       int64 `json:"rejected"`        // record attempts refused for good (4xx)
	Failed         int64 `json:"failed"`          // record attempts failed by injected errors (5xx)
	UnitsAccepted  int64 `json:"units_accepted"`  // units of accepted records
	MaxUnits1s     int64 `json:"max_units_1s"`    // most units accepted in any sliding 1 s window
	MaxUnits200ms  int64 `json:"max_units_200ms"` // most units accepted in any sliding 200 ms window
	CapacityPerSec int64 `json:"capacity_units_per_s"`
}

// StatsSink is a Sink that can report SinkStats.
type StatsSink interface {
	Sink
	Stats(ctx context.Context) (SinkStats, error)
}

// Producer appends records to a topic durably (acknowledged by all in-sync
// replicas) before returning nil.
type Producer interface {
	Produce(ctx context.Context, topic string, recs []Record) error
}

// Offsets reads a topic's end offsets and a consumer group's committed
// offsets, per partition ("next offset to read" semantics), and the group's
// membership.
type Offsets interface {
	EndOffsets(ctx context.Context, topic string) (map[int]int64, error)
	CommittedOffsets(ctx context.Context, group, topic string) (map[int]int64, error)
	// GroupMembers returns the group's member count and whether it is
	// stable (not rebalancing).
	GroupMembers(ctx context.Context, group string) (members int, stable bool, err error)
}
