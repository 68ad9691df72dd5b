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
// Releasable says yes; but its one-second account alone would still let
// it send the 1,000 units of credit it earned before the release, and the
// peer's sends would share that window. The pacer holds it to what keeps
// every coming window within its new rate and the freed rate over the
// grace, on which nobody earns: over the second after the release it
// sends 200 units when the manager unlocks at once (grace 0), 360 when
// it unlocks a slice later (200 + 800 × 0.2), not 1,000.
func TestReleaseHoldsLaterSends(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		grace time.Duration
		most  int64 // units sent over the second after the release
	}{
		{0, 200},
		{slice, 360},
	} {
		t.Run(tc.grace.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				capa := &fakeCapacity{start: start, steps: []step{{-time.Hour, 1000}, {time.Second, 200}}}
				p, err := pacing.New(pacing.Config{}, capa)
				require.NoError(t, err)
				time.Sleep(time.Second - time.Nanosecond)
				require.True(t, p.Releasable(time.Now(), 200, tc.grace), "nothing in the account")
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
				t.Logf("grace %v: %d units sent over the second after the release", tc.grace, sent)
				require.LessOrEqual(t, sent, tc.most)
				require.Greater(t, sent, tc.most-20, "held beyond what the peer earns")
			})
		})
	}
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

// A lease manager asks twice before it gives capacity back: with a grace
// of a slice (how many leases it may release), then with none (whether it
// may unlock them at once). A worker that sent each slice's budget as the
// slice opened leans on the credit of the slice to come, so the second
// answer is no, although the first was yes: the grace of the first is
// credit nobody earns only if the manager waits it out, and the second
// answer must not count it (it once did, and a peer took the partitions
// at once: a strict sink throttled the pair in
// TestHandOverAwaitsAStalledWorkersAnswers).
func TestReleasableAskedAgainWithoutGrace(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		capa := &fakeCapacity{start: time.Now(), steps: []step{{-time.Hour, 1000}}}
		p, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		for i := range 6 {
			if i > 0 {
				time.Sleep(slice)
			}
			s, err := p.Spend(t.Context(), 200)
			require.NoError(t, err)
			s.Answered()
		}
		now := time.Now()
		require.True(t, p.Releasable(now, 0, slice), "unlocked a slice later, the last lump stays within the credit")
		require.False(t, p.Releasable(now, 0, 0), "unlocked at once, a peer would earn beside the last lump")
		require.True(t, p.Releasable(now, 0, slice), "the first yes still stands")
	})
}
