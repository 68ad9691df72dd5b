package pipeline

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The demand a worker announces, slice by slice, for what its source
// does: 280 units arrive every 200 ms slice (1,400/s) and are fetched at
// once, or wait in the queue while it stalls and come in a burst after;
// a backlog of unknown size; a load's last slices.
func TestDemandFollowsArrivals(t *testing.T) {
	t.Parallel()
	const slice = 200 * time.Millisecond
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		fetched  int64   // units fetched in the slice
		lag      float64 // units in the queue after it
		waiting  float64 // units waiting beyond the slice's take (lag included), -1 unknown
		capped   bool
		sending  int64 // units the slice took
		leased   float64
		wantLow  float64
		wantHigh float64
	}
	inf := math.Inf(1)
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"keeping up asks for the arrival rate", []step{
			{280, 0, 0, false, 280, 1400, 700, 700}, // the first slice: half the rate it took at
			{280, 0, 0, false, 280, 1400, 1400, 1400},
			{280, 0, 200, false, 280, 1400, 1400, 1400}, // records on their way: no backlog
			{294, 0, 0, false, 294, 1400, 1400, 1430},
			{266, 0, 0, false, 266, 1400, 1390, 1410},
		}},
		{"a stall and its burst: the backlog asked for until drained, then the arrival rate at once", []step{
			{280, 0, 0, false, 280, 1400, 700, 700},
			{280, 0, 0, false, 280, 1400, 1400, 1400},
			{0, 280, 280, false, 0, 1400, 1400, 1400}, // up to two slices' worth on their way: no backlog
			{0, 560, 560, false, 0, 1400, 1400, 1400},
			{0, 840, 840, false, 0, 1400, 1680, 1700},   // 1,400 + (840 − 560) / 1 s
			{1120, 0, 840, true, 280, 1400, 2100, 2150}, // the burst: 1,400 + (840 − 140) / 1 s
			{280, 0, 150, true, 280, 2000, 2100, 2150},  // draining: the most asked for stays
			{280, 0, 0, false, 280, 2000, 2100, 2150},   // drained: one slice more, while it sends the last
			{280, 0, 0, false, 280, 2000, 1400, 1400},   // then the arrival rate, not the drain's sends
		}},
		{"capped with no rate asks for everything", []step{
			{1, 0, 28, true, 0, 0, inf, inf},
		}},
		{"a backlog of unknown size asks for everything", []step{
			{100, -1, -1, true, 100, 500, inf, inf},
		}},
		{"a load's last slices: the backlog's rate while its last records go, then half the rate of what it sends, never more than held unless none is", []step{
			{0, 4000, 4000, true, 0, 1000, 4000, 4000},
			{1000, 0, 0, false, 200, 1000, 4000, 4000}, // the backlog's last take: what it asked for
			{0, 0, 0, false, 100, 1000, 250, 250},      // then half the rate of what it sends
			{0, 0, 0, false, 900, 1000, 1000, 1000},    // never more than held
			{0, 0, 0, false, 100, 0, 250, 250},         // unless it holds none: its sends would wait for good
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := &demand{slice: slice, lag: func() int64 { return 0 }}
			now := t0
			for i, s := range tc.steps {
				now = now.Add(slice)
				d.fetched.Add(s.fetched)
				got := d.estimate(now, s.capped, s.sending, s.waiting, s.lag, s.leased, 0, false)
				require.GreaterOrEqual(t, got, s.wantLow, "step %d: %v", i, got)
				require.LessOrEqual(t, got, s.wantHigh, "step %d: %v", i, got)
			}
		})
	}
}

// Records fetched just after a backlog's last take (a fetch in transit)
// are the backlog's: for a slice after the take that left nothing
// waiting, they are asked for at its rate, so the leases that send them
// stay; a slice later, what a take sends is half its rate again.
func TestDemandKeepsABacklogsRateForItsStragglers(t *testing.T) {
	t.Parallel()
	const slice = 200 * time.Millisecond
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := &demand{slice: slice, lag: func() int64 { return 0 }}
	require.InDelta(t, 4000, d.estimate(now, true, 0, 4000, 4000, 1000, 0, false), 1, "the backlog")
	now = now.Add(slice)
	d.fetched.Add(1000)
	require.InDelta(t, 4000, d.estimate(now, false, 200, 0, 0, 1000, 0, false), 1, "its last take")
	for _, after := range []time.Duration{90 * time.Millisecond, 2 * time.Millisecond, 100 * time.Millisecond} {
		now = now.Add(after)
		d.fetched.Add(16)
		require.InDelta(t, 4000, d.estimate(now, false, 16, 0, 0, 1000, 0, false), 1, "16 stragglers %v later", after)
	}
	now = now.Add(8 * time.Millisecond)
	require.InDelta(t, 250, d.estimate(now, false, 100, 0, 0, 1000, 0, false), 1, "a slice after the last take")
}

// A source run dry asks for nothing; a bulk load that leases ahead asks
// for everything until its first record.
func TestDemandDryAndLeaseAhead(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := &demand{slice: 200 * time.Millisecond, leaseAhead: true}
	require.True(t, math.IsInf(d.estimate(now, false, 0, 0, 0, 0, 0, true), 1), "leasing ahead")
	d.started.Store(true)
	d.fetchingSince.Store(now.Add(-dryAfter).UnixNano())
	require.Zero(t, d.estimate(now, false, 0, 0, -1, 1000, 0, true), "dry for dryAfter, lag unknown")
}

// A worker that caught up asks for its arrival rate while its fetch waits
// between bursts of arrivals, and for nothing once they stopped; a backlog
// it drained is no arrival.
func TestDemandCaughtUp(t *testing.T) {
	t.Parallel()
	const slice = 200 * time.Millisecond
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := startedDemand(slice)
	for range 10 { // 350 records every 250 ms, fetched at once: 1,400/s
		now = now.Add(250 * time.Millisecond)
		d.fetched.Add(350)
		d.estimate(now, false, 350, 0, 0, 1400, 0, false)
	}
	d.fetchingSince.Store(now.UnixNano())
	now = now.Add(caughtUpAfter)
	require.InDelta(t, 1400, d.estimate(now, false, 0, 0, 0, 1400, 0, true), 100, "between two bursts")
	now = now.Add(arrivalWindow)
	require.Zero(t, d.estimate(now, false, 0, 0, 0, 1400, 0, true), "the arrivals stopped")

	drained := startedDemand(slice)
	now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for lag := 2000.0; lag > 0; lag -= 200 { // a backlog drained at 1,000/s
		now = now.Add(slice)
		drained.fetched.Add(200)
		drained.estimate(now, true, 200, lag, lag-200, 1000, 0, false)
	}
	drained.fetchingSince.Store(now.UnixNano())
	now = now.Add(caughtUpAfter)
	require.Zero(t, drained.estimate(now, false, 0, 0, 0, 1000, 0, true), "a drained backlog")
}

// A worker whose records start to arrive after an idle window (a load
// produced into a topic its workers wait on) asks for the rate they arrive
// at, not for that rate spread over the idle window, nor for what waits
// alone: 3,000/s arrive, the worker holds 1,000/s and sends a slice's 200
// of the 600 it fetched. Spread over a 2 s idle window it asked for 580,
// and a fresh worker, with no rate at all, for 516: either gave back half
// its leases in the load's first slice (e2e, 2 workers, the file produced
// in 0.36 s: 18 then 241 records in the first 200 ms slices).
func TestDemandAfterAnIdleWindow(t *testing.T) {
	t.Parallel()
	const slice = 200 * time.Millisecond
	for _, tc := range []struct {
		name string
		lag  int64 // the source's lag while idle: -1 before anything was fetched
	}{
		{"idle for 3 s", 0},
		{"a fresh worker", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			d := &demand{slice: slice, lag: func() int64 { return tc.lag }}
			d.started.Store(tc.lag >= 0)
			d.fetchingSince.Store(now.UnixNano())
			for range 30 { // idle for 3 s, its estimate made every idleWait
				now = now.Add(idleWait)
				require.Zero(t, d.estimate(now, false, 0, 0, float64(tc.lag), 1000, 0, true))
			}
			d.fetchingSince.Store(0)
			d.started.Store(true)
			now = now.Add(slice)
			d.fetched.Add(600)
			got := d.estimate(now, false, 200, 400, 0, 1000, 0, false)
			require.InDelta(t, 3000, got, 1, "the load's first slice")
		})
	}
}

// A worker whose first records came before its fetcher ever waited in
// Fetch (so with no idle note: the group's generation began as the load
// was being produced) reads their rate from its first estimate, made
// without leases: 1,000 fetched and 998 in the queue, then 16 ms later
// 1,000 more fetched and as many produced behind them (a load produced at
// 62,500/s) asks for everything such a rate needs, where it asked for
// what it saw alone (2,598 here; 1,600 of a 2,000 pool in an e2e run of
// one worker on 20 partitions, which gave a fifth of the pool back in the
// load's first slice and sent 320 and 319 records in its second and
// third). Live records at 1,400/s read the same way ask for about their
// rate (1,000 before: what waited alone).
func TestDemandOfAWorkerThatNeverWaited(t *testing.T) {
	t.Parallel()
	const slice = 200 * time.Millisecond
	for _, tc := range []struct {
		name        string
		arrived     int64 // units produced in the 16 ms between the estimates
		least, most float64
	}{
		{"a load being produced", 1000, 60000, math.Inf(1)},
		{"live records at 1,400/s", 22, 1400, 2500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			d := startedDemand(slice)
			d.fetched.Add(tc.arrived)
			require.True(t, math.IsInf(d.estimate(now, true, 0, 998+float64(tc.arrived), 998, 0, 0, false), 1), "no leases yet")
			now = now.Add(16 * time.Millisecond)
			d.fetched.Add(tc.arrived)
			waiting := 998 + 2*float64(tc.arrived) - 400
			got := d.estimate(now, true, 400, waiting, 998, 2000, 0, false)
			require.GreaterOrEqual(t, got, tc.least)
			require.LessOrEqual(t, got, tc.most)
		})
	}
}

// Producers that pause for two slices and then deliver the pause's
// records at once leave a caught-up worker's demand at its arrival rate,
// so its partitions do not go to a lower class and come back; a drop
// that lasts is followed within shiftWindow + shiftConfirm. Without the
// confirmation the demand fell to 933 in the pause's first slice.
func TestDemandRidesOutAPause(t *testing.T) {
	t.Parallel()
	const slice = 200 * time.Millisecond
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := startedDemand(slice)
	step := func(fetched int64) float64 { // one slice in which fetched units came
		now = now.Add(slice)
		d.fetched.Add(fetched)
		if fetched == 0 { // the fetch waited the whole slice
			d.fetchingSince.Store(now.Add(-slice).UnixNano())
			return d.estimate(now, false, 0, 0, 0, 1400, 0, true)
		}
		d.fetchingSince.Store(0)
		return d.estimate(now, false, fetched, 0, 0, 1400, 0, false)
	}
	for range 15 { // 1,400/s for 3 s
		step(280)
	}
	// The arrival rate over arrivalWindow: 2 s with one slice of the
	// pause, then two.
	require.InDelta(t, 1260, step(0), 1, "the pause's first slice")
	require.InDelta(t, 1120, step(0), 1, "its second")
	require.InDelta(t, 1400, step(840), 1, "the pause's records and the slice's")
	require.InDelta(t, 1400, step(280), 1, "after it")
	fell := 0
	for got := 1400.0; got > 700; fell++ { // 280/s from here
		require.Less(t, fell, int((shiftWindow+shiftConfirm)/slice), "the drop not followed within shiftWindow + shiftConfirm")
		got = step(56)
	}
	t.Logf("a drop to 280/s followed in %d slices", fell)
	rose := 0
	for got := 280.0; got < 2000; rose++ { // 2,800/s from here
		require.Less(t, rose, int((shiftWindow+shiftConfirm)/slice), "the rise not followed within shiftWindow + shiftConfirm")
		got = step(560)
	}
	t.Logf("a rise to 2,800/s followed in %d slices", rose)
}

// startedDemand is the demand of a worker that fetched its first record,
// from a source that reports its lag (none).
func startedDemand(slice time.Duration) *demand {
	d := &demand{slice: slice, lag: func() int64 { return 0 }}
	d.started.Store(true)
	return d
}
