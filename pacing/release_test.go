package pacing_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pacing"
)

// A worker idle for a second at 1,000 units/s gives 800 of them back, and
// a peer earns on them from the unlock on. Its account is empty, so
// Releasable says yes, with no grace; but its one-second account alone
// would still let it send the 1,000 units of credit it earned before the
// release, and the peer's sends would share that window. The pacer holds
// it to what keeps every coming window within its new rate: over the
// second after the release it sends 200 units, not 1,000.
func TestReleaseHoldsLaterSends(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		capa := &fakeCapacity{start: start, steps: []step{{-time.Hour, 1000}, {time.Second, 200}}}
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		time.Sleep(time.Second - time.Nanosecond)
		grace, ok := p.Releasable(time.Now(), 200, slice)
		require.True(t, ok, "nothing in the account")
		require.Zero(t, grace, "nothing leans on the coming slice")
		time.Sleep(time.Nanosecond) // the rate drops
		released := time.Now()
		var sent int64
		for time.Since(released) < time.Second {
			s, err := p.Spend(t.Context(), 10)
			require.NoError(t, err)
			s.Answered()
			if s.At.Sub(released) < time.Second {
				sent += 10
			}
		}
		t.Logf("%d units sent over the second after the release", sent)
		require.LessOrEqual(t, sent, int64(200))
		require.Greater(t, sent, int64(180), "held beyond what the peer earns")
	})
}

// Answered says whether the sends made before an instant have had their
// answers: a lease manager unlocks a released lease only then, since the
// sink may accept a request up to its answer.
func TestAnswered(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		capa := &fakeCapacity{start: time.Now(), steps: []step{{-time.Hour, 1000}}}
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		before := time.Now()
		s, err := p.Spend(t.Context(), 10)
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
		require.True(t, p.Answered(before), "no send before it")
		require.False(t, p.Answered(time.Now()), "a send in flight")
		s.Answered()
		require.True(t, p.Answered(time.Now()))
	})
}

// Releasable returns the least grace that keeps a worker's sends within
// its credit: none for sends spread at the rate they were earned at; up to
// a slice for a worker that sent each slice's budget as the slice opened,
// whose last lump leans on the credit of the slice to come (a peer earning
// on the partitions at once would share that lump's windows: a strict
// sink throttled such a pair in TestHandOverAwaitsAStalledWorkersAnswers
// while the lease manager unlocked at once). A grace longer than the
// manager allows is a no, and pins nothing.
func TestReleasableGivesTheLeastGrace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		sends, each int64 // per slice: sends of each units, spread evenly over it
		least, most time.Duration
	}{
		{"spread sends", 20, 10, 0, slice / 20}, // the last send leans on its own 10 ms
		{"a lump as each slice opens", 1, 200, slice - 2*time.Millisecond, slice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				capa := &fakeCapacity{start: time.Now(), steps: []step{{-time.Hour, 1000}}}
				p, err := pacing.New(pacing.Config{}, capa)
				require.NoError(t, err)
				for i := range 6 * tc.sends {
					if i > 0 {
						time.Sleep(slice / time.Duration(tc.sends))
					}
					s, err := p.Spend(t.Context(), tc.each)
					require.NoError(t, err)
					s.Answered()
				}
				now := time.Now()
				if tc.least > 0 {
					_, ok := p.Releasable(now, 0, tc.least-time.Millisecond)
					require.False(t, ok, "a grace shorter than the last lump needs")
				}
				grace, ok := p.Releasable(now, 0, slice)
				require.True(t, ok)
				t.Logf("grace %v", grace)
				require.GreaterOrEqual(t, grace, tc.least)
				require.LessOrEqual(t, grace, tc.most)
			})
		})
	}
}

// A worker whose last leases went unlocks them with a hand-over: HandOver
// gives the least instant from which a peer may count the capacity, the
// peer that counts it from there sends at once what the giver's account
// left, and the giver, given a rate again at once, spends none of what it
// handed over. A worker of 500 units/s sends 250 units at 0 (answered at
// 5 ms) and stops counting at 800 ms: the 250 units need the credit of
// [5 ms, 505 ms), so the peer may count from 505 ms.
func TestHandOverLeavesThePeerTheCreditLeft(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		start := time.Now()
		const stop = 800 * time.Millisecond
		capA := &fakeCapacity{start: start, steps: []step{{-time.Hour, 500}, {stop, 0}, {stop + 20*time.Millisecond, 500}}}
		a, err := pacing.New(pacing.Config{}, capA)
		require.NoError(t, err)
		_, err = a.Next(ctx, 0)
		require.NoError(t, err)
		sent, err := a.Spend(ctx, 250)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
		sent.Answered()

		time.Sleep(time.Until(start.Add(stop + 10*time.Millisecond)))
		now := time.Now()
		_, ok := a.HandOver(now, start.Add(stop), 0)
		require.False(t, ok, "nothing freed")
		since, ok := a.HandOver(now, start.Add(stop), 500)
		require.True(t, ok)
		require.False(t, since.Before(start.Add(505*time.Millisecond)), "since %v", since.Sub(start))
		require.WithinDuration(t, start.Add(505*time.Millisecond), since, time.Millisecond)
		_, ok = a.HandOver(now, start.Add(stop), 500)
		require.False(t, ok, "an earlier hand-over is less than a Window old")

		// The peer counts the capacity from since: what the giver left
		// (500 units/s over [since, now), 152 units) goes at once.
		capB := &fakeCapacity{start: start, steps: []step{{since.Sub(start), 500}}}
		b, err := pacing.New(pacing.Config{}, capB)
		require.NoError(t, err)
		_, err = b.Next(ctx, 0)
		require.NoError(t, err)
		left := int64(500 * now.Sub(since).Seconds())
		require.InDelta(t, 152, left, 1)
		sentB, err := b.Spend(ctx, left)
		require.NoError(t, err)
		require.Equal(t, now, sentB.At, "sent at once")

		// The giver's rate is back at 820 ms: a send beside its 250 units
		// would lean on the credit of [since, stop), so it waits until the
		// 250 units leave its account (a second after their answer), where
		// the plain account had room for 240 units at once.
		time.Sleep(time.Until(start.Add(stop + 20*time.Millisecond)))
		_, err = a.Next(ctx, 0)
		require.NoError(t, err)
		again, err := a.Spend(ctx, 100)
		require.NoError(t, err)
		require.False(t, again.At.Before(start.Add(time.Second)), "the giver sent at %v", again.At.Sub(start))
		again.Answered()
		sentB.Answered()
	})
}

// HandOver says no while the worker still has a rate, and when its
// account leans on more than it earned before it stopped counting (a
// record sent on credit the coming slice was to earn).
func TestHandOverRefusals(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		start := time.Now()
		capa := &fakeCapacity{start: start, steps: []step{{-time.Hour, 500}, {100 * time.Millisecond, 0}}}
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		_, ok := p.HandOver(time.Now(), time.Now(), 500)
		require.False(t, ok, "the worker still has its rate")
		_, err = p.Next(ctx, 0)
		require.NoError(t, err)
		sent, err := p.Spend(ctx, 500) // the whole second's credit
		require.NoError(t, err)
		sent.Answered()
		time.Sleep(time.Until(start.Add(100 * time.Millisecond)))
		// Stopped at 100 ms: the 500 units sent at 0 need the credit up to
		// 1 s, which it no longer earns.
		_, ok = p.HandOver(time.Now(), start.Add(100*time.Millisecond), 500)
		require.False(t, ok, "its send leans on credit it stopped earning")
	})
}
