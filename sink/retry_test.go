package sink

import (
	"math"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPolicyBackoffBoundsPerAttempt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		policy Policy
	}{
		{"defaults", Policy{}},
		{"min and small max", Policy{Base: 50 * time.Millisecond, Min: 20 * time.Millisecond, Max: time.Second, MaxAttempts: 12}},
		{"min above max", Policy{Base: 10 * time.Millisecond, Min: 2 * time.Second, Max: time.Second, MaxAttempts: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := tt.policy
			rng := rand.New(rand.NewPCG(1, 2))
			p.Rand = rng.Float64
			d := p.withDefaults()
			for x := 1; x < d.MaxAttempts; x++ {
				factor := math.Ldexp(1, x) - 1
				lo := min(time.Duration(float64(d.Min)+0.8*float64(d.Base)*factor), d.Max)
				hi := min(time.Duration(float64(d.Min)+1.2*float64(d.Base)*factor), d.Max)
				seenLo, seenHi := time.Duration(math.MaxInt64), time.Duration(0)
				for range 2000 {
					wait, ok := p.Backoff(x, 0)
					require.True(t, ok, "attempt %d", x)
					require.GreaterOrEqual(t, wait, lo, "attempt %d", x)
					require.LessOrEqual(t, wait, hi, "attempt %d", x)
					seenLo, seenHi = min(seenLo, wait), max(seenHi, wait)
				}
				// The jitter really spans its range (within 2 % at each end).
				if lo < hi {
					require.Less(t, float64(seenLo-lo), 0.02*float64(hi-lo), "attempt %d", x)
					require.Less(t, float64(hi-seenHi), 0.02*float64(hi-lo), "attempt %d", x)
				}
			}
			_, ok := p.Backoff(d.MaxAttempts, 0)
			require.False(t, ok, "no attempt after MaxAttempts")
		})
	}
}

func TestPolicyBackoffTable(t *testing.T) {
	t.Parallel()
	mid := func() float64 { return 0.5 } // jitter factor exactly 1.0
	tests := []struct {
		name       string
		policy     Policy
		attempt    int
		retryAfter time.Duration
		want       time.Duration
		wantOK     bool
	}{
		{"first retry", Policy{Rand: mid}, 1, 0, 100 * time.Millisecond, true},
		{"attempt 0 counts as 1", Policy{Rand: mid}, 0, 0, 100 * time.Millisecond, true},
		{"third retry", Policy{Rand: mid}, 3, 0, 700 * time.Millisecond, true},
		{"capped at max", Policy{Rand: mid}, 6, 0, 5 * time.Second, true},
		{"lowest jitter", Policy{Rand: func() float64 { return 0 }}, 2, 0, 240 * time.Millisecond, true},
		{"min added", Policy{Rand: mid, Min: 50 * time.Millisecond}, 1, 0, 150 * time.Millisecond, true},
		{"last attempt", Policy{Rand: mid}, 8, 0, 0, false},
		{"custom attempts", Policy{Rand: mid, MaxAttempts: 2}, 2, 0, 0, false},
		{"retry-after longer wins", Policy{Rand: mid}, 1, 2 * time.Second, 2 * time.Second, true},
		{"retry-after shorter ignored", Policy{Rand: mid}, 3, 100 * time.Millisecond, 700 * time.Millisecond, true},
		{"retry-after capped", Policy{Rand: mid}, 1, time.Hour, 30 * time.Second, true},
		{"retry-after custom cap", Policy{Rand: mid, MaxRetryAfter: 3 * time.Second}, 1, time.Hour, 3 * time.Second, true},
		{"huge attempt saturates", Policy{Rand: mid, MaxAttempts: math.MaxInt}, 5000, 0, 5 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := tt.policy.Backoff(tt.attempt, tt.retryAfter)
			require.Equal(t, tt.wantOK, ok)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestRetryableStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code int
		want bool
	}{
		{http.StatusRequestTimeout, true},
		{http.StatusTooManyRequests, true},
		{http.StatusInternalServerError, true},
		{http.StatusBadGateway, true},
		{http.StatusServiceUnavailable, true},
		{http.StatusGatewayTimeout, true},
		{507, true},
		{599, true},
		{http.StatusNotImplemented, false},
		{http.StatusHTTPVersionNotSupported, false},
		{http.StatusBadRequest, false},
		{http.StatusUnauthorized, false},
		{http.StatusForbidden, false},
		{http.StatusNotFound, false},
		{http.StatusConflict, false},
		{http.StatusRequestEntityTooLarge, false},
		{499, false},
		{http.StatusOK, false},
		{http.StatusCreated, false},
		{http.StatusMultiStatus, false},
		{http.StatusFound, false},
		{0, false},
		{600, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, RetryableStatus(tt.code), "status %d", tt.code)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 5, 14, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"0", 0, true},
		{"1", time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"Wed, 14 May 2025 12:00:30 GMT", 30 * time.Second, true},       // IMF-fixdate
		{"Wednesday, 14-May-25 12:01:00 GMT", time.Minute, true},        // RFC 850
		{"Wed May 14 12:00:05 2025", 5 * time.Second, true},             // ANSI C asctime
		{"Wed, 14 May 2025 11:00:00 GMT", 0, true},                      // in the past
		{"99999999999999999999999", time.Duration(math.MaxInt64), true}, // saturates
		{"9223372036854775807", time.Duration(math.MaxInt64), true},     // saturates
		{"", 0, false},
		{"  ", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"5s", 0, false},
		{"soon", 0, false},
		{"Wed, 14 May 2025 25:00:00 GMT", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseRetryAfter(tt.in, now)
		require.Equal(t, tt.wantOK, ok, "%q", tt.in)
		require.Equal(t, tt.want, got, "%q", tt.in)
	}
}
