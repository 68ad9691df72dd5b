package pacing_test

import (
	"cmp"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/pacing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	slice  = pacing.DefaultSlice
	guard  = pacing.DefaultGuard
	window = pacing.DefaultWindow
)

// fakeCapacity is a rate that changes in steps at chosen offsets from start
// (0 before the first step); Credit is its exact integral.
type fakeCapacity struct {
	start time.Time
	steps []step // sorted by at
}

type step struct {
	at   time.Duration
	rate float64 // units/s from at on
}

func (c *fakeCapacity) Rate(now time.Time) float64 {
	d := now.Sub(c.start)
	var r float64
	for _, s := range c.steps {
		if s.at > d {
			break
		}
		r = s.rate
	}
	return r
}

func (c *fakeCapacity) Credit(from, to time.Time) float64 {
	a, b := from.Sub(c.start), to.Sub(c.start)
	var sum float64
	for i, s := range c.steps {
		end := time.Duration(math.MaxInt64)
		if i+1 < len(c.steps) {
			end = c.steps[i+1].at
		}
		if lo, hi := max(a, s.at), min(b, end); hi > lo {
			sum += s.rate * (hi - lo).Seconds()
		}
	}
	return sum
}

// credit is Credit over offsets from start.
func (c *fakeCapacity) credit(from, to time.Duration) float64 {
	return c.Credit(c.start.Add(from), c.start.Add(to))
}

// burst is one slice of rate r, as the pacer rounds it.
func burst(r float64) int64 { return int64(math.Ceil(r*slice.Seconds() - 1e-6)) }

// slc is what the driver saw of one slice.
type slc struct {
	open   time.Duration // when Next returned, since start
	at     time.Duration // when the slice's first send went (after lag and any hold)
	rate   float64       // the rate at open
	want   int64
	budget int64
	units  int64   // sent in all
	sends  []event // each send: when it went, when it was answered, how much
}

// drive runs a backlogged pipeline as ingest's does: records costing
// costs() each, taken in order while they fit the budget, sent in up to
// sendsPerSlice requests spread evenly over the slice, each lag() after its
// turn and answered latency() after it went. It starts at offset and stops
// at until (offsets from capa.start).
type drive struct {
	costs         func() int64         // nil: no backlog
	lag           func() time.Duration // nil: send on time
	latency       func() time.Duration // nil: answered at once
	offset, until time.Duration
}

const sendsPerSlice = 10

func (d drive) run(t *testing.T, p *pacing.Pacer, capa *fakeCapacity) []slc {
	t.Helper()
	time.Sleep(time.Until(capa.start.Add(d.offset)))
	ctx, cancel := context.WithDeadline(t.Context(), capa.start.Add(d.until))
	defer cancel()
	var out []slc
	var head int64 // 0: no backlog
	if d.costs != nil {
		head = d.costs()
	}
	var answers sync.WaitGroup
	defer answers.Wait()
	for {
		budget, err := p.Next(ctx, head)
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			return out
		}
		now := time.Now()
		s := slc{open: now.Sub(capa.start), rate: capa.Rate(now), want: head, budget: budget}
		var recs []int64
		for head > 0 && head <= budget-s.units {
			s.units += head
			recs = append(recs, head)
			head = d.costs()
		}
		n := min(len(recs), sendsPerSlice)
	sends:
		for i := range n {
			var units int64
			for _, c := range recs[len(recs)*i/n : len(recs)*(i+1)/n] {
				units += c
			}
			time.Sleep(time.Until(now.Add(p.SliceLength() * time.Duration(i) / time.Duration(n))))
			if d.lag != nil {
				time.Sleep(d.lag())
			}
			sent, err := p.Spend(ctx, units)
			if errors.Is(err, ingest.ErrNoRate) {
				break sends // the lease went: the rest of the slice is not sent
			}
			if err != nil {
				require.ErrorIs(t, err, context.DeadlineExceeded)
				return append(out, s)
			}
			e := event{at: time.Since(capa.start), units: units}
			e.ans = e.at
			if d.latency != nil {
				lat := d.latency()
				e.ans += lat
				answers.Go(func() {
					time.Sleep(lat)
					sent.Answered()
				})
			} else {
				sent.Answered()
			}
			if i == 0 {
				s.at = e.at
			}
			s.sends = append(s.sends, e)
		}
		out = append(out, s)
	}
}

func constant(c int64) func() int64 { return func() int64 { return c } }

// sequence returns the costs in order, then 1 forever.
func sequence(costs ...int64) func() int64 {
	return func() int64 {
		if len(costs) == 0 {
			return 1
		}
		c := costs[0]
		costs = costs[1:]
		return c
	}
}

func repeat(n int, c int64) []int64 { return slices.Repeat([]int64{c}, n) }

// event is one send: at is when it was sent (or, for maxWindow, accepted),
// ans when its answer arrived.
type event struct {
	at, ans time.Duration
	units   int64
}

func spends(ss []slc) []event {
	var ev []event
	for _, s := range ss {
		ev = append(ev, s.sends...)
	}
	return ev
}

// maxWindow is the most units in any half-open window (x−w, x], as the
// sink counts them, and where the busiest one starts.
func maxWindow(ev []event, w time.Duration) (most int64, from time.Duration) {
	ev = slices.Clone(ev)
	slices.SortStableFunc(ev, func(a, b event) int { return int(a.at - b.at) })
	var sum int64
	i := 0
	for j := range ev {
		sum += ev[j].units
		for ev[i].at <= ev[j].at-w {
			sum -= ev[i].units
			i++
		}
		if sum > most {
			most, from = sum, ev[j].at-w
		}
	}
	return most, from
}

// accepted places each send's acceptance at random within [send, answer],
// where a real sink may accept it.
func accepted(ev []event, rng *rand.Rand) []event {
	out := make([]event, len(ev))
	for i, e := range ev {
		at := e.at
		if e.ans > e.at {
			at += time.Duration(rng.Int64N(int64(e.ans-e.at) + 1))
		}
		out[i] = event{at, e.ans, e.units}
	}
	return out
}

func total(ev []event) int64 {
	var n int64
	for _, e := range ev {
		n += e.units
	}
	return n
}

// requireWithinCredit checks the account at every send: the units sent up
// to it whose answer came less than Window before it (those the sink may
// have accepted in a window that also holds this send) never exceed the
// integral of the rate over the Window before it.
func requireWithinCredit(t *testing.T, capa *fakeCapacity, ev []event) {
	t.Helper()
	for j, e := range ev {
		var sum int64
		for _, f := range ev[:j+1] {
			if max(f.ans, f.at+guard) > e.at-window {
				sum += f.units
			}
		}
		c := capa.credit(e.at-window, e.at)
		require.LessOrEqualf(t, float64(sum), c+1e-6, "window [%v, %v]: %d units > credit %.3f", e.at-window, e.at, sum, c)
	}
}

// requireSliceBudgets checks that no slice gets more than one slice of its
// rate, except a record admitted on debt (budget == want).
func requireSliceBudgets(t *testing.T, ss []slc) {
	t.Helper()
	for _, s := range ss {
		if s.budget > burst(s.rate) {
			require.Equalf(t, s.want, s.budget, "slice at %v (rate %v): budget %d > one slice", s.open, s.rate, s.budget)
			require.Greaterf(t, s.want, burst(s.rate), "slice at %v: debt record fits a slice", s.open)
		}
		require.LessOrEqual(t, s.units, s.budget)
	}
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	capa := &fakeCapacity{}
	tests := []struct {
		name    string
		cfg     pacing.Config
		capa    pacing.Capacity
		wantErr string
	}{
		{name: "defaults", cfg: pacing.Config{}, capa: capa},
		{name: "custom", cfg: pacing.Config{Slice: 100 * time.Millisecond, Guard: time.Millisecond, Window: 2 * time.Second}, capa: capa},
		{name: "nil capacity", cfg: pacing.Config{}, wantErr: "nil capacity"},
		{name: "negative slice", cfg: pacing.Config{Slice: -time.Second}, capa: capa, wantErr: "negative duration"},
		{name: "negative guard", cfg: pacing.Config{Guard: -time.Millisecond}, capa: capa, wantErr: "negative duration"},
		{name: "guard not shorter than slice", cfg: pacing.Config{Slice: 10 * time.Millisecond, Guard: 10 * time.Millisecond}, capa: capa, wantErr: "guard 10ms must be shorter than slice 10ms"},
		{name: "window shorter than slice", cfg: pacing.Config{Window: 100 * time.Millisecond}, capa: capa, wantErr: "window 100ms must be at least one slice (200ms)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := pacing.New(tt.cfg, tt.capa)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.Nil(t, p)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, p)
		})
	}
}

func TestNextReturnsCause(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		capa := &fakeCapacity{start: time.Now(), steps: []step{{0, 1000}}}
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		stop := errors.New("shutting down")

		ctx, cancel := context.WithCancelCause(t.Context())
		_, err = p.Next(ctx, 1) // the first slice opens at once
		require.NoError(t, err)
		go func() {
			time.Sleep(50 * time.Millisecond)
			cancel(stop)
		}()
		_, err = p.Next(ctx, 1) // waits for the next slice, cut short
		require.ErrorIs(t, err, stop)
		require.Equal(t, 50*time.Millisecond, time.Since(capa.start))
		_, err = p.Next(ctx, 1) // already done
		require.ErrorIs(t, err, stop)
	})
}

// TestSlicesOpenEverySlice: Next returns every slice, budget 0 included, on
// the fixed schedule; a rate of 0 gives 0, and the slice after one without
// a rate opens 10 ms later, so a lease just gained is used at once.
func TestSlicesOpenEverySlice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate  float64
		every time.Duration
	}{{0, 10 * time.Millisecond}, {1000, slice}} {
		synctest.Test(t, func(t *testing.T) {
			capa := &fakeCapacity{start: time.Now(), steps: []step{{-time.Hour, tc.rate}}}
			p, err := pacing.New(pacing.Config{}, capa)
			require.NoError(t, err)
			// No backlog: nothing is spent, so the account never delays a slice.
			ss := drive{until: 2*time.Second - time.Millisecond}.run(t, p, capa)
			require.Len(t, ss, int(2*time.Second/tc.every))
			for i, s := range ss {
				require.Equal(t, time.Duration(i)*tc.every, s.open)
				require.Equal(t, burst(tc.rate), s.budget)
			}
		})
	}
	synctest.Test(t, func(t *testing.T) {
		capa := &fakeCapacity{start: time.Now(), steps: []step{{0, 0}, {35 * time.Millisecond, 1000}}}
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		ss := drive{until: 500 * time.Millisecond}.run(t, p, capa)
		i := slices.IndexFunc(ss, func(s slc) bool { return s.budget > 0 })
		// The slice at 40 ms sees the lease gained at 35 ms: the first
		// rate after none starts with a full bucket, and the account lets
		// the sends through as the credit since 35 ms allows (see
		// TestHandOver).
		require.Equal(t, 40*time.Millisecond, ss[i].open)
		require.Equal(t, int64(200), ss[i].budget)
	})
}

// TestAccountNeverExceedsCredit: under random rate changes and random record
// costs, the units spent in every window that ends at a spend stay within the
// integral of the rate over it, and no slice exceeds one slice's budget but
// for records admitted on debt.
func TestAccountNeverExceedsCredit(t *testing.T) {
	t.Parallel()
	for seed := range uint64(8) {
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			rates := []float64{0, 200, 500, 1000, 1337.5, 3000}
			capa := &fakeCapacity{start: time.Now()}
			for at := time.Duration(0); at < 30*time.Second; at += time.Duration(rng.Int64N(int64(2 * time.Second))) {
				capa.steps = append(capa.steps, step{at, rates[rng.IntN(len(rates))]})
			}
			costs := func() int64 {
				if rng.IntN(20) == 0 { // more than a slice at every rate but 3000/s, less than a window
					return 100 + rng.Int64N(100)
				}
				return 1 + rng.Int64N(30)
			}
			p, err := pacing.New(pacing.Config{}, capa)
			require.NoError(t, err)
			ss := drive{costs: costs, until: 30 * time.Second}.run(t, p, capa)
			ev := spends(ss)
			requireWithinCredit(t, capa, ev)
			requireSliceBudgets(t, ss)
			sent, credit := float64(total(ev)), capa.credit(0, 30*time.Second)
			require.LessOrEqual(t, sent, credit)
			// The rate changes every second on average, often to or from 0,
			// and a change applies at the next slice; records leave part of
			// a budget unused. Still, most of the credit is used.
			require.Greater(t, sent, 0.7*credit, "utilization")
			var budgets float64
			for _, s := range ss {
				budgets += float64(min(s.budget, burst(s.rate)))
			}
			t.Logf("seed %d: sent %.0f of %.0f credit (%.3f), %.0f budget", seed, sent, credit, sent/credit, budgets)
		})
	}
}

// TestUtilizationAtConstantRate: always backlogged with cost-1 records at a
// constant 1,000 units/s, the pacer uses ≥ 98 % of the credit over 20 s;
// every slice sends at most one slice; and wherever within [send, answer]
// the sink accepts each send, no sink-side 1 s window sees more than 1,000
// units — also when the first answers are 30 ms late (cold connections).
// A worker whose share is a small rate, 100 units/s (a slice of 20 units),
// answered 0.5 ms after each send, uses ≥ 99.5 %: the latency allowance
// makes the bucket's flow a fraction under 20 a slice, and a bucket of one
// slice dropped the fraction a whole-unit budget left, opening slices of
// 19 and 20 in turn (98.5 %).
func TestUtilizationAtConstantRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		rate    float64       // units/s; 0: 1,000
		floor   float64       // utilization; 0: 0.98
		lag     time.Duration // max delay between Next returning and Spend
		latency time.Duration // max delay between Spend and the answer
		answer  time.Duration // the delay between Spend and the answer, if not random
		cold    int           // the first cold answers come 30 ms late
	}{
		{name: "spend and answer at once"},
		{name: "spend within 2ms", lag: 2 * time.Millisecond},
		{name: "answers within 5ms", latency: 5 * time.Millisecond},
		{name: "first answers 30ms late", latency: 2 * time.Millisecond, cold: 5},
		{name: "a small rate, answers 0.5ms late", rate: 100, floor: 0.995, answer: 500 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(7, 7))
				rate := cmp.Or(tt.rate, 1000)
				capa := &fakeCapacity{start: time.Now(), steps: []step{{0, rate}}}
				p, err := pacing.New(pacing.Config{}, capa)
				require.NoError(t, err)
				d := drive{costs: constant(1), until: 20 * time.Second}
				if tt.lag > 0 {
					d.lag = func() time.Duration { return time.Duration(rng.Int64N(int64(tt.lag))) }
				}
				answers := 0
				if tt.answer > 0 {
					d.latency = func() time.Duration { return tt.answer }
				}
				if tt.latency > 0 {
					d.latency = func() time.Duration {
						answers++
						lat := time.Duration(rng.Int64N(int64(tt.latency)))
						if answers <= tt.cold {
							lat += 30 * time.Millisecond
						}
						return lat
					}
				}
				ss := d.run(t, p, capa)
				ev := spends(ss)

				sent, credit := float64(total(ev)), capa.credit(0, 20*time.Second)
				t.Logf("utilization %.4f (%.0f of %.0f)", sent/credit, sent, credit)
				require.GreaterOrEqual(t, sent/credit, cmp.Or(tt.floor, 0.98))
				requireWithinCredit(t, capa, ev)
				requireSliceBudgets(t, ss)
				if tt.lag == 0 && tt.latency == 0 && tt.answer == 0 {
					most, _ := maxWindow(ev, slice)
					require.LessOrEqual(t, most, burst(rate), "units in a 200 ms window")
				}
				for range 20 {
					most, from := maxWindow(accepted(ev, rng), window)
					require.LessOrEqualf(t, most, int64(rate), "sink-side window from %v", from)
				}
				worst := make([]event, len(ev))
				for i, e := range ev {
					worst[i] = event{e.ans, e.ans, e.units} // every send accepted as late as it can be
				}
				most, from := maxWindow(worst, window)
				require.LessOrEqualf(t, most, int64(rate), "sink-side window from %v, accepted at the answers", from)
			})
		})
	}
}

// TestRateChange: a lost lease cuts the next slice's budget; a worker whose
// rate just dropped keeps sending its new rate's full slice with no dip,
// because the account is the integral of the rate, not the current rate; a
// lease gained mid-slice earns credit from that instant.
func TestRateChange(t *testing.T) {
	t.Parallel()
	const change = 5*time.Second + 100*time.Millisecond // mid-slice
	tests := []struct {
		name     string
		from, to float64
	}{
		{name: "lease lost", from: 1000, to: 0},
		{name: "half the leases lost", from: 1000, to: 500},
		{name: "some leases lost", from: 1000, to: 600},
		{name: "lease gained", from: 500, to: 1000},
		{name: "first lease gained", from: 0, to: 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				capa := &fakeCapacity{start: time.Now(), steps: []step{{0, tt.from}, {change, tt.to}}}
				p, err := pacing.New(pacing.Config{}, capa)
				require.NoError(t, err)
				ss := drive{costs: constant(1), until: change + 3*time.Second}.run(t, p, capa)
				requireWithinCredit(t, capa, spends(ss))
				if tt.to == 0 {
					// A send the account can no longer hold waits for a
					// lease; none goes out after the last credit is used.
					for _, e := range spends(ss) {
						require.LessOrEqual(t, e.at, change, "a send after the lease was lost")
					}
					return
				}

				var after []slc
				var before slc // the last slice opened before the change
				for _, s := range ss {
					if s.open > change {
						after = append(after, s)
					} else {
						before = s
					}
				}
				require.NotEmpty(t, after)
				first := after[0]
				require.LessOrEqual(t, first.open-change, slice+guard, "the change applies at the next slice")
				if tt.to < tt.from {
					require.Equal(t, burst(tt.to), first.budget, "the next slice is cut to the new rate")
					for _, s := range after {
						require.Equalf(t, burst(tt.to), s.budget, "slice at %v dips", s.open)
					}
					return
				}
				// Gained: the first slice after the change opens as soon as
				// it is asked for, its bucket what the old flow put in it
				// plus a slice of the gain, so that the sends flow at the
				// new rate from then on (a lease gained mid-slice does not
				// wait a slice more); the account holds them to the
				// credit, which counts from the change, not before (above).
				if tt.from > 0 {
					require.Less(t, first.open, before.open+slice, "opened at once")
					want := tt.from*(first.open-before.open).Seconds() + (tt.to-tt.from)*slice.Seconds()
					require.InDelta(t, want, float64(first.budget), 1, "the old flow's tokens and a slice of the gain")
				} else {
					require.Equal(t, burst(tt.to), first.budget, "a first rate starts with a full bucket")
				}
				for _, s := range after[1:] {
					require.Equalf(t, burst(tt.to), s.budget, "slice at %v", s.open)
				}
			})
		})
	}
}

// TestLargeRecords: a record costing more than a slice is admitted on debt
// only when the account holds it, so even when every record costs 2.5
// slices the sliding window never exceeds the integral; a record costing
// more than a window waits for an empty window, goes alone, and the debt
// silences the worker until repaid.
func TestLargeRecords(t *testing.T) {
	t.Parallel()
	t.Run("records of 2.5 slices", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			capa := &fakeCapacity{start: time.Now(), steps: []step{{0, 1000}}}
			p, err := pacing.New(pacing.Config{}, capa)
			require.NoError(t, err)
			ss := drive{costs: constant(500), until: 20 * time.Second}.run(t, p, capa)
			ev := spends(ss)
			requireWithinCredit(t, capa, ev)
			requireSliceBudgets(t, ss)
			most, _ := maxWindow(ev, window)
			require.Equal(t, int64(1000), most, "the debt rule lets nothing through beyond the integral")
			most, _ = maxWindow(ev, slice-time.Nanosecond)
			require.Equal(t, int64(500), most, "one record per slice")
			sent, credit := float64(total(ev)), capa.credit(0, 20*time.Second)
			t.Logf("utilization %.4f", sent/credit)
			require.Greater(t, sent/credit, 0.9)
		})
	})
	t.Run("record of 1.5 windows", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			// No account at 1,000 units/s can hold 1,500: the record waits,
			// the pacer announces that it needs 1,500 units/s, and once the
			// lease side gathers 2,000 (at 3 s) it goes as soon as the
			// window's integral holds it: at 3.5 s, when the last second
			// was credited 500 + 1,000 (the slice opened at 3.4 s admits
			// it, and Spend sends it the moment the account holds it).
			capa := &gatheringCapacity{fakeCapacity: fakeCapacity{start: time.Now(), steps: []step{{0, 1000}, {3 * time.Second, 2000}}}}
			p, err := pacing.New(pacing.Config{}, capa)
			require.NoError(t, err)
			costs := sequence(slices.Concat(repeat(100, 5), []int64{1500}, repeat(100, 20))...)
			ss := drive{costs: costs, until: 6 * time.Second}.run(t, p, &capa.fakeCapacity)
			ev := spends(ss)
			requireWithinCredit(t, &capa.fakeCapacity, ev)
			i := slices.IndexFunc(ss, func(s slc) bool { return s.units == 1500 })
			require.GreaterOrEqual(t, i, 0, "the large record was sent")
			require.GreaterOrEqual(t, ss[i].at, 3500*time.Millisecond)
			require.Less(t, ss[i].at, 3510*time.Millisecond)
			for _, s := range ss[:i] {
				require.Falsef(t, s.at >= 500*time.Millisecond && s.units > 0, "spend at %v: nothing passes the waiting record", s.at)
			}
			needs := capa.needsUntil(ss[i].at)
			require.Contains(t, needs, 1500.0, "the pacer announced the rate the record needs")
			require.Less(t, capa.lastNeed(), 1500.0, "and the next record's need after it")
		})
	})
	t.Run("no credit yet", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			// The lease was just gained: a record costing a whole window
			// waits until the window is credited at the new rate, not only
			// empty.
			capa := &fakeCapacity{start: time.Now(), steps: []step{{0, 1000}}}
			p, err := pacing.New(pacing.Config{}, capa)
			require.NoError(t, err)
			ss := drive{costs: constant(1000), until: 3 * time.Second}.run(t, p, capa)
			i := slices.IndexFunc(ss, func(s slc) bool { return s.units > 0 })
			require.Equal(t, int64(1000), ss[i].units)
			require.Equal(t, time.Second, ss[i].at, "sent once the whole window is credited")
			requireWithinCredit(t, capa, spends(ss))
		})
	})
}

// gatheringCapacity records the needs its pacer announces.
type gatheringCapacity struct {
	fakeCapacity
	mu    sync.Mutex
	needs []need
}

type need struct {
	at   time.Duration
	rate float64
}

func (c *gatheringCapacity) SetNeed(unitsPerSecond float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.needs = append(c.needs, need{time.Since(c.start), unitsPerSecond})
}

func (c *gatheringCapacity) needsUntil(at time.Duration) []float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []float64
	for _, n := range c.needs {
		if n.at <= at {
			out = append(out, n.rate)
		}
	}
	return out
}

func (c *gatheringCapacity) lastNeed() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.needs[len(c.needs)-1].rate
}

// TestHandOver: pool of 1,000 units/s in 10 partitions of 100. Pacer A loses
// a partition at e (stops counting it), pacer B gains it δ later. The union
// of their spends never exceeds 1,000 in any sliding 1 s window, whatever
// the phase between their slices and the latency between Next and Spend.
func TestHandOver(t *testing.T) {
	t.Parallel()
	const e = 3*time.Second + 110*time.Millisecond
	for _, delta := range []time.Duration{0, time.Millisecond, 50 * time.Millisecond} {
		for _, phase := range []time.Duration{0, 37 * time.Millisecond, 100 * time.Millisecond, 163 * time.Millisecond} {
			for _, cost := range []int64{1, 7} {
				for _, lag := range []time.Duration{0, 2 * time.Millisecond} {
					synctest.Test(t, func(t *testing.T) {
						start := time.Now()
						capA := &fakeCapacity{start: start, steps: []step{{0, 1000}, {e, 900}}}
						capB := &fakeCapacity{start: start, steps: []step{{e + delta, 100}}}
						a, err := pacing.New(pacing.Config{}, capA)
						require.NoError(t, err)
						b, err := pacing.New(pacing.Config{}, capB)
						require.NoError(t, err)
						dA := drive{costs: constant(cost), until: 8 * time.Second}
						dB := drive{costs: constant(cost), offset: phase, until: 8 * time.Second}
						if lag > 0 {
							rngA, rngB := rand.New(rand.NewPCG(1, 2)), rand.New(rand.NewPCG(3, 4))
							dA.lag = func() time.Duration { return time.Duration(rngA.Int64N(int64(lag))) }
							dB.lag = func() time.Duration { return time.Duration(rngB.Int64N(int64(lag))) }
						}
						var ssA, ssB []slc
						var wg sync.WaitGroup
						wg.Go(func() { ssA = dA.run(t, a, capA) })
						wg.Go(func() { ssB = dB.run(t, b, capB) })
						wg.Wait()

						evB := spends(ssB)
						require.NotEmpty(t, evB)
						require.Greater(t, evB[0].at, e+delta)
						union := slices.Concat(spends(ssA), evB)
						most, from := maxWindow(union, window)
						require.LessOrEqualf(t, most, int64(1000), "δ %v, phase %v, cost %d, lag %v: window from %v", delta, phase, cost, lag, from)
						mostAround, _ := maxWindow(slices.DeleteFunc(union, func(ev event) bool { return ev.at < e-window || ev.at > e+2*window }), window)
						require.GreaterOrEqual(t, mostAround, int64(900), "the pool stays in use across the hand-over")
					})
				}
			}
		}
	}
}

// TestSpendConcurrent: Spend may run while Next waits, and what it records
// counts: a whole window's credit spent concurrently leaves nothing for the
// following slices.
func TestSpendConcurrent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		capa := &fakeCapacity{start: time.Now(), steps: []step{{-time.Hour, 1000}}}
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		b, err := p.Next(t.Context(), 1)
		require.NoError(t, err)
		require.Equal(t, int64(200), b)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 10 {
					sent, err := p.Spend(t.Context(), 25)
					require.NoError(t, err)
					sent.Answered()
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
		for range 4 {
			b, err := p.Next(t.Context(), 1)
			require.NoError(t, err)
			require.Zero(t, b)
		}
		wg.Wait()
	})
}

func TestThrottleFeedbackCutsAndRecovers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		capa := &fakeCapacity{start: time.Now(), steps: []step{{-2 * time.Second, 1000}}} // leased long before
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		next := func() int64 {
			t.Helper()
			b, err := p.Next(ctx, 0)
			require.NoError(t, err)
			sent, err := p.Spend(ctx, b)
			require.NoError(t, err)
			sent.Answered()
			return b
		}
		require.EqualValues(t, 200, next(), "a full slice at the leased rate")

		// Two throttled writes in one slice cost one cut.
		p.Throttled()
		p.Throttled()
		b := next()
		require.LessOrEqual(t, b, int64(140), "×0.7 of 1,000/s over one slice")
		require.Positive(t, b)
		require.EqualValues(t, 1, p.Stats().Cuts)
		require.InDelta(t, 700, p.Stats().Ceiling, 1e-9)

		// A second throttled slice cuts again, from the ceiling.
		p.Throttled()
		next()
		require.InDelta(t, 490, p.Stats().Ceiling, 1e-9)

		// Additive recovery: +10 % of the leased rate per second, i.e.
		// +20 units/s per 200 ms slice, from 490 to 1,000 in 26 slices.
		slices := 0
		for p.Stats().Ceiling > 0 {
			before := p.Stats().Ceiling
			next()
			if c := p.Stats().Ceiling; c > 0 {
				require.InDelta(t, before+20, c, 1e-9)
			}
			slices++
			require.Less(t, slices, 100, "the ceiling never lifts")
		}
		require.Equal(t, 26, slices)
		st := p.Stats()
		require.Equal(t, [3]float64{2, 1, 0}, [3]float64{float64(st.Cuts), float64(st.Recoveries), st.Ceiling})
		require.Equal(t, st.Budget, st.Spent, "every budget spent")
		next()
		require.EqualValues(t, 200, next(), "back to full slices at the leased rate")
	})
}

func TestFeedbackConfigIsValidated(t *testing.T) {
	t.Parallel()
	capa := &fakeCapacity{}
	for _, cfg := range []pacing.Config{{Cut: 1}, {Cut: -0.5}, {Recovery: -1}, {Recovery: math.Inf(1)}} {
		_, err := pacing.New(cfg, capa)
		require.Error(t, err, "%+v", cfg)
	}
}

// A send that waits for room while the worker's leases go (its rate falls
// to 0) gives up a slice later with ingest.ErrNoRate instead of waiting
// for a rate that only the caller's next demand can bring back; while a
// rate is held, it waits for room as long as it takes.
func TestSpendGivesUpAfterASliceWithoutARate(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		capa := &fakeCapacity{start: start, steps: []step{{0, 1000}, {time.Second, 0}}}
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		time.Sleep(time.Second - slice)
		_, err = p.Spend(t.Context(), 800) // the credit of the second so far
		require.NoError(t, err)

		_, err = p.Spend(t.Context(), 100) // waits until 0.9 s, when the rate held has earned it
		require.NoError(t, err)
		time.Sleep(time.Second + slice - time.Since(start)) // past the rate's end
		began := time.Now()
		_, err = p.Spend(t.Context(), 100)
		require.ErrorIs(t, err, ingest.ErrNoRate)
		waited := time.Since(began)
		require.GreaterOrEqual(t, waited, slice, "waited a slice")
		require.Less(t, waited, 2*slice)
	})
}
