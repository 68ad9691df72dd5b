package lease

import (
	"fmt"
	"strings"
)

// Priority is a worker's class in its pool. A pool's capacity is
// allocated in class order: the demand of a higher class is met first
// (weighted max-min fair inside the class), the next class shares what is
// left, and so on, so that nothing is idle while anyone has demand. The
// zero value is PriorityNormal.
type Priority int

// The three classes, highest first. Their names ("high", "normal", "low")
// are what flags, environment variables, types files, `sluice pool
// status` and the metrics' priority label use.
const (
	PriorityHigh   Priority = 1
	PriorityNormal Priority = 0
	PriorityLow    Priority = -1
)

// Priorities lists the classes in allocation order, highest first.
var Priorities = []Priority{PriorityHigh, PriorityNormal, PriorityLow}

// DefaultWeight is a worker's weight inside its class when it does not set
// one.
const DefaultWeight = 1

// String returns the class's name: "high", "normal" or "low" (and
// "priority(N)" for a value that is none of them).
func (p Priority) String() string {
	switch p {
	case PriorityHigh:
		return "high"
	case PriorityNormal:
		return "normal"
	case PriorityLow:
		return "low"
	}
	return fmt.Sprintf("priority(%d)", int(p))
}

// Valid reports whether p is one of the three classes.
func (p Priority) Valid() bool { return p >= PriorityLow && p <= PriorityHigh }

// ParsePriority returns the class named s: "high", "normal" or "low"
// (case and surrounding spaces ignored). The error names the classes.
func ParsePriority(s string) (Priority, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "high":
		return PriorityHigh, nil
	case "normal":
		return PriorityNormal, nil
	case "low":
		return PriorityLow, nil
	}
	return PriorityNormal, fmt.Errorf("unknown priority class %q (want high, normal or low)", s)
}

// MarshalText encodes the class by its name.
func (p Priority) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads a class name (ParsePriority).
func (p *Priority) UnmarshalText(b []byte) error {
	v, err := ParsePriority(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}
