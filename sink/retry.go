package sink

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Default retry parameters, sized for 200 ms slices: the first retry comes
// about half a slice later, the fifth about 3 s later, and no wait is longer
// than 5 s, so a record gives up after roughly 14 s of backoff in total.
const (
	DefaultBase          = 100 * time.Millisecond
	DefaultMin           = 0
	DefaultMax           = 5 * time.Second
	DefaultMaxAttempts   = 8
	DefaultMaxRetryAfter = ingest.DefaultMaxRetryAfter
)

// Policy is exponential backoff with jitter, the formula of the cloud storage
// vendors' retry guidance (Google Cloud Storage "retry strategy", Azure
// Storage "retry policy"): after failed attempt x (1-based),
//
//	y    = rand(0.8·Base, 1.2·Base) · (2^x − 1)
//	wait = min(Min + y, Max)
//
// and a server-suggested Retry-After is honoured:
//
//	wait = max(wait, min(retryAfter, MaxRetryAfter))
//
// With the defaults (Base 100 ms, Min 0, Max 5 s) the waits after attempts
// 1..6 lie in [80, 120] ms, [240, 360] ms, [0.56, 0.84] s, [1.2, 1.8] s,
// [2.48, 3.72] s and 5 s.
//
// The zero Policy is ready to use: every zero (or negative) field takes its
// default. Policy implements ingest.RetryPolicy with a value receiver, so it
// is safe for concurrent use as long as Rand is.
type Policy struct {
	// Base is z, the jitter centre of the first retry. Default 100 ms.
	Base time.Duration
	// Min is zmin, added to every wait. Default 0 (negative counts as 0).
	Min time.Duration
	// Max is zmax, the longest formula wait. Default 5 s.
	Max time.Duration
	// MaxAttempts is the number of attempts per record, the first one
	// included; Backoff reports ok = false once attempt ≥ MaxAttempts.
	// Default 8.
	MaxAttempts int
	// MaxRetryAfter caps how long a server's Retry-After can make the
	// policy wait. Default 30 s.
	MaxRetryAfter time.Duration
	// Rand returns uniform numbers in [0, 1) for the jitter. Default
	// math/rand/v2's Float64 (safe for concurrent use); tests inject a
	// seeded source.
	Rand func() float64
}

var _ ingest.RetryPolicy = Policy{}

// Backoff implements ingest.RetryPolicy: the wait before attempt+1 after
// attempt (1-based; values < 1 count as 1) failed with a retryable result
// whose server-suggested wait is retryAfter (0 when none). ok is false when
// attempt was the last one allowed by MaxAttempts.
func (p Policy) Backoff(attempt int, retryAfter time.Duration) (wait time.Duration, ok bool) {
	p = p.withDefaults()
	attempt = max(attempt, 1)
	if attempt >= p.MaxAttempts {
		return 0, false
	}
	wait = p.formula(attempt)
	if retryAfter > 0 {
		wait = max(wait, min(retryAfter, p.MaxRetryAfter))
	}
	return wait, true
}

// Pause implements ingest.RetryPolicy: the wait after failures (values < 1
// count as 1) consecutive failures of whole requests, by the same formula as
// Backoff but without a limit on their number, so a sink outage is probed
// every Max (5 s by default) for as long as it lasts; retryAfter is honoured
// up to MaxRetryAfter.
func (p Policy) Pause(failures int, retryAfter time.Duration) time.Duration {
	p = p.withDefaults()
	wait := p.formula(min(max(failures, 1), 62))
	if retryAfter > 0 {
		wait = max(wait, min(retryAfter, p.MaxRetryAfter))
	}
	return wait
}

// formula is min(zmin + rand(0.8z, 1.2z)·(2^x − 1), zmax), computed in
// float64 nanoseconds so that large x saturates at zmax instead of
// overflowing.
func (p Policy) formula(x int) time.Duration {
	jitter := 0.8 + 0.4*p.Rand()
	y := jitter * float64(p.Base) * (math.Ldexp(1, x) - 1)
	w := float64(p.Min) + y
	if w >= float64(p.Max) {
		return p.Max
	}
	return time.Duration(w)
}

func (p Policy) withDefaults() Policy {
	if p.Base <= 0 {
		p.Base = DefaultBase
	}
	p.Min = max(p.Min, 0)
	if p.Max <= 0 {
		p.Max = DefaultMax
	}
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.MaxRetryAfter <= 0 {
		p.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if p.Rand == nil {
		p.Rand = rand.Float64
	}
	return p
}

// RetryableStatus reports whether an HTTP status is worth retrying, per the
// cloud storage vendors' guidance (Google Cloud Storage, Azure Storage): 408
// Request Timeout, 429 Too Many Requests and every 5xx except 501 Not
// Implemented and 505 HTTP Version Not Supported. Every other status — other
// 4xx, and 1xx–3xx, which are not failures — is not retryable.
func RetryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests:
		return true
	case http.StatusNotImplemented, http.StatusHTTPVersionNotSupported:
		return false
	}
	return code >= 500 && code <= 599
}

// ParseRetryAfter parses a Retry-After header value (RFC 9110 §10.2.3):
// either delta-seconds (a non-negative integer) or an HTTP-date, which is
// turned into the wait from now (0 if the date has passed). ok is false for
// an empty or malformed value. Huge delta-seconds saturate at the largest
// time.Duration.
func ParseRetryAfter(v string, now time.Time) (wait time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return math.MaxInt64, true
			}
			return 0, false
		}
		if secs > uint64(math.MaxInt64/int64(time.Second)) {
			return math.MaxInt64, true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}
