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
