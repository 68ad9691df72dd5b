package ingest

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// latencyKeep is how many of the latest send→answer latencies Counters
// keeps for its percentile.
const latencyKeep = 1024

// Event is one kind of occurrence a pipeline counts in Counters.
type Event int

// The events a pipeline counts; Totals reports each (EventDelivered as
// Totals.Delivered, EventRetryable as Totals.Retryable, and so on).
const (
	EventRequests       Event = iota // sink write requests
	EventAttempts                    // record attempts sent to the sink
	EventDelivered                   // records the sink stored for the first time
	EventDuplicates                  // records the sink already had (redeliveries)
	EventDeadLettered                // records stored in the dead-letter topic
	EventInvalid                     // records refused before writing (not JSON, no ID, schema, too costly)
	EventThrottled                   // record attempts answered "throttled"
	EventFailedWrites                // sink write requests that failed as a whole
	EventRetryable                   // record attempts answered retryable but not throttled
	EventPermanent                   // record attempts refused for good by the sink
	EventRetried                     // record attempts that will be tried again
	EventUnitsDelivered              // units of delivered records
	EventUnitsCorrected              // units the sink charged beyond the estimates
	EventHotRanges                   // key ranges found hot from the sink's answers
	EventRangeCuts                   // rate cuts of hot key ranges
	numEvents
)

// Counters are the pipeline's running totals. One Counters may be shared by
// several pipelines (bulk-load runs N in one process); every method is safe
// for concurrent use. The zero value is ready.
type Counters struct {
	n          [numEvents]atomic.Int64
	fetched    atomic.Int64 // records taken from the source
	unitsSent  atomic.Int64 // units charged to the pacer, retries included
	firstFetch atomic.Int64 // unix ns of the first fetch, 0 before
	lastDone   atomic.Int64 // unix ns of the latest finished record

	mu        sync.Mutex
	sent      Window          // units sent, by send time since epoch, in order
	unordered []event         // sends not yet in sent, by time: stamps of several pacers arrive out of order
	epoch     time.Time       // start of the sent timeline
	guards    int64           // slices with a budget whose guard was noted
	guardMin  time.Duration   // the least guard in effect at a slice with a budget
	guardMax  time.Duration   // the most
	guardLast time.Duration   // the latest
	latencies []time.Duration // the latest send→answer latencies, a ring
	nextLat   int
	maxLat    time.Duration
	latSum    time.Duration // every latency noted, summed
	latN      int64
}

// Count adds n occurrences of e (units, for the Units events) and returns
// the new total.
func (c *Counters) Count(e Event, n int64) int64 { return c.n[e].Add(n) }

// Totals is a snapshot of Counters.
type Totals struct {
	Fetched int64
	// Delivered counts records the sink stored for the first time;
	// Duplicates the records it already had (redeliveries); DeadLettered
	// the records stored in the dead-letter topic, of which Invalid were
	// refused before writing.
	Delivered, Duplicates, DeadLettered, Invalid int64
	Requests                                     int64
	Attempts                                     int64
	Throttled                                    int64
	// FailedWrites counts requests that failed as a whole; Retryable and
	// Permanent the record attempts answered so, besides Throttled.
	FailedWrites, Retryable, Permanent int64
	Retried                            int64
	UnitsSent                          int64
	UnitsDelivered                     int64
	// UnitsCorrected is what the sink reported charging beyond the
	// estimated costs, charged to the pacer afterwards (part of UnitsSent).
	UnitsCorrected int64
	// HotRanges counts the key ranges the sink's answers showed hot (see
	// the package doc, Throttle feedback), RangeCuts the times a hot range
	// was throttled again at its own rate and slowed.
	HotRanges, RangeCuts int64
	// MaxSent1s is the most units sent in any sliding second, at send
	// time: the send side of the rate promise (the sink's own count is the
	// other side).
	MaxSent1s int64
	// GuardMin, GuardMax and GuardFinal are the least, the most and the
	// latest send-to-accept allowance the pacers planned a slice with
	// (ingest.GuardReporter), 0 when they do not report one.
	GuardMin, GuardMax, GuardFinal time.Duration
	// LatencyP99 and LatencyMax are the 99th percentile of the latest 1,024
	// send→answer latencies and the longest seen: how long a request may
	// take to be accepted after the pacer released it.
	LatencyP99, LatencyMax time.Duration
	// LatencySum is every send→answer latency noted, summed over
	// Latencies answers (a capacity probe's mean latency per interval).
	LatencySum time.Duration
	Latencies  int64
	// FirstFetch and LastDone bound the run; zero when nothing happened.
	FirstFetch time.Time
	LastDone   time.Time
	// FirstSent and LastSent are the first and the latest send the pacers
	// recorded: the work between them is paced, the time before (leases,
	// the first fetch) and after (the last answers) is a job's edges.
	FirstSent, LastSent time.Time
}

// UnitsPerRecord is the average cost of a delivered record, 1 before any.
func (t Totals) UnitsPerRecord() float64 {
	if t.Delivered == 0 || t.UnitsDelivered == 0 {
		return 1
	}
	return float64(t.UnitsDelivered) / float64(t.Delivered)
}

// Finished is the number of records that need no more work: delivered,
// already at the sink, or dead-lettered.
func (t Totals) Finished() int64 { return t.Delivered + t.Duplicates + t.DeadLettered }

// Elapsed is the time from the first fetch to the last finished record.
func (t Totals) Elapsed() time.Duration {
	if t.FirstFetch.IsZero() || t.LastDone.Before(t.FirstFetch) {
		return 0
	}
	return t.LastDone.Sub(t.FirstFetch)
}

// Totals returns a snapshot.
func (c *Counters) Totals() Totals {
	t := Totals{
		Fetched:        c.fetched.Load(),
		Delivered:      c.n[EventDelivered].Load(),
		Duplicates:     c.n[EventDuplicates].Load(),
		DeadLettered:   c.n[EventDeadLettered].Load(),
		Invalid:        c.n[EventInvalid].Load(),
		Requests:       c.n[EventRequests].Load(),
		Attempts:       c.n[EventAttempts].Load(),
		Throttled:      c.n[EventThrottled].Load(),
		FailedWrites:   c.n[EventFailedWrites].Load(),
		Retryable:      c.n[EventRetryable].Load(),
		Permanent:      c.n[EventPermanent].Load(),
		Retried:        c.n[EventRetried].Load(),
		UnitsSent:      c.unitsSent.Load(),
		UnitsDelivered: c.n[EventUnitsDelivered].Load(),
		UnitsCorrected: c.n[EventUnitsCorrected].Load(),
		HotRanges:      c.n[EventHotRanges].Load(),
		RangeCuts:      c.n[EventRangeCuts].Load(),
		FirstFetch:     unixTime(c.firstFetch.Load()),
		LastDone:       unixTime(c.lastDone.Load()),
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sent := c.sent.Clone()
	for _, e := range c.unordered {
		sent.Add(e.at, e.units)
	}
	t.MaxSent1s = sent.Max()
	if !c.epoch.IsZero() {
		t.FirstSent, t.LastSent = c.epoch, c.epoch.Add(sent.Last())
	}
	t.LatencyMax = c.maxLat
	t.LatencySum, t.Latencies = c.latSum, c.latN
	t.GuardMin, t.GuardMax, t.GuardFinal = c.guardMin, c.guardMax, c.guardLast
	if n := len(c.latencies); n > 0 {
		sorted := slices.Clone(c.latencies)
		slices.Sort(sorted)
		t.LatencyP99 = sorted[(n*99+99)/100-1]
	}
	return t
}

// Add adds the outcomes of t (Delivered, Duplicates, DeadLettered and
// UnitsDelivered) as finished now: for work done outside a pipeline that
// shares its totals, such as a stand-in worker in a test.
func (c *Counters) Add(t Totals) {
	now := time.Now()
	c.firstFetch.CompareAndSwap(0, now.UnixNano())
	c.n[EventDelivered].Add(t.Delivered)
	c.n[EventDuplicates].Add(t.Duplicates)
	c.n[EventDeadLettered].Add(t.DeadLettered)
	c.n[EventUnitsDelivered].Add(t.UnitsDelivered)
	c.NoteDone(now)
}

// NoteFetch counts a record taken from the source at now.
func (c *Counters) NoteFetch(now time.Time) {
	c.fetched.Add(1)
	c.firstFetch.CompareAndSwap(0, now.UnixNano())
}

// NoteDone marks now as the latest instant a record was finished.
func (c *Counters) NoteDone(now time.Time) {
	ns := now.UnixNano()
	for {
		old := c.lastDone.Load()
		if old >= ns || c.lastDone.CompareAndSwap(old, ns) {
			return
		}
	}
}

// sendReorder is how late a pacer's stamp may reach NoteSent after a later
// stamp of another pacer sharing the Counters and still take its place in
// the send-side account; a later one counts at the latest time accounted,
// which can only overstate the busiest second.
const sendReorder = time.Second

// NoteSent counts units the pacer recorded as sent at at, for the
// send-side busiest second.
func (c *Counters) NoteSent(at time.Time, units int64) {
	c.unitsSent.Add(units)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch.IsZero() {
		c.epoch, c.sent = at, NewWindow(time.Second)
	}
	e := event{at: max(at.Sub(c.epoch), c.sent.Last()), units: units}
	i, _ := slices.BinarySearchFunc(c.unordered, e.at, func(x event, at time.Duration) int { return cmp.Compare(x.at, at+1) })
	c.unordered = slices.Insert(c.unordered, i, e)
	newest := c.unordered[len(c.unordered)-1].at
	n := 0
	for ; n < len(c.unordered) && c.unordered[n].at <= newest-sendReorder; n++ {
		c.sent.Add(c.unordered[n].at, c.unordered[n].units)
	}
	c.unordered = slices.Delete(c.unordered, 0, n)
}

// NoteGuard records the guard a slice with a budget was planned with.
func (c *Counters) NoteGuard(g time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.guards == 0 || g < c.guardMin {
		c.guardMin = g
	}
	c.guards++
	c.guardMax, c.guardLast = max(c.guardMax, g), g
}

// NoteLatency records one send→answer latency.
func (c *Counters) NoteLatency(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.latencies) < latencyKeep {
		c.latencies = append(c.latencies, d)
	} else {
		c.latencies[c.nextLat] = d
		c.nextLat = (c.nextLat + 1) % latencyKeep
	}
	c.maxLat = max(c.maxLat, d)
	c.latSum += d
	c.latN++
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
