package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// account is the sum of the pool's observation buckets over a span. The
// last bucket may still be open: it gets reports until it ends.
type account struct {
	span       time.Duration // the buckets' total width
	units      float64
	attempts   int64
	throttled  int64
	latency    time.Duration
	answers    int64
	backlogged int // buckets in which a worker had a backlog
	buckets    int
	openUnits  float64 // units of the last bucket
}

// sentRate is the units sent per second over the buckets that ended: the
// rate whether the workers used a level, which the open bucket would make
// look low.
func (a account) sentRate() float64 {
	switch {
	case a.buckets == 0:
		return 0
	case a.buckets == 1:
		return a.units / a.span.Seconds()
	}
	return (a.units - a.openUnits) / (a.span - obsBucket).Seconds()
}

// accepted is the units per second the sink accepted over the buckets
// that ended: those sent, less the throttled attempts' share. While the
// workers offered more than the sink took, this is its capacity, give or
// take what a token bucket's reserve held at either end (a second of
// capacity over the two intervals read, about ±1 %).
func (a account) accepted() float64 {
	if a.attempts == 0 {
		return a.sentRate()
	}
	return a.sentRate() * float64(a.attempts-a.throttled) / float64(a.attempts)
}

func (a account) meanLatency() time.Duration {
	if a.answers == 0 {
		return 0
	}
	return a.latency / time.Duration(a.answers)
}

// readAccount sums the complete buckets within [from, to).
func (c *Controller) readAccount(ctx context.Context, from, to time.Time) (account, error) {
	w := obsBucket.Milliseconds()
	first := (from.UnixMilli() + w - 1) / w
	last := to.UnixMilli()/w - 1 // the last bucket that ended by to
	var a account
	if last < first {
		return a, nil
	}
	if last-first > 1000 {
		first = last - 1000
	}
	pipe := c.clients[0].Pipeline()
	cmds := make([]*redis.MapStringStringCmd, 0, last-first+1)
	for b := first; b <= last; b++ {
		cmds = append(cmds, pipe.HGetAll(ctx, c.keys.observations(b)))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return a, fmt.Errorf("lease: read capacity observations: %w", err)
	}
	for _, cmd := range cmds {
		m := cmd.Val()
		u, _ := strconv.ParseFloat(m["u"], 64)
		at, _ := strconv.ParseInt(m["a"], 10, 64)
		th, _ := strconv.ParseInt(m["t"], 10, 64)
		a.buckets++
		a.span += obsBucket
		a.units += u
		a.openUnits = u
		a.attempts += at
		a.throttled += th
		l, _ := strconv.ParseInt(m["l"], 10, 64)
		a.latency += time.Duration(l) * time.Microsecond
		n, _ := strconv.ParseInt(m["n"], 10, 64)
		a.answers += n
		if m["b"] == "1" {
			a.backlogged++
		}
	}
	return a, nil
}

// probeState is a probe's memory, kept in the pool's capacity state hash.
type probeState struct {
	Onset       float64       // the lowest level throttled since OnsetAt; 0: none remembered
	OnsetAt     time.Time     // when that onset was seen
	BaseLatency time.Duration // the answer latency at the levels that ran clean
}

func (c *Controller) loadProbe(ctx context.Context) (probeState, error) {
	m, err := c.clients[0].HGetAll(ctx, c.keys.capacityState()).Result()
	if err != nil {
		return probeState{}, fmt.Errorf("lease: read probe state: %w", err)
	}
	var st probeState
	st.Onset, _ = strconv.ParseFloat(m["onset"], 64)
	if ms, err := strconv.ParseInt(m["onset_at"], 10, 64); err == nil && ms > 0 {
		st.OnsetAt = time.UnixMilli(ms)
	}
	if us, err := strconv.ParseInt(m["base_latency_us"], 10, 64); err == nil {
		st.BaseLatency = time.Duration(us) * time.Microsecond
	}
	return st, nil
}

func (c *Controller) saveProbe(ctx context.Context, st probeState) error {
	var at int64
	if !st.OnsetAt.IsZero() {
		at = st.OnsetAt.UnixMilli()
	}
	return c.clients[0].HSet(ctx, c.keys.capacityState(),
		"onset", strconv.FormatFloat(st.Onset, 'f', -1, 64), "onset_at", at,
		"base_latency_us", st.BaseLatency.Microseconds()).Err()
}

// probeSettle is how long after a switch the observations are not yet
// about the new level (the workers' pacers and in-flight requests catch
// up).
const probeSettle = 250 * time.Millisecond

// probe takes a probe step: it reads the account since the level in force
// switched and decides the next level (probeStep).
func (c *Controller) probe(ctx context.Context, p Pool, now time.Time) (float64, probeState, string, error) {
	st, err := c.loadProbe(ctx)
	if err != nil {
		return 0, st, "", err
	}
	// Since the level switched, two intervals at most: a level read again
	// is judged on both readings.
	from := now.Add(-2 * p.Source.Every)
	if sw := p.Switch; sw != nil && sw.At.Add(probeSettle).After(from) {
		from = sw.At.Add(probeSettle)
	}
	// The current bucket is read too, though it may still get reports: a
	// throttle that just began counts at once.
	a, err := c.readAccount(ctx, from, now.Add(obsBucket))
	if err != nil {
		return 0, st, "", err
	}
	next, st, reason := probeStep(p, st, a, now)
	return next, st, reason, nil
}

// Probe rules (probeStep).
const (
	// probeBusy is the share of the level the workers must have sent for
	// the level to count as tried: below it the sink was not asked for
	// the level, so a clean answer says nothing about it.
	probeBusy = 0.8
	// latencyFloor is the least rise of the mean answer latency over the
	// baseline that counts as an onset, besides DefaultLatencyRise times
	// the baseline.
	latencyFloor = 50 * time.Millisecond
)

// probeStep decides a probing pool's next capacity from the account of
// the time since its level switched, two intervals at most (at least one
// bucket):
//
//   - an onset — throttled attempts, or a mean answer latency over
//     DefaultLatencyRise × the baseline and latencyFloor above it — at
//     level L: the capacity is set Margin below what the sink accepted
//     meanwhile (never above L), and L is remembered as the onset. What
//     the sink accepted is its capacity only while the workers offered
//     more: at the first onset, read while the workers sent less than
//     probeBusy of the level (their own throttle cuts held them back), it
//     is a lower bound and L the upper, so the capacity is set Margin
//     below their middle; throttles read within 1.5 intervals of the
//     last onset, while the workers sent less than probeBusy of the level
//     (its throttles still held them back), leave the level for one more
//     reading, and the next decision reads both;
//   - a clean account with a backlog that used at least probeBusy of the
//     level: a raise by DefaultProbeGrowth before the first onset; after
//     an onset the level stays (settled) for the re-probe period, so no
//     level that was throttled is tried again within it. After Reprobe
//     without an onset the onset is forgotten and the probe climbs on,
//     slowly: by Margin per step, until the next onset;
//   - otherwise (no backlog, too few sends, no complete bucket yet) the
//     level stays.
//
// So each raise overshoots the sink's capacity by at most one step, for at
// most one interval (the next decision lowers it; two when the reading
// right after an onset is read again; a sink's burst reserve hides an
// overshoot until it runs dry), and the level where
// throttling began is not tried again within the re-probe period.
// Every level stays within the floor and the ceiling.
func probeStep(p Pool, st probeState, a account, now time.Time) (float64, probeState, string) {
	src := p.Source
	cur := p.Capacity
	if a.buckets == 0 {
		return cur, st, "no observation yet"
	}
	if st.Onset > 0 && now.Sub(st.OnsetAt) >= src.Reprobe {
		st.Onset = 0 // re-probe: the old onset is forgotten (OnsetAt stays: the climb is slow)
	}
	lat := a.meanLatency()
	latencyOnset := st.BaseLatency > 0 && a.answers > 0 &&
		lat > time.Duration(DefaultLatencyRise*float64(st.BaseLatency)) && lat-st.BaseLatency > latencyFloor
	// Throttled while the workers sent less than probeBusy of the level:
	// their own throttle cuts held them back, so what the sink accepted
	// is what they offered, a lower bound of its capacity.
	heldBack := a.throttled > 0 && a.sentRate() < probeBusy*cur
	if heldBack && st.Onset > 0 && now.Sub(st.OnsetAt) < src.Every*3/2 {
		// Right after an onset, still held back by its throttles: the
		// level is read once more before it is judged.
		return cur, st, "throttled while the workers were held back: read again"
	}
	if a.throttled > 0 || latencyOnset {
		level := cur
		accepted := a.accepted()
		if latencyOnset {
			accepted = min(accepted, cur) // the sink kept up, slower: settle below the level
		}
		capacity := min(accepted, level)
		if heldBack && st.Onset == 0 {
			// The first onset, read while held back: the capacity is at
			// least what the sink accepted and, as it throttled, below
			// the level. Settling at the lower bound read 81-93 % of a
			// windowed sink's capacity, as the cuts' timing fell; the
			// middle halves the gap, and a middle above the capacity is
			// an onset again, judged on what the sink accepted.
			capacity = (capacity + level) / 2
		}
		next := src.clamp((1 - src.Margin) * capacity)
		next = math.Min(next, src.clamp((1-src.Margin)*level))
		if st.Onset == 0 || level < st.Onset {
			st.Onset = level
		}
		st.OnsetAt = now
		reason := fmt.Sprintf("%d of %d attempts throttled at %s/s (%s/s accepted)", a.throttled, a.attempts, formatRate(level), formatRate(accepted))
		if latencyOnset {
			reason = fmt.Sprintf("answer latency %v at %s/s, %v below it", lat.Round(time.Millisecond), formatRate(level), st.BaseLatency.Round(time.Millisecond))
		}
		return math.Round(next), st, reason
	}
	if a.answers > 0 {
		if st.BaseLatency == 0 {
			st.BaseLatency = lat
		} else {
			st.BaseLatency = (3*st.BaseLatency + lat) / 4
		}
	}
	busy := a.backlogged > 0 && a.sentRate() >= probeBusy*cur
	switch {
	case !busy:
		return cur, st, "the workers did not use the level"
	case st.Onset > 0:
		return cur, st, "settled a margin below the onset"
	}
	next := cur * DefaultProbeGrowth
	if !st.OnsetAt.IsZero() {
		next = cur * (1 + src.Margin) // re-probing: slowly
	}
	next = math.Round(src.clamp(next))
	if next <= cur {
		return cur, st, "at the ceiling"
	}
	return next, st, fmt.Sprintf("%s/s ran clean with a backlog", formatRate(cur))
}
