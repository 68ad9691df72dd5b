package pacing

import (
	"context"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// stepCapacity has rate 0 until on, then r.
type stepCapacity struct {
	on time.Time
	r  float64
}

func (c stepCapacity) Rate(now time.Time) float64 {
	if now.Before(c.on) {
		return 0
	}
	return c.r
}

func (c stepCapacity) Credit(from, to time.Time) float64 {
	from = maxTime(from, c.on)
	if !to.After(from) {
		return 0
	}
	return to.Sub(from).Seconds() * c.r
}

// A rate whose slice is not a whole number of units (2000/3 units/s: 133.3
// per slice) must not lose a slice to rounding when an old spend is about
// to leave the account: once full slices flow, every slice gets one
// (within rounding). With jitter, as in a real worker, records are
// collected for a few milliseconds between a slice's opening and its
// Spend, so the oldest spend can still be in the account when a slice
// opens; the budget counts on it leaving by the end of the slice, and
// Spend waits the millisecond it takes.
func TestFractionalSliceNeverSkipsASlice(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		slices  int
		jitter  time.Duration // most delay between Next and Spend
		atLeast int64         // smallest budget once full slices flow
	}{
		{"exact", 40, 0, 132},
		{"jittered", 400, 4 * time.Millisecond, 125},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				c := stepCapacity{on: time.Now().Add(330 * time.Millisecond), r: 2000.0 / 3}
				p, err := New(Config{}, c)
				require.NoError(t, err)
				rng := rand.New(rand.NewPCG(1, 2))
				flowing := false
				for range tt.slices {
					b, err := p.Next(context.Background(), 1)
					require.NoError(t, err)
					if flowing {
						require.GreaterOrEqual(t, b, tt.atLeast, "a slice was skipped at %v", time.Since(c.on))
					}
					flowing = flowing || b >= 132
					if tt.jitter > 0 {
						time.Sleep(time.Duration(rng.Int64N(int64(tt.jitter))))
					}
					sent, err := p.Spend(context.Background(), b)
					require.NoError(t, err)
					sent.Answered()
				}
				require.True(t, flowing)
			})
		})
	}
}
