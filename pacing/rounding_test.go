package pacing

import (
	"context"
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

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// A rate whose slice is not a whole number of units (2000/3 units/s: 133.3
// per slice) must not lose a slice to rounding when an old spend is about
// to leave the account: once full slices flow, every slice gets one.
func TestFractionalSliceNeverSkipsASlice(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := stepCapacity{on: time.Now().Add(330 * time.Millisecond), r: 2000.0 / 3}
		p, err := New(Config{Guard: 20 * time.Millisecond}, c)
		require.NoError(t, err)
		flowing := false
		for range 40 {
			b, err := p.Next(context.Background(), 1)
			require.NoError(t, err)
			if flowing {
				require.GreaterOrEqual(t, b, int64(132), "a slice was skipped at %v", time.Since(c.on))
			}
			flowing = flowing || b >= 132
			p.Spend(b)
		}
		require.True(t, flowing)
	})
}
