package sink

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// StatusSet is a list of HTTP statuses, as --sink-retry-on and its
// siblings give it: comma-separated entries, each an exact status ("429"),
// a class ("5xx"), or a range ("502-504"), optionally followed by
// ":TEXT", which makes the entry match only answers whose body contains
// TEXT (case-insensitively; TEXT holds no comma). For example
// "408,429,5xx" or "409,500:duplicate id". The zero StatusSet is empty.
type StatusSet struct {
	entries []statusEntry
}

// statusEntry is one entry of a StatusSet: the statuses lo..hi, exact when
// written as one status, and the text the body must contain ("": any).
type statusEntry struct {
	lo, hi int
	exact  bool
	text   string // lower case
	raw    string
}

// ParseStatusSet parses a StatusSet. It returns an error naming the entry
// for anything but statuses 100-599 in the forms above; 2xx is refused
// (every 2xx answer is a success).
func ParseStatusSet(s string) (StatusSet, error) {
	var set StatusSet
	for raw := range strings.SplitSeq(s, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		e := statusEntry{raw: raw}
		spec, text, hasText := strings.Cut(raw, ":")
		spec = strings.TrimSpace(spec)
		if hasText {
			e.text = strings.ToLower(strings.TrimSpace(text))
			if e.text == "" {
				return StatusSet{}, fmt.Errorf("status %q: empty text after ':'", raw)
			}
		}
		lo, hi, ok := strings.Cut(spec, "-")
		switch {
		case len(spec) == 3 && strings.HasSuffix(strings.ToLower(spec), "xx") && spec[0] >= '1' && spec[0] <= '5':
			e.lo = int(spec[0]-'0') * 100
			e.hi = e.lo + 99
		case ok:
			var err1, err2 error
			e.lo, err1 = strconv.Atoi(strings.TrimSpace(lo))
			e.hi, err2 = strconv.Atoi(strings.TrimSpace(hi))
			if err1 != nil || err2 != nil || e.lo > e.hi {
				return StatusSet{}, fmt.Errorf("status %q: want N, Nxx or N-M with N ≤ M", raw)
			}
		default:
			n, err := strconv.Atoi(spec)
			if err != nil {
				return StatusSet{}, fmt.Errorf("status %q: want N, Nxx or N-M (e.g. 429, 5xx, 502-504)", raw)
			}
			e.lo, e.hi, e.exact = n, n, true
		}
		if e.lo < 100 || e.hi > 599 {
			return StatusSet{}, fmt.Errorf("status %q: out of 100-599", raw)
		}
		if e.lo <= 299 && e.hi >= 200 {
			return StatusSet{}, fmt.Errorf("status %q: a 2xx answer is always a success", raw)
		}
		set.entries = append(set.entries, e)
	}
	return set, nil
}

// MustStatusSet is ParseStatusSet for constants; it panics on a bad list.
func MustStatusSet(s string) StatusSet {
	set, err := ParseStatusSet(s)
	if err != nil {
		panic(err)
	}
	return set
}

// String renders the set as ParseStatusSet reads it.
func (s StatusSet) String() string {
	raws := make([]string, len(s.entries))
	for i, e := range s.entries {
		raws[i] = e.raw
	}
	return strings.Join(raws, ",")
}

// Empty reports whether the set has no entry.
func (s StatusSet) Empty() bool { return len(s.entries) == 0 }

// match returns the specificity of the most specific entry matching status
// and the lower-cased body: 4 an exact status with text, 3 a class or
// range with text, 2 an exact status, 1 a class or range; 0 none.
func (s StatusSet) match(status int, body string) int {
	best := 0
	for _, e := range s.entries {
		if status < e.lo || status > e.hi || (e.text != "" && !strings.Contains(body, e.text)) {
			continue
		}
		score := 1
		if e.exact {
			score = 2
		}
		if e.text != "" {
			score += 2
		}
		best = max(best, score)
	}
	return best
}

// The REST sink's default status rules: the cloud storage vendors' retry
// guidance (Google Cloud Storage, Azure Storage) retries 408, 429 and 5xx
// but 501 and 505, and takes the other 4xx as a verdict about the request's
// record. RESTSinkWideStatuses beat the classes of these lists.
const (
	DefaultRetryOn      = "408,429,5xx"
	DefaultDeadLetterOn = "4xx"
	DefaultDuplicateOn  = ""
)

// RESTSinkWideStatuses are statuses about the request or the API as a
// whole, whatever class of a list covers them: 401 and 407 (credentials),
// 403 (permission), 404 and 405 (a wrong URL or method), 501 and 505 (the
// API cannot serve the request at all). A list names one exactly to take
// it as a verdict about the record instead (e.g. 404 for PATCH of items
// that may not exist); 401 and 407 never are.
var RESTSinkWideStatuses = []int{
	http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed,
	http.StatusProxyAuthRequired, http.StatusNotImplemented, http.StatusHTTPVersionNotSupported,
}

// statusClass is what an answer's status says about its request.
type statusClass int

const (
	classSuccess    statusClass = iota // 2xx: stored
	classDuplicate                     // already stored
	classRetry                         // may pass: the record is written again
	classDeadLetter                    // refused for good: the record is dead-lettered
	classSinkWide                      // about the request or the API: Write fails as a whole
)

func (c statusClass) String() string {
	return [...]string{"success", "duplicate", "retry", "dead-letter", "sink-wide"}[c]
}

// StatusRules classify a REST API's answers. An empty list takes its
// default.
type StatusRules struct {
	// RetryOn lists the statuses whose record is written again after a
	// backoff (Retryable). Default DefaultRetryOn.
	RetryOn StatusSet
	// DeadLetterOn lists the statuses that refuse the request's record for
	// good (Permanent: dead-lettered), within the rule of the package doc
	// that tells a per-record refusal from a sink-wide one. Default
	// DefaultDeadLetterOn.
	DeadLetterOn StatusSet
	// DuplicateOn lists the statuses that mean the record was stored
	// before (Duplicate), e.g. 409 for a create of an existing item.
	// Default none.
	DuplicateOn StatusSet
}

// Validate refuses rules that contradict themselves: the same entry in two
// lists, or 401, 407 or 429 (credentials, throttling) named as a verdict
// about a record (a dead-letter or duplicate status).
func (r StatusRules) Validate() error {
	lists := []struct {
		name string
		set  StatusSet
	}{{"retry", r.RetryOn}, {"dead-letter", r.DeadLetterOn}, {"duplicate", r.DuplicateOn}}
	for _, l := range lists[1:] {
		for _, e := range l.set.entries {
			for _, never := range []int{http.StatusUnauthorized, http.StatusProxyAuthRequired, http.StatusTooManyRequests} {
				if e.exact && e.lo == never {
					return fmt.Errorf("%s list: status %d is never a verdict about one record", l.name, never)
				}
			}
		}
	}
	for i, a := range lists {
		for _, b := range lists[i+1:] {
			for _, ea := range a.set.entries {
				for _, eb := range b.set.entries {
					if ea.lo == eb.lo && ea.hi == eb.hi && ea.exact == eb.exact && ea.text == eb.text {
						return fmt.Errorf("status %q is in both the %s and the %s list", ea.raw, a.name, b.name)
					}
				}
			}
		}
	}
	return nil
}

// classify returns the class of an answer's status given its body (lower
// case): 2xx is a success; otherwise the most specific matching entry
// wins (text over none, exact over class or range), and on a tie the
// first of duplicate, retry, dead-letter; a RESTSinkWideStatuses status
// beats classes and ranges without text; a status no list names is
// sink-wide.
func (r StatusRules) classify(status int, body string) statusClass {
	if status >= 200 && status <= 299 {
		return classSuccess
	}
	best, class := 0, classSinkWide
	for _, l := range []struct {
		set   StatusSet
		class statusClass
	}{{r.DuplicateOn, classDuplicate}, {r.RetryOn, classRetry}, {r.DeadLetterOn, classDeadLetter}} {
		if m := l.set.match(status, body); m > best {
			best, class = m, l.class
		}
	}
	if best == 1 && isSinkWideStatus(status) {
		return classSinkWide
	}
	return class
}

func isSinkWideStatus(status int) bool { return slices.Contains(RESTSinkWideStatuses, status) }

// withDefaults fills the empty lists with their defaults.
func (r StatusRules) withDefaults() StatusRules {
	if r.RetryOn.Empty() {
		r.RetryOn = MustStatusSet(DefaultRetryOn)
	}
	if r.DeadLetterOn.Empty() {
		r.DeadLetterOn = MustStatusSet(DefaultDeadLetterOn)
	}
	return r
}
