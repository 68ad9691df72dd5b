package bench

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// tallyStep is the resolution of a tally's timeline.
const tallyStep = 10 * time.Millisecond

// tally wraps one worker's sink and records, per 10 ms from a common epoch,
// the units the sink accepted from that worker (as seen when the answer
// arrives). It gives each worker's share over time (scenario 2) and the
// moment a worker's accepted rate drops (scenario 7), which the sink's own
// statistics, summed over all clients, cannot.
type tally struct {
	next  ingest.Sink
	epoch time.Time

	mu      sync.Mutex
	buckets []int64
	last    time.Time // latest acceptance
	sends   []send    // every write, when it was sent and its units
}

// send is one write as the worker sent it.
type send struct {
	at    time.Duration // since the epoch
	units int64
}

var _ ingest.Sink = (*tally)(nil)

func newTally(next ingest.Sink, epoch time.Time) *tally { return &tally{next: next, epoch: epoch} }

// Write implements ingest.Sink.
func (t *tally) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	var cost int64
	for _, r := range batch {
		cost += r.Cost
	}
	t.mu.Lock()
	t.sends = append(t.sends, send{time.Since(t.epoch), cost})
	t.mu.Unlock()
	res, err := t.next.Write(ctx, batch)
	if err != nil {
		return res, err
	}
	var units int64
	for i, r := range res {
		if r.Outcome == ingest.Delivered && i < len(batch) {
			units += batch[i].Cost
		}
	}
	if units > 0 {
		t.add(time.Now(), units)
	}
	return res, nil
}

func (t *tally) add(now time.Time, units int64) {
	i := int(now.Sub(t.epoch) / tallyStep)
	if i < 0 {
		i = 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.buckets) <= i {
		t.buckets = append(t.buckets, 0)
	}
	t.buckets[i] += units
	t.last = now
}

// series returns the accepted units per step since the epoch.
func (t *tally) series(step time.Duration) []int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	per := int(step / tallyStep)
	out := make([]int64, (len(t.buckets)+per-1)/per)
	for i, u := range t.buckets {
		out[i/per] += u
	}
	return out
}

// lastAccepted returns the time of the latest acceptance.
func (t *tally) lastAccepted() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last
}

// sendMax returns the most units the members sent in any sliding window of
// width, all members together: the send side of the rate promise, beside
// the sink's own figure.
func sendMax(members []member, width time.Duration) int64 {
	var all []send
	for _, m := range members {
		t := m.timeline()
		t.mu.Lock()
		all = append(all, t.sends...)
		t.mu.Unlock()
	}
	slices.SortStableFunc(all, func(a, b send) int { return cmp.Compare(a.at, b.at) })
	w := ingest.NewWindow(width)
	for _, s := range all {
		w.Add(s.at, s.units)
	}
	return w.Max()
}
