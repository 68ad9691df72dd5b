package sink

import (
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func TestParseRateLimit(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name   string
		header http.Header
		want   rateLimit
		ok     bool
	}{
		{"IETF combined, structured", http.Header{"Ratelimit": {`"default";r=50;t=30`}, "Ratelimit-Policy": {`"default";q=100;w=60`}},
			rateLimit{limit: 100, remaining: 50, reset: 30 * time.Second}, true},
		{"IETF combined, dictionary", http.Header{"Ratelimit": {`limit=10, remaining=0, reset=7`}},
			rateLimit{limit: 10, remaining: 0, reset: 7 * time.Second}, true},
		{"IETF combined, policy of the older draft", http.Header{"Ratelimit": {`remaining=3, reset=1.5`}, "Ratelimit-Policy": {`10;w=1`}},
			rateLimit{limit: 10, remaining: 3, reset: 1500 * time.Millisecond}, true},
		{"IETF separate fields", http.Header{"Ratelimit-Limit": {"100, 100;w=60"}, "Ratelimit-Remaining": {"42"}, "Ratelimit-Reset": {"12"}},
			rateLimit{limit: 100, remaining: 42, reset: 12 * time.Second}, true},
		{"X- with delta seconds", http.Header{"X-Ratelimit-Limit": {"60"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"20"}},
			rateLimit{limit: 60, remaining: 0, reset: 20 * time.Second}, true},
		{"X- with a Unix time (GitHub)", http.Header{"X-Ratelimit-Limit": {"5000"}, "X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {strconv.FormatInt(now.Add(90*time.Second).Unix(), 10)}},
			rateLimit{limit: 5000, remaining: 1, reset: 90 * time.Second}, true},
		{"X- with Unix milliseconds", http.Header{"X-Ratelimit-Remaining": {"5"}, "X-Ratelimit-Reset": {strconv.FormatInt(now.Add(2500*time.Millisecond).UnixMilli(), 10)}},
			rateLimit{limit: -1, remaining: 5, reset: 2500 * time.Millisecond}, true},
		{"X- reset in the past", http.Header{"X-Ratelimit-Remaining": {"5"}, "X-Ratelimit-Reset": {strconv.FormatInt(now.Add(-time.Minute).Unix(), 10)}},
			rateLimit{limit: -1, remaining: 5, reset: 0}, true},
		{"no reset", http.Header{"X-Ratelimit-Remaining": {"5"}, "X-Ratelimit-Reset": {"soon"}},
			rateLimit{limit: -1, remaining: 5, reset: -1}, true},
		{"a combined field without remaining falls back", http.Header{"Ratelimit": {`"default";t=3`}, "X-Ratelimit-Remaining": {"9"}},
			rateLimit{limit: -1, remaining: 9, reset: -1}, true},
		{"none", http.Header{"Retry-After": {"3"}}, rateLimit{limit: -1, remaining: -1, reset: -1}, false},
		{"garbage", http.Header{"X-Ratelimit-Remaining": {"many"}}, rateLimit{limit: -1, remaining: -1, reset: -1}, false},
	} {
		got, ok := parseRateLimit(tt.header, now)
		require.Equal(t, tt.ok, ok, tt.name)
		require.Equal(t, tt.want, got, tt.name)
	}
}

func TestNearLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		rl   rateLimit
		rate float64 // the sink's own requests/s
		near bool
	}{
		// 100 left for 1 s at 100/s: exactly what a worker alone at the
		// API's limit ends its window with. Not near.
		{rateLimit{limit: 1000, remaining: 100, reset: time.Second}, 100, false},
		// 100 left for 2.5 s at 100/s: another client used a share.
		{rateLimit{limit: 1000, remaining: 100, reset: 2500 * time.Millisecond}, 100, true},
		// Within the margin (10 % of the limit).
		{rateLimit{limit: 1000, remaining: 100, reset: 1900 * time.Millisecond}, 100, false},
		{rateLimit{limit: 1000, remaining: 0, reset: 10 * time.Millisecond}, 100, false},
		{rateLimit{limit: 1000, remaining: 0, reset: 2 * time.Second}, 100, true},
		{rateLimit{limit: -1, remaining: 50, reset: time.Second}, 100, true},
		{rateLimit{limit: -1, remaining: 95, reset: time.Second}, 100, false},
		// No reset: 10 % of the limit or less is near; without a limit, 0.
		{rateLimit{limit: 100, remaining: 10, reset: -1}, 50, true},
		{rateLimit{limit: 100, remaining: 11, reset: -1}, 50, false},
		{rateLimit{limit: -1, remaining: 0, reset: -1}, 50, true},
		{rateLimit{limit: -1, remaining: 1, reset: -1}, 50, false},
		{rateLimit{limit: -1, remaining: -1, reset: time.Hour}, 50, false},
	} {
		require.Equal(t, tt.near, tt.rl.nearLimit(tt.rate), "%+v at %v/s", tt.rl, tt.rate)
	}
}

// Throttle signals as real APIs send them: 429 and 503 with Retry-After in
// seconds or as an HTTP date; 403 or 429 with a remaining count of 0 and
// only a reset time (GitHub's primary rate limit); and rate-limit headers
// on successes that slow the worker before it is throttled.
func TestRESTSinkThrottleSignals(t *testing.T) {
	t.Parallel()
	// Dates and Unix times are made when the API answers: whole seconds, so
	// a wait lies within a second below the one meant.
	in := func(d time.Duration) time.Time { return time.Now().Add(d) }
	for _, tt := range []struct {
		name       string
		status     int
		header     func() http.Header
		throttled  bool
		retryAfter [2]time.Duration // bounds
	}{
		{"429 Retry-After seconds", 429, func() http.Header { return http.Header{"Retry-After": {"7"}} }, true, [2]time.Duration{7 * time.Second, 7 * time.Second}},
		{"429 Retry-After date", 429, func() http.Header {
			return http.Header{"Retry-After": {in(10 * time.Second).UTC().Format(http.TimeFormat)}}
		},
			true, [2]time.Duration{8 * time.Second, 10 * time.Second}},
		{"429 without a wait", 429, func() http.Header { return nil }, true, [2]time.Duration{0, 0}},
		{"503 Retry-After", 503, func() http.Header { return http.Header{"Retry-After": {"2"}} }, true, [2]time.Duration{2 * time.Second, 2 * time.Second}},
		{"503 without Retry-After is an outage, not throttling", 503, func() http.Header { return nil }, false, [2]time.Duration{0, 0}},
		{"403 with nothing remaining (GitHub)", 403, func() http.Header {
			return http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {strconv.FormatInt(in(20*time.Second).Unix(), 10)}}
		}, true, [2]time.Duration{18 * time.Second, 20 * time.Second}},
		{"429 with the IETF field", 429, func() http.Header { return http.Header{"Ratelimit": {`"default";r=0;t=4`}} }, true, [2]time.Duration{4 * time.Second, 4 * time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Dated before the request is sent: the wait is then at
			// most the bound from whichever instant the sink counts it.
			header := tt.header()
			api := newFaultAPI(t, func(r restRequest) (int, http.Header, string) {
				if r.path == "/items/ok" {
					return http.StatusCreated, nil, ""
				}
				return tt.status, header, `{"error":"slow down"}`
			})
			s := api.sink(t, RESTConfig{URL: "/items/{$id}"})
			res, err := s.Write(t.Context(), []ingest.Record{rec("ok", `{}`), rec("x", `{}`)})
			require.NoError(t, err)
			require.Equal(t, ingest.Delivered, res[0].Outcome)
			require.Equal(t, ingest.Retryable, res[1].Outcome, "throttling is never a dead letter")
			require.Equal(t, tt.throttled, res[1].Throttled)
			require.GreaterOrEqual(t, res[1].RetryAfter, tt.retryAfter[0])
			require.LessOrEqual(t, res[1].RetryAfter, tt.retryAfter[1])
		})
	}
}

// The rate-limit headers of successful answers: NearLimit when the quota
// will run out before it resets at the sink's own pace, and not before.
func TestRESTSinkNearLimitFromSuccesses(t *testing.T) {
	t.Parallel()
	var limit, remaining atomic.Int64
	limit.Store(100_000)
	remaining.Store(100_000)
	api := newFaultAPI(t, func(restRequest) (int, http.Header, string) {
		return http.StatusCreated, http.Header{
			"X-Ratelimit-Limit":     {strconv.FormatInt(limit.Load(), 10)},
			"X-Ratelimit-Remaining": {strconv.FormatInt(remaining.Load(), 10)},
			"X-Ratelimit-Reset":     {"100"},
		}, ""
	})
	s := api.sink(t, RESTConfig{URL: "/items", Parallel: 1})
	batch := make([]ingest.Record, 20)
	for i := range batch {
		batch[i] = rec(fmt.Sprint(i), `{}`)
	}
	// Up to 20 requests in the last second, 100 s to the reset: at most
	// 2,000 needed of 100,000.
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	require.False(t, res[len(res)-1].NearLimit, "plenty left")
	// 50 of 1,000 left for 100 s: near at any rate above 1.5 requests/s.
	limit.Store(1000)
	remaining.Store(50)
	res, err = s.Write(t.Context(), batch)
	require.NoError(t, err)
	require.True(t, res[len(res)-1].NearLimit, "50 left for 100 s at the sink's pace")
	require.Equal(t, ingest.Delivered, res[len(res)-1].Outcome, "outcomes are unaffected")
}
