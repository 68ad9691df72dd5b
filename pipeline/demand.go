package pipeline

import (
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Demand timing. A worker that announced a backlog of unknown size keeps
// asking for everything for backlogHold, so a queue that runs dry between
// two fetches does not hand partitions back and forth. One whose source
// has had nothing for dryAfter asks for nothing, so peers with a backlog
// get its share at once; when the source reports its lag (Lagger),
// caughtUpAfter with no lag and nothing fetched is enough. A worker asks
// to drain what waits for it beyond one slice at its rate within
// drainWithin.
const (
	backlogHold   = time.Second
	dryAfter      = 200 * time.Millisecond
	caughtUpAfter = 100 * time.Millisecond
	drainWithin   = 500 * time.Millisecond
)

// demand estimates what a worker asks of its pool (Capacity.SetDemand):
// the rate it could use, no more, so that a pool shared by priority
// classes can give a lower class everything a higher one does not use.
//
//   - A bulk load that leases ahead asks for everything (+Inf) until its
//     first record arrives.
//   - A worker that keeps up (every record fetched fitted its slice's
//     budget) asks for its arrival rate: the units it sent in the last
//     second.
//   - A worker whose records wait beyond its slice's budget (capped: it
//     uses all it holds) asks for at least the rate it holds, plus what
//     drains the units waiting for it (its queue lag, what it fetched,
//     retries) within drainWithin, so a rising arrival rate or a backlog
//     is asked for within a slice or two.
//   - One that keeps up adds that only for what waits beyond one slice at
//     its rate (records on their way from the queue are not a backlog).
//   - A capped worker that cannot tell how much waits (a source without
//     Lagger, records held back by a hot key range) asks for everything
//     (+Inf) and keeps asking for backlogHold.
//   - A worker whose source has run dry asks for nothing.
//
// The fetcher updates started and fetchingSince; the slice loop calls
// estimate.
type demand struct {
	leaseAhead    bool
	slice         time.Duration
	started       atomic.Bool  // a record was fetched
	fetchingSince atomic.Int64 // unix ns since the fetcher waits in Source.Fetch; 0 when it does not
	lag           func() int64 // the source's lag, nil when unknown

	lastBacklog time.Time   // slice loop only: the last +Inf
	recent      recentUnits // units sent in the last second
}

// estimate returns the demand in units/s at now. capped: records wait
// beyond this slice's budget; waiting: the units waiting for the worker
// (queue lag, fetched, retries due), -1 when unknown; leased: the rate the
// worker holds, units/s; idle: nothing is queued or waiting for a retry.
func (d *demand) estimate(now time.Time, capped bool, waiting, leased float64, idle bool) float64 {
	if d.leaseAhead && !d.started.Load() {
		d.lastBacklog = now
		return ingest.Inf
	}
	if since := d.fetchingSince.Load(); idle && since != 0 {
		waited := now.Sub(time.Unix(0, since))
		if waited >= dryAfter || (waited >= caughtUpAfter && d.lag != nil && d.lag() == 0) {
			return 0
		}
	}
	rate := float64(d.recent.sum(now))
	switch {
	case capped && waiting < 0:
		d.lastBacklog = now
		return ingest.Inf
	case capped:
		// All that waits is beyond this slice's budget.
		return max(rate, leased) + max(waiting, 0)/drainWithin.Seconds()
	case now.Sub(d.lastBacklog) < backlogHold:
		return ingest.Inf
	}
	// Keeping up: what waits (records on their way from the queue) counts
	// only beyond one slice at the rate.
	if excess := waiting - rate*d.slice.Seconds(); excess > 0 {
		rate += excess / drainWithin.Seconds()
	}
	return rate
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

// lagging reports whether the source says records wait in the queue beyond
// those fetched.
func (d *demand) lagging() bool { return d.lag != nil && d.lag() > 0 }
