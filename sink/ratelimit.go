package sink

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// rateLimit is what an answer's rate-limit headers say about the API's
// quota: how many requests its current window allows, how many are left,
// and when the window resets. Unknown numbers are -1.
type rateLimit struct {
	limit, remaining int64
	reset            time.Duration // -1: unknown
}

// parseRateLimit reads the rate-limit headers real APIs send, the first
// that parses of:
//
//   - RateLimit, the IETF httpapi draft's combined field, in both of its
//     shapes: `"default";r=50;t=30` (remaining r, reset in t seconds; the
//     limit from RateLimit-Policy's q) and `limit=100, remaining=50,
//     reset=30`;
//   - RateLimit-Remaining, RateLimit-Limit and RateLimit-Reset (the
//     draft's earlier separate fields; reset in seconds);
//   - X-RateLimit-Remaining, X-RateLimit-Limit and X-RateLimit-Reset (the
//     common vendor fields; reset in seconds, or a Unix time in seconds
//     or milliseconds when it is that large, as GitHub sends it).
//
// ok is false when no remaining count parses.
func parseRateLimit(h http.Header, now time.Time) (rl rateLimit, ok bool) {
	if v := h.Get("RateLimit"); v != "" {
		params := fieldParams(v)
		rl = rateLimit{limit: -1, remaining: -1, reset: -1}
		rl.remaining = firstInt(params, "r", "remaining")
		if s := firstNumber(params, "t", "reset"); s >= 0 {
			rl.reset = seconds(s)
		}
		rl.limit = firstInt(params, "limit")
		if rl.limit < 0 {
			rl.limit = firstInt(fieldParams(h.Get("RateLimit-Policy")), "q", "")
		}
		if rl.remaining >= 0 {
			return rl, true
		}
	}
	for _, prefix := range []string{"RateLimit-", "X-RateLimit-"} {
		rem := leadingInt(h.Get(prefix + "Remaining"))
		if rem < 0 {
			continue
		}
		rl = rateLimit{limit: leadingInt(h.Get(prefix + "Limit")), remaining: rem, reset: -1}
		if s, err := strconv.ParseFloat(strings.TrimSpace(h.Get(prefix+"Reset")), 64); err == nil && s >= 0 && !math.IsInf(s, 0) {
			switch {
			case s >= 1e12: // Unix milliseconds
				rl.reset = max(time.UnixMilli(int64(s)).Sub(now), 0)
			case s >= 1e9: // Unix seconds
				rl.reset = max(time.Unix(int64(s), 0).Sub(now), 0)
			default:
				rl.reset = seconds(s)
			}
		}
		return rl, true
	}
	return rateLimit{limit: -1, remaining: -1, reset: -1}, false
}

// fieldParams splits a structured header value into its key=value
// parameters (both ',' and ';' separate them); a bare integer item is
// kept under the key "".
func fieldParams(v string) map[string]string {
	out := map[string]string{}
	for item := range strings.FieldsFuncSeq(v, func(r rune) bool { return r == ',' || r == ';' }) {
		k, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			k, val = "", k
		}
		k = strings.ToLower(strings.TrimSpace(k))
		if _, seen := out[k]; !seen {
			out[k] = strings.Trim(strings.TrimSpace(val), `"`)
		}
	}
	return out
}

// firstInt returns the first of keys whose value is a whole number ≥ 0, or
// -1.
func firstInt(params map[string]string, keys ...string) int64 {
	for _, k := range keys {
		if n, err := strconv.ParseInt(params[k], 10, 64); err == nil && n >= 0 {
			return n
		}
	}
	return -1
}

// firstNumber is firstInt for numbers that may have a fraction.
func firstNumber(params map[string]string, keys ...string) float64 {
	for _, k := range keys {
		if f, err := strconv.ParseFloat(params[k], 64); err == nil && f >= 0 && !math.IsInf(f, 0) {
			return f
		}
	}
	return -1
}

// leadingInt parses the whole number at the start of a header value
// ("100", "100, 100;w=60"), or -1.
func leadingInt(v string) int64 {
	v = strings.TrimSpace(v)
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end >= 0 {
		v = v[:end]
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// seconds converts s seconds to a Duration, saturating.
func seconds(s float64) time.Duration {
	if s*float64(time.Second) >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

// nearLimitMargin is the share of the API's limit that its remaining quota
// must fall short by before a worker that keeps its own pace is told it
// is near the limit: a worker alone at exactly the API's limit ends each
// window with about nothing left, and must not be slowed for it.
const nearLimitMargin = 0.1

// nearLimit reports whether an answer's quota will run out before it
// resets at the sink's own request rate (requests/s over the last second):
// rate × reset > remaining + 10 % of the limit. Without a reset time, it
// is near when at most 10 % of the limit is left (or nothing, when the
// limit is not given either).
func (rl rateLimit) nearLimit(ownRate float64) bool {
	if rl.remaining < 0 {
		return false
	}
	if rl.reset >= 0 {
		need := ownRate * rl.reset.Seconds()
		margin := nearLimitMargin * need
		if rl.limit > 0 {
			margin = nearLimitMargin * float64(rl.limit)
		}
		return need > float64(rl.remaining)+margin
	}
	if rl.limit > 0 {
		return float64(rl.remaining) <= nearLimitMargin*float64(rl.limit)
	}
	return rl.remaining == 0
}

// announcedLimit reads the quota an answer announces, as a rate: the
// limit and window of RateLimit-Policy (`500;w=1`, or the later drafts'
// `"default";q=500;w=1`), else of RateLimit-Limit or X-RateLimit-Limit
// when they carry a window (`100, 100;w=60`). A limit without a window is
// not a rate (X-RateLimit-Limit alone may count per hour), so ok is false
// then. field names the header read, for the pool's description.
func announcedLimit(h http.Header) (perSecond float64, field, value string, ok bool) {
	for _, name := range []string{"RateLimit-Policy", "RateLimit-Limit", "X-RateLimit-Limit"} {
		v := h.Get(name)
		if v == "" {
			continue
		}
		params := fieldParams(v)
		w := firstNumber(params, "w")
		limit := firstInt(params, "q")
		if limit < 0 {
			limit = leadingInt(v)
		}
		if w > 0 && limit > 0 {
			return float64(limit) / w, name, strings.TrimSpace(v), true
		}
	}
	return 0, "", "", false
}
