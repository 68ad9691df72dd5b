package bulkload

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DeadLetterLimit is how many dead letters a bulk load tolerates before it
// stops producing: a count, or a share of the rows read so far (at least
// MinDeadLetters, so that the first bad rows of a file do not stop it).
// The zero value tolerates none.
type DeadLetterLimit struct {
	Count    int64   // with Fraction 0: the most dead letters
	Fraction float64 // (0, 1]: the most dead letters per row read
}

// MinDeadLetters is the least a fractional DeadLetterLimit allows.
const MinDeadLetters = 100

// DefaultDeadLetterLimit is 1 % of the rows read (at least 100).
var DefaultDeadLetterLimit = DeadLetterLimit{Fraction: 0.01}

// ParseDeadLetterLimit parses "N" (a count ≥ 0), "P%" (a share of the rows
// read, 0 < P ≤ 100) or "none" (no limit).
func ParseDeadLetterLimit(s string) (DeadLetterLimit, error) {
	s = strings.TrimSpace(s)
	if s == "none" {
		return DeadLetterLimit{Count: math.MaxInt64}, nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || !(f > 0 && f <= 100) {
			return DeadLetterLimit{}, fmt.Errorf("want a share within (0%%, 100%%], got %q", s)
		}
		return DeadLetterLimit{Fraction: f / 100}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return DeadLetterLimit{}, fmt.Errorf("want a count ≥ 0, a share such as 1%% or none, got %q", s)
	}
	return DeadLetterLimit{Count: n}, nil
}

// Allows reports whether dead dead letters are within the limit after read
// rows.
func (l DeadLetterLimit) Allows(dead, read int64) bool {
	if l.Fraction > 0 {
		return dead <= max(int64(math.Ceil(l.Fraction*float64(read))), MinDeadLetters)
	}
	return dead <= l.Count
}

// Describe says the limit for a message: "1 %" (a share of the rows read,
// at least MinDeadLetters), "50" or "none".
func (l DeadLetterLimit) Describe() string {
	if l.Fraction > 0 {
		return strconv.FormatFloat(l.Fraction*100, 'f', -1, 64) + " %"
	}
	return l.String()
}

func (l DeadLetterLimit) String() string {
	switch {
	case l.Fraction > 0:
		return strconv.FormatFloat(l.Fraction*100, 'f', -1, 64) + "%"
	case l.Count == math.MaxInt64:
		return "none"
	}
	return strconv.FormatInt(l.Count, 10)
}
