package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinksim"
)

// scenario2 is two uncoordinated processors sharing one service: 500
// records/s split into 20 partitions of 25, 15 s leases; processor A has
// 10,000 records of type A, B 5,000 of type B, on separate topics. Ideal:
// 15,000 ÷ 500 = 30 s, never more than 500 in any second. sluice's workers
// split the pool by max-min fair share and A takes B's partitions when B
// is done; static gives each a fixed half.
func (r *runner) scenario2(ctx context.Context) ([]Scenario, error) {
	const capacity = 500
	sizes := []int64{10_000, 5_000}
	ideal := secs(float64(sizes[0]+sizes[1]) / capacity)
	var specs []workerSpec
	for i, n := range sizes {
		topic := r.env.name("s2", string(rune('a'+i)))
		if err := r.env.produce(ctx, topic, 4, int(n), smallRecord(topic)); err != nil {
			return nil, err
		}
		specs = append(specs, workerSpec{topic: topic, records: n})
	}
	pricing := ingest.Pricing{Unit: ingest.UnitRecords}
	simCfg := sinksim.Config{Capacity: capacity, Unit: ingest.UnitRecords}
	p := pool{capacity: capacity, unit: ingest.UnitRecords, partitions: 20, ttl: 15 * time.Second}
	sc := Scenario{ID: "2", Title: "Uncoordinated processors sharing 500 records/s (20 partitions of 25, 15 s leases): A 10,000 + B 5,000 records",
		Notes: []string{
			"A and B are separate workers (own consumer, Redis client, lease manager) on separate topics; they share only the pool in Redis",
			"static: each processor limited to 250 records/s (capacity ÷ 2) with x/time/rate, no coordination",
			"a_share_while_both: A's fraction of the units accepted until B finished (fair: 0.500); a_done_s, b_done_s: when each finished, from the first fetch",
			"per-second accepted units of each processor are in results.json (per_second_a, per_second_b) and the s2-* charts",
		}}
	alts := []struct {
		name string
		b    func() build
	}{
		{"sluice", func() build { return r.sluiceMembers(ctx, r.withGroups(specs), p, pricing) }},
		{"static", func() build {
			return r.peerMembers(r.withGroups(specs), pricing, func(int) (func(context.Context, int64) error, *redisProbe) {
				return staticLimiter(capacity/2, batchSize), nil
			})
		}},
	}
	for _, alt := range alts {
		var reps []Entry
		for i := range r.repsFor(ideal) {
			t, err := r.trial(ctx, simCfg, 3*ideal+30*time.Second, alt.b())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", alt.name, err)
			}
			a, b := t.members[0].timeline().series(time.Second), t.members[1].timeline().series(time.Second)
			start := earliest(t.out.members)
			aDone, bDone := t.out.members[0].last.Sub(start), t.out.members[1].last.Sub(start)
			// A's share until B finished, from the 10 ms timelines.
			aUnits, bUnits := sumUntil(t.members[0].timeline(), t.out.members[1].last), sumUntil(t.members[1].timeline(), t.out.members[1].last)
			if i == 0 {
				r.addLines("s2-"+alt.name, capacity, []line{
					{name: "total", per200ms: t.snap.UnitsPer200ms},
					{name: "A (10,000)", per200ms: t.members[0].timeline().series(200 * time.Millisecond)},
					{name: "B (5,000)", per200ms: t.members[1].timeline().series(200 * time.Millisecond)},
				})
			}
			reps = append(reps, Entry{Alternative: alt.name, Reps: 1, Cols: append([]Col{
				{Name: "records", Value: float64(t.out.records)},
				{Name: "a_share_while_both", Ideal: "0.500", Value: float64(aUnits) / float64(max(aUnits+bUnits, 1)), Digits: 3},
				{Name: "b_done_s", Ideal: "20.0", Value: bDone.Seconds(), Digits: 1},
				{Name: "a_done_s", Ideal: fmt.Sprintf("%.1f", ideal.Seconds()), Value: aDone.Seconds(), Digits: 1},
				{Name: "ideal_s", Value: ideal.Seconds(), Digits: 2},
				{Name: "elapsed_s", Value: t.out.elapsed.Seconds(), Digits: 2},
				{Name: "utilization", Ideal: "1.000", Value: utilization(ideal, t.out.elapsed), Digits: 3},
				{Name: "throttled_429", Ideal: "0", Value: float64(t.snap.Throttled)},
			}, rateCols(t, capacity)...), Extra: map[string]any{"per_second_a": trimZeros(a), "per_second_b": trimZeros(b)}})
			r.log.Info("run done", "scenario", 2, "alternative", alt.name, "rep", i+1, "elapsed_s", t.out.elapsed.Seconds())
		}
		sc.Entries = append(sc.Entries, median(reps))
	}
	return []Scenario{sc}, nil
}

// earliest returns the first fetch of any member.
func earliest(ps []progress) time.Time {
	var first time.Time
	for _, p := range ps {
		if first.IsZero() || p.first.Before(first) {
			first = p.first
		}
	}
	return first
}

// sumUntil returns the units t accepted before until.
func sumUntil(t *tally, until time.Time) int64 {
	n := int(until.Sub(t.epoch)/tallyStep) + 1
	var sum int64
	for i, u := range t.series(tallyStep) {
		if i < n {
			sum += u
		}
	}
	return sum
}

// trimZeros drops the leading empty buckets (before the first acceptance).
func trimZeros(s []int64) []int64 {
	for len(s) > 0 && s[0] == 0 {
		s = s[1:]
	}
	return s
}
