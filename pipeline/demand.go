package pipeline

import (
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Demand timing. A worker that stops having a backlog keeps asking for its
// share for backlogHold, so a queue that runs dry between two fetches does
// not hand partitions back and forth. One whose source has had nothing for
// dryAfter asks for nothing, so peers with a backlog get its share at once;
// when the source reports its lag (Lagger), caughtUpAfter with no lag and
// nothing fetched is enough.
const (
	backlogHold   = time.Second
	dryAfter      = 200 * time.Millisecond
	caughtUpAfter = 100 * time.Millisecond
	headroom      = 1.25 // demand over the rate sent, for a rising arrival rate
)

// demand estimates what a worker asks of its pool (Capacity.SetDemand).
// The fetcher updates started and fetchingSince; the slice loop calls
// estimate.
type demand struct {
	leaseAhead    bool
	started       atomic.Bool  // a record was fetched
	fetchingSince atomic.Int64 // unix ns since the fetcher waits in Source.Fetch; 0 when it does not
	lag           func() int64 // the source's lag, nil when unknown

	lastBacklog time.Time   // slice loop only
	recent      recentUnits // units sent in the last second
}

// estimate returns the demand in units/s. backlog: records are waiting
// beyond this slice's budget; idle: nothing is queued or waiting for a retry.
func (d *demand) estimate(now time.Time, backlog, idle bool) float64 {
	if backlog || (d.leaseAhead && !d.started.Load()) {
		d.lastBacklog = now
		return ingest.Inf
	}
	if since := d.fetchingSince.Load(); idle && since != 0 {
		waited := now.Sub(time.Unix(0, since))
		if waited >= dryAfter || (waited >= caughtUpAfter && d.lag != nil && d.lag() == 0) {
			return 0
		}
	}
	if now.Sub(d.lastBacklog) < backlogHold {
		return ingest.Inf
	}
	return float64(d.recent.sum(now)) * headroom
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
