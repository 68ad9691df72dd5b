package ingest

import (
	"sync/atomic"
	"time"
)

// Counters are the pipeline's running totals. One Counters may be shared by
// several workers (bulk-load runs N in one process); every method is safe
// for concurrent use. The zero value is ready.
type Counters struct {
	fetched        atomic.Int64 // records taken from the source
	delivered      atomic.Int64 // records stored by the sink (incl. duplicates)
	duplicates     atomic.Int64 // records the sink already had
	deadLettered   atomic.Int64 // records sent to the dead-letter topic
	requests       atomic.Int64 // sink write requests
	attempts       atomic.Int64 // record attempts sent to the sink
	throttled      atomic.Int64 // record attempts answered "throttled"
	failedWrites   atomic.Int64 // sink write requests that failed as a whole (unreachable, timeout)
	retryable      atomic.Int64 // record attempts answered retryable but not throttled (408, 5xx)
	permanent      atomic.Int64 // record attempts refused for good by the sink (400, other 4xx)
	retried        atomic.Int64 // record attempts that will be tried again
	unitsSent      atomic.Int64 // units charged to the pacer, retries included
	unitsDelivered atomic.Int64 // units of delivered records
	unitsCorrected atomic.Int64 // units the sink charged beyond the estimates
	firstFetch     atomic.Int64 // unix ns of the first fetch, 0 before
	lastDone       atomic.Int64 // unix ns of the latest finished record
}

// Totals is a snapshot of Counters.
type Totals struct {
	Fetched      int64
	Delivered    int64
	Duplicates   int64
	DeadLettered int64
	Requests     int64
	Attempts     int64
	Throttled    int64
	// FailedWrites counts requests that failed as a whole; Retryable and
	// Permanent the record attempts answered so, besides Throttled.
	FailedWrites, Retryable, Permanent int64
	Retried                            int64
	UnitsSent                          int64
	UnitsDelivered                     int64
	// UnitsCorrected is what the sink reported charging beyond the
	// estimated costs, charged to the pacer afterwards (part of UnitsSent).
	UnitsCorrected int64
	// FirstFetch and LastDone bound the run; zero when nothing happened.
	FirstFetch time.Time
	LastDone   time.Time
}

// unitsPerRecord is the average cost of a delivered record, 1 before any.
func (t Totals) unitsPerRecord() float64 {
	if t.Delivered == 0 || t.UnitsDelivered == 0 {
		return 1
	}
	return float64(t.UnitsDelivered) / float64(t.Delivered)
}

// Finished is the number of records that need no more work.
func (t Totals) Finished() int64 { return t.Delivered + t.DeadLettered }

// Elapsed is the time from the first fetch to the last finished record.
func (t Totals) Elapsed() time.Duration {
	if t.FirstFetch.IsZero() || t.LastDone.Before(t.FirstFetch) {
		return 0
	}
	return t.LastDone.Sub(t.FirstFetch)
}

// Totals returns a snapshot.
func (c *Counters) Totals() Totals {
	return Totals{
		Fetched:        c.fetched.Load(),
		Delivered:      c.delivered.Load(),
		Duplicates:     c.duplicates.Load(),
		DeadLettered:   c.deadLettered.Load(),
		Requests:       c.requests.Load(),
		Attempts:       c.attempts.Load(),
		Throttled:      c.throttled.Load(),
		FailedWrites:   c.failedWrites.Load(),
		Retryable:      c.retryable.Load(),
		Permanent:      c.permanent.Load(),
		Retried:        c.retried.Load(),
		UnitsSent:      c.unitsSent.Load(),
		UnitsDelivered: c.unitsDelivered.Load(),
		UnitsCorrected: c.unitsCorrected.Load(),
		FirstFetch:     unixTime(c.firstFetch.Load()),
		LastDone:       unixTime(c.lastDone.Load()),
	}
}

func (c *Counters) noteFetch(now time.Time) {
	c.fetched.Add(1)
	c.firstFetch.CompareAndSwap(0, now.UnixNano())
}

func (c *Counters) noteDone(now time.Time) {
	ns := now.UnixNano()
	for {
		old := c.lastDone.Load()
		if old >= ns || c.lastDone.CompareAndSwap(old, ns) {
			return
		}
	}
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
