package lease

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// SourceKind is where a pool's capacity comes from.
type SourceKind string

// The capacity sources (Pool.Source.Kind).
const (
	// SourceNumber: the capacity is the number the operator gave (the
	// zero value).
	SourceNumber SourceKind = ""
	// SourceSink: the capacity is read from the sink (a DynamoDB table's
	// provisioned or maximum write throughput, a REST API's announced
	// limit) and followed as it changes; see Controller.
	SourceSink SourceKind = "sink"
	// SourceProbe: the capacity is found by probing: raised step by step
	// while the sink answers without throttling and the workers have a
	// backlog, and set a margin below the onset of throttling; see
	// Controller.
	SourceProbe SourceKind = "probe"
)

// Probe and poll defaults (Source).
const (
	// DefaultPollEvery is how often a pool whose capacity comes from the
	// sink reads it again: 30 s.
	DefaultPollEvery = 30 * time.Second
	// DefaultProbeEvery is how often a probing pool decides its next step:
	// 2 s (a raise switches half a second after the decision, and about
	// the second after that is observed).
	DefaultProbeEvery = 2 * time.Second
	// DefaultProbeFloor is where probing starts, in units/s: 100.
	DefaultProbeFloor = 100
	// DefaultProbeMargin is how far below what the sink accepted at the
	// onset of throttling a probe settles: 3 %, more than twice the
	// scatter of that reading against a token bucket with a second of
	// capacity in reserve.
	DefaultProbeMargin = 0.03
	// DefaultReprobe is how long a probe stays settled before it raises
	// again (slowly, by the margin each step): 10 min. Within it the
	// capacity never returns to a level that was throttled.
	DefaultReprobe = 10 * time.Minute
	// DefaultProbeGrowth is the factor a probe raises the capacity by per
	// step before the first onset: 1.5, Firestore's "500/50/5" rule (up
	// by 50 % per step) on a compressed clock.
	DefaultProbeGrowth = 1.5
	// DefaultLatencyRise is the answer latency, as a multiple of the
	// latency at the lower levels, that counts as an onset like a
	// throttle: 3.
	DefaultLatencyRise = 3
)

// Source says where a pool's capacity comes from and how it is followed.
// The zero Source is a number: Pool.Capacity as given.
type Source struct {
	// Kind is SourceNumber, SourceSink or SourceProbe.
	Kind SourceKind
	// Every is how often the pool's capacity is decided, once for all its
	// workers: the sink is read (SourceSink, default DefaultPollEvery) or
	// the probe takes a step (SourceProbe, default DefaultProbeEvery).
	// ≥ 1 s.
	Every time.Duration
	// Floor is the least capacity, in units/s: where a probe starts
	// (default DefaultProbeFloor) and the least it settles at; for
	// SourceSink, a reading below it is raised to it (default 0: none).
	Floor float64
	// Ceiling, when > 0, is the most capacity, in units/s, whatever the
	// sink announces or the probe finds. Default 0: none.
	Ceiling float64
	// Margin is how far below the onset of throttling a probe settles, as
	// a fraction (default DefaultProbeMargin); within (0, 0.5].
	Margin float64
	// Reprobe is how long a probe stays settled before raising again
	// (default DefaultReprobe); ≥ Every.
	Reprobe time.Duration
}

// On reports whether the capacity comes from the sink or a probe.
func (s Source) On() bool { return s.Kind != SourceNumber }

func (s Source) withDefaults() Source {
	switch s.Kind {
	case SourceSink:
		if s.Every == 0 {
			s.Every = DefaultPollEvery
		}
	case SourceProbe:
		if s.Every == 0 {
			s.Every = DefaultProbeEvery
		}
		if s.Floor == 0 {
			s.Floor = DefaultProbeFloor
		}
		if s.Margin == 0 {
			s.Margin = DefaultProbeMargin
		}
		if s.Reprobe == 0 {
			s.Reprobe = DefaultReprobe
		}
	}
	return s
}

// validate reports the first field that cannot work.
func (s Source) validate() error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case s.Kind != SourceNumber && s.Kind != SourceSink && s.Kind != SourceProbe:
		return fmt.Errorf("capacity source %q: want a number, sink or probe", s.Kind)
	case !s.On():
		return nil
	case s.Every < time.Second:
		return fmt.Errorf("capacity interval must be ≥ 1s, got %v", s.Every)
	case !finite(s.Floor) || s.Floor < 0:
		return fmt.Errorf("capacity floor must be a finite rate ≥ 0, got %v", s.Floor)
	case !finite(s.Ceiling) || s.Ceiling < 0:
		return fmt.Errorf("capacity ceiling must be a finite rate ≥ 0, got %v", s.Ceiling)
	case s.Ceiling > 0 && s.Ceiling < s.Floor:
		return fmt.Errorf("capacity ceiling %v is below the floor %v", s.Ceiling, s.Floor)
	case s.Kind == SourceProbe && s.Floor <= 0:
		return fmt.Errorf("a probe needs a floor > 0 to start from, got %v", s.Floor)
	case s.Kind == SourceProbe && !(s.Margin > 0 && s.Margin <= 0.5):
		return fmt.Errorf("probe margin must be within (0, 0.5], got %v", s.Margin)
	case s.Kind == SourceProbe && s.Reprobe < s.Every:
		return fmt.Errorf("re-probe period %v must be ≥ the interval %v", s.Reprobe, s.Every)
	}
	return nil
}

// clamp bounds a capacity by the floor and the ceiling.
func (s Source) clamp(c float64) float64 {
	if s.Ceiling > 0 {
		c = min(c, s.Ceiling)
	}
	return max(c, s.Floor)
}

// String describes the source, e.g. "capacity from the sink every 30s" or
// "capacity probed from 100/s every 3s".
func (s Source) String() string {
	switch s.Kind {
	case SourceSink:
		out := fmt.Sprintf("capacity from the sink every %v", s.Every)
		if s.Ceiling > 0 {
			out += fmt.Sprintf(" up to %v/s", s.Ceiling)
		}
		return out
	case SourceProbe:
		out := fmt.Sprintf("capacity probed from %v/s every %v", s.Floor, s.Every)
		if s.Ceiling > 0 {
			out += fmt.Sprintf(" up to %v/s", s.Ceiling)
		}
		return out
	}
	return "capacity as given"
}

// ParseCapacity reads a --capacity value: a number of units/s, "sink" or
// "probe". It returns the capacity (0 for a source) and the source kind.
func ParseCapacity(v string) (float64, SourceKind, error) {
	switch k := SourceKind(strings.ToLower(strings.TrimSpace(v))); k {
	case SourceSink, SourceProbe:
		return 0, k, nil
	}
	c, err := strconv.ParseFloat(strings.ReplaceAll(strings.TrimSpace(v), "_", ""), 64)
	if err != nil || math.IsNaN(c) || math.IsInf(c, 0) {
		return 0, "", fmt.Errorf("want a number of units/s, sink (read it from the sink) or probe (find it), got %q", v)
	}
	return c, SourceNumber, nil
}

// sourceJSON is the stored shape of a Source.
type sourceJSON struct {
	Kind    SourceKind `json:"kind"`
	Every   string     `json:"every"`
	Floor   float64    `json:"floor,omitempty"`
	Ceiling float64    `json:"ceiling,omitempty"`
	Margin  float64    `json:"margin,omitempty"`
	Reprobe string     `json:"reprobe,omitempty"`
}

func (s Source) toJSON() *sourceJSON {
	if !s.On() {
		return nil
	}
	j := &sourceJSON{Kind: s.Kind, Every: s.Every.String(), Floor: s.Floor, Ceiling: s.Ceiling, Margin: s.Margin}
	if s.Reprobe > 0 {
		j.Reprobe = s.Reprobe.String()
	}
	return j
}

func (j *sourceJSON) source() (Source, error) {
	if j == nil {
		return Source{}, nil
	}
	s := Source{Kind: j.Kind, Floor: j.Floor, Ceiling: j.Ceiling, Margin: j.Margin}
	var err error
	if s.Every, err = time.ParseDuration(j.Every); err != nil {
		return s, fmt.Errorf("pool capacity interval: %w", err)
	}
	if j.Reprobe != "" {
		if s.Reprobe, err = time.ParseDuration(j.Reprobe); err != nil {
			return s, fmt.Errorf("pool re-probe period: %w", err)
		}
	}
	return s, nil
}

// formatRate renders a rate with thousands separators and at most one
// decimal: 1840 → "1,840", 12.5 → "12.5".
func formatRate(v float64) string {
	neg := v < 0
	v = math.Abs(v)
	whole := int64(v)
	frac := v - float64(whole)
	digits := strconv.FormatInt(whole, 10)
	var b strings.Builder
	for i, d := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	out := b.String()
	if tenth := math.Round(frac * 10); tenth >= 1 && tenth < 10 {
		out += "." + strconv.Itoa(int(tenth))
	}
	if neg {
		out = "-" + out
	}
	return out
}
