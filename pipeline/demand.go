package pipeline

import (
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Demand timing. A worker that announced a backlog of unknown size keeps
// asking for everything for backlogHold, so a queue that runs dry between
// two fetches does not hand partitions back and forth. One whose source
// reports its lag (Lagger) and has had no lag and nothing to fetch for
// caughtUpAfter asks for its arrival rate, which is 0 once the arrivals
// stopped; one whose source cannot tell asks for nothing after dryAfter,
// so peers with a backlog get its share at once. A worker asks to drain
// what waits for it within drainWithin, on top of its arrival rate
// measured over arrivalWindow, or over shiftWindow when that has been
// below shiftShare of it, or above it by as much (1 ÷ shiftShare), for
// shiftConfirm (a drop or a rise of the arrivals is followed within
// shiftWindow + shiftConfirm; a pause shorter than that is not, see
// arrival). Within 250 ms, each burst of a live worker's records was a
// spike of its demand that its class took from a lower one: beside live
// traffic the bulk load got 0.883-0.908 of what the live traffic leaves
// in 12 runs of TestLiveTrafficFirstBesideABulkLoad, the high class
// leasing 1,440-1,470 records/s on average for 1,400 arriving; within
// 1 s, 0.909 and 0.915 (the high class 1,443 and 1,436, its samples
// never past 1,540), the live records stored within 460 ms (p99).
const (
	backlogHold   = time.Second
	dryAfter      = 200 * time.Millisecond
	caughtUpAfter = 100 * time.Millisecond
	drainWithin   = time.Second
	arrivalWindow = 2 * time.Second
	shiftWindow   = 500 * time.Millisecond
	shiftShare    = 0.75
	shiftConfirm  = 300 * time.Millisecond
)

// demand estimates what a worker asks of its pool (Capacity.SetDemand):
// the rate it could use, no more, so that a pool shared by priority
// classes can give a lower class everything a higher one does not use.
//
//   - A bulk load that leases ahead asks for everything (+Inf) until its
//     first record arrives.
//   - Otherwise it asks for its arrival rate (what its pacer needs to
//     send it: the rate × (1 s + guard) ÷ 1 s) plus what drains the units
//     waiting for it (its queue lag, what it fetched, retries, the head of
//     its line) within drainWithin, and keeps asking for the most it
//     asked for until that backlog is gone and a slice more, so the
//     tail of a backlog is not sent ever slower. The arrival rate over
//     about the last arrivalWindow is what it fetched from the source in
//     that span plus how much its queue lag grew: what arrived was either
//     fetched or still waits in the queue, so neither a backlog drained
//     after a stall nor the slices' rhythm (a second holds five or six
//     slices' sends) is taken for arrivals. When the last shiftWindow's
//     arrivals have been below shiftShare of that, or above it by as
//     much, for shiftConfirm, they are the rate: a drop gives capacity
//     back within a second and a rise takes it, noise and short pauses
//     do not. A window in which nothing arrived says nothing of what
//     comes next: the records that arrive after it (a load produced into
//     a topic its workers wait on) are read over the time since its last
//     note, and a worker that has fetched nothing yet notes its idle
//     waits, and its first estimate without leases, so that its first
//     records are read the same way; spread
//     over the idle window, or read from the first note alone (no rate
//     at all), the first slice of a load asked for half of what it held
//     and gave the rest back (TestDemandAfterAnIdleWindow).
//   - A worker that keeps up (every record fetched fitted its slice's
//     budget) counts what waits only beyond two slices at its arrival
//     rate (records on their way from the queue, a fetch or two, are not
//     a backlog); one whose records wait beyond the slice's budget
//     (capped), beyond half a slice.
//   - A capped worker that cannot tell how much waits (a source without
//     Lagger, records held back by a hot key range, no rate to fetch
//     with) asks for everything (+Inf) and keeps asking for backlogHold.
//   - A worker that took records it has yet to send asks for at least
//     half the rate they were taken at (their units over two slices), up
//     to the rate it holds (any, when it holds none), so that its leases
//     do not all go back before the sends are out.
//   - A worker that caught up (its source has nothing to fetch and no
//     lag) asks for its arrival rate, never more than it holds (it keeps
//     up with that, and a wavering estimate would take partitions at
//     every rise while small falls wait for a keep-alive). Live records
//     that come in bursts leave it idle between them, and giving its
//     partitions back there only to take the pool at the next burst would
//     move them at every burst. When its arrivals have stopped (a load's
//     end) that rate is 0 within shiftWindow; a backlog it drained is not
//     counted as arrivals at all, so a bulk load's worker that ran dry
//     asks for nothing at once. One whose source cannot tell its lag asks
//     for nothing once the source has had nothing for dryAfter.
//
// The fetcher updates started and fetchingSince; the slice loop calls
// estimate at every slice, every idleWait while idle, and as soon as a
// slice ran dry with its sends out (so a worker that caught up gives its
// leases back then, not a slice later), and again before it sends a
// record that came after that.
type demand struct {
	leaseAhead    bool
	slice         time.Duration
	started       atomic.Bool  // a record was fetched
	fetchingSince atomic.Int64 // unix ns since the fetcher waits in Source.Fetch; 0 when it does not
	lag           func() int64 // the source's lag, nil when unknown

	fetched atomic.Int64 // units fetched from the source so far

	lastBacklog time.Time   // slice loop only: the last +Inf
	peak        float64     // slice loop only: the most asked for since the backlog began; 0 without one
	drainedAt   time.Time   // slice loop only: when the backlog of peak was seen gone (asked for a slice more); zero while it lasts
	recent      recentUnits // units sent in the last second
	notes       []arrivals  // slice loop only: the estimates of the last arrivalWindow, oldest first
	shifted     time.Time   // slice loop only: since when the arrivals of the last shiftWindow are below shiftShare of the long window's, or above it by as much; zero when they are not
}

// arrivals is what the source had given and still held at an instant:
// what arrived since is the growth of both.
type arrivals struct {
	at      time.Time
	fetched float64 // units fetched so far
	lag     float64 // units in the queue
}

// estimate returns the demand in units/s at now. capped: records wait
// beyond this slice's budget; sending: the units the slice took and has
// yet to send; waiting: the units waiting for the worker (queue lag,
// fetched, retries, the head of the line), -1 when unknown, of which lag
// in the source's queue; leased: the rate the worker holds, units/s;
// guard: the pacer's send-to-accept allowance (ingest.GuardReporter), 0
// when unknown; idle: nothing is queued, to send or waiting for a retry.
func (d *demand) estimate(now time.Time, capped bool, sending int64, waiting, lag, leased float64, guard time.Duration, idle bool) float64 {
	if d.leaseAhead && !d.started.Load() {
		d.lastBacklog = now
		return ingest.Inf
	}
	if since := d.fetchingSince.Load(); idle && since != 0 {
		switch {
		case d.caughtUp(now):
			// What keeps it so, which is never more than it holds (see
			// the list above).
			return min(d.arrival(now, lag)*(1+guard.Seconds()), leased)
		case now.Sub(time.Unix(0, since)) >= dryAfter:
			if !d.started.Load() {
				// Nothing arrived yet: noted, so that the rate of the
				// first records is read from here.
				d.arrival(now, 0)
			}
			return 0
		}
	}
	sent := float64(d.recent.sum(now))
	switch {
	case capped && (waiting < 0 || leased <= 0):
		// How much waits is unknown, or cannot be learnt at no rate (the
		// queue's lag is read from the records fetched, and a worker
		// without leases fetches none ahead). A lag that is known is
		// noted, so that the next estimate reads what arrives from here:
		// a worker whose first records came before its fetcher ever
		// waited (so before any idle note) read no rate at all and asked
		// only for what it saw, giving back a fifth of the pool in a
		// load's first slice (TestDemandOfAWorkerThatNeverWaited).
		if lag >= 0 {
			d.arrival(now, lag)
		}
		d.lastBacklog = now
		return ingest.Inf
	case waiting < 0:
		if now.Sub(d.lastBacklog) < backlogHold {
			return ingest.Inf
		}
		return sent
	}
	// A pacer whose account keeps each send a second past its answer lets
	// rate × 1 s ÷ (1 s + guard) through: sending the arrivals takes that
	// much more.
	arrival := d.arrival(now, lag) * (1 + guard.Seconds())
	tolerance := 2 * arrival * d.slice.Seconds() // records on their way from the queue
	if capped {
		tolerance /= 4
	} else if now.Sub(d.lastBacklog) < backlogHold {
		return ingest.Inf
	}
	if excess := waiting - tolerance; excess > 0 {
		// A backlog: asked for until it is gone, however it shrinks, so
		// that its tail is not sent ever slower, and for a slice more,
		// while the slices that took its last records send them: records
		// fetched just after the queue ran dry (a fetch in transit) are
		// the backlog's too, and asked for less, the leases went back
		// while their sends waited, which then trickled out at the rate
		// left (one partition's) for up to 150 ms after every other
		// record of a load (TestSinkSideSecondHoldsWithDefaults).
		d.peak = max(d.peak, arrival+excess/drainWithin.Seconds())
		d.drainedAt = time.Time{}
		arrival = d.peak
	} else if d.peak > 0 {
		if d.drainedAt.IsZero() {
			d.drainedAt = now
		}
		if now.Sub(d.drainedAt) < d.slice {
			arrival = max(arrival, d.peak)
		} else {
			d.peak, d.drainedAt = 0, time.Time{}
		}
	}
	// What the slice took is sent over it, each send when the account has
	// room: the rate it was taken at must not all go back meanwhile, or
	// its tail waits for credit a single partition earns. Half that rate
	// (sent within two slices), so that a steady worker's varying takes
	// do not pin its rate, and never above the rate held, so this never
	// asks for more; unless it holds none: a worker whose leases all went
	// while its slice still holds sends asks for their rate, or they wait
	// for a rate nobody asks for (Pacer.Spend gives up on them with
	// ingest.ErrNoRate a slice later).
	take := float64(sending) / d.slice.Seconds() / 2
	if leased > 0 {
		take = min(take, leased)
	}
	return max(arrival, take)
}

// arrival notes what the source had given and held at now (lag units in
// its queue) and returns the units/s that arrived since the latest note at
// or before arrivalWindow ago (the oldest, when the worker has not been
// counting that long; 0 with no earlier note), or, when the arrivals of
// the last shiftWindow have been below shiftShare of that, or above it by
// as much, at every note of the last shiftConfirm, theirs: a long window
// keeps the estimate steady, and a drop or a rise shows within shiftWindow
// + shiftConfirm. A rise taken only from the long window reached a live
// worker's demand in about 2 s, once the worker drained its backlog as
// fast as its leases came (TestBackfillYieldsToALiveStep: the backfill
// down to its share 1.2-1.7 s after a live step in 2 runs of 6, 0.56-0.78
// s with the rise followed). Producers that pause
// (a process descheduled on a busy host, a client that retries) deliver
// nothing for a few hundred milliseconds and then the pause's records at
// once. Believed at once, such a pause gave the worker's partitions to
// a lower class, and the burst after it took them back and more, to
// drain what waited meanwhile: each move idles the partitions moved for
// about a slice, and the lower class lost most of what the higher one
// left it (TestLiveTrafficFirstBesideABulkLoad, e2e, beside a CPU hog
// that runs 100 ms in every 200: the bulk load got 0.64–0.92 of its
// share in 6 runs, median 0.88; 0.76–0.93 with the confirmation, median
// 0.90).
func (d *demand) arrival(now time.Time, lag float64) float64 {
	from := now.Add(-arrivalWindow)
	drop := 0
	for drop+1 < len(d.notes) && !d.notes[drop+1].at.After(from) {
		drop++
	}
	d.notes = d.notes[drop:]
	if n := len(d.notes); n > 1 && d.notes[n-1].fetched+d.notes[n-1].lag <= d.notes[0].fetched+d.notes[0].lag {
		// Nothing arrived over the whole window: a rate of 0 that says
		// nothing of what comes next, so what arrives now starts a new
		// window rather than being spread over the idle one.
		d.notes = d.notes[n-1:]
	}
	d.notes = append(d.notes, arrivals{at: now, fetched: float64(d.fetched.Load()), lag: lag})
	last := d.notes[len(d.notes)-1]
	since := func(first arrivals) float64 {
		span := last.at.Sub(first.at).Seconds()
		if span <= 0 {
			return 0
		}
		return max(last.fetched-first.fetched+last.lag-first.lag, 0) / span
	}
	long := since(d.notes[0])
	recent := d.notes[0]
	for _, n := range d.notes {
		if n.at.After(now.Add(-shiftWindow)) {
			break
		}
		recent = n
	}
	short := since(recent)
	if !recent.at.After(d.notes[0].at) || (short >= shiftShare*long && short*shiftShare <= long) {
		d.shifted = time.Time{}
		return long
	}
	if d.shifted.IsZero() {
		d.shifted = now
	}
	if now.Sub(d.shifted) < shiftConfirm {
		return long
	}
	return short
}

// recentUnits sums the units sent in the last second.
type recentUnits struct {
	epoch time.Time
	w     ingest.Window
}

func (r *recentUnits) add(now time.Time, units int64) {
	if r.epoch.IsZero() {
		r.epoch, r.w = now, ingest.NewWindow(time.Second)
	}
	r.w.Add(max(now.Sub(r.epoch), 0), units)
}

func (r *recentUnits) sum(now time.Time) int64 {
	if r.epoch.IsZero() {
		return 0
	}
	return r.w.Sum(max(now.Sub(r.epoch), 0))
}

// caughtUp reports whether the source has had nothing to fetch and no lag
// for caughtUpAfter at now (false when it cannot tell its lag): estimate
// then answers an idle worker with its arrival rate.
func (d *demand) caughtUp(now time.Time) bool {
	since := d.fetchingSince.Load()
	return since != 0 && now.Sub(time.Unix(0, since)) >= caughtUpAfter && d.lag != nil && d.lag() == 0
}

// lagging reports whether the source says records wait in the queue beyond
// those fetched.
func (d *demand) lagging() bool { return d.lag != nil && d.lag() > 0 }
