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
