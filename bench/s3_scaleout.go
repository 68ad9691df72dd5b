package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinksim"
)

// The scale-out setups of scenarios 3 and 4: 2,000 records/s, 20
// partitions, cost 1; each worker drains its own topic (its own backlog).
const scaleCapacity = 2000

type scaleSetup struct {
	id      string // "a", "b", "c"
	workers int
	each    int64 // records per worker
	specs   []workerSpec
}

// scaleSetups produces the three setups' topics once; scenarios 3 and 4
// read the same records with fresh consumer groups.
func (r *runner) scaleSetups(ctx context.Context) ([]*scaleSetup, error) {
	if r.scale != nil {
		return r.scale, nil
	}
	setups := []*scaleSetup{{id: "a", workers: 1, each: 60_000}, {id: "b", workers: 2, each: 10_000}, {id: "c", workers: 4, each: 5_000}}
	for _, s := range setups {
		for w := range s.workers {
			topic := r.env.name("s3", s.id, fmt.Sprint(w))
			if err := r.env.produce(ctx, topic, 4, int(s.each), smallRecord(topic)); err != nil {
				return nil, err
			}
			s.specs = append(s.specs, workerSpec{topic: topic, records: s.each})
		}
	}
	r.scale = setups
	return setups, nil
}

func (s *scaleSetup) label(alt string) string {
	return fmt.Sprintf("%s %d×%d", alt, s.workers, s.each)
}

func (s *scaleSetup) ideal() time.Duration {
	return secs(float64(int64(s.workers)*s.each) / scaleCapacity)
}

// scaleEntry runs alt on setup s (median of the repetitions) and returns
// its entry; the first repetition's series goes to chart.
func (r *runner) scaleEntry(ctx context.Context, s *scaleSetup, alt, chart string, b func() build) (Entry, error) {
	ideal := s.ideal()
	simCfg := sinksim.Config{Capacity: scaleCapacity, Unit: ingest.UnitRecords}
	var reps []Entry
	for i := range r.repsFor(ideal) {
		t, err := r.trial(ctx, simCfg, 3*ideal+30*time.Second, b())
		if err != nil {
			return Entry{}, fmt.Errorf("%s: %w", s.label(alt), err)
		}
		if i == 0 {
			r.addLine(chart, s.label(alt), t.snap.UnitsPer200ms, scaleCapacity)
		}
		per1000 := func(n int64) float64 { return float64(n) * 1000 / float64(max(t.out.records, 1)) }
		cols := []Col{
			{Name: "workers", Value: float64(s.workers)},
			{Name: "records", Value: float64(t.out.records)},
			{Name: "ideal_s", Value: ideal.Seconds(), Digits: 2},
			{Name: "elapsed_s", Value: t.out.elapsed.Seconds(), Digits: 2},
			{Name: "utilization", Ideal: "1.000", Value: utilization(ideal, t.out.elapsed), Digits: 3},
			{Name: "throttled_429", Ideal: "0", Value: float64(t.snap.Throttled)},
			{Name: "redis_cmds_per_1000_records", Value: per1000(t.out.commands), Digits: 1},
		}
		cols = append(cols, rateCols(t, scaleCapacity)...)
		if alt == "sluice" {
			cols = append(cols,
				Col{Name: "lease_attempts", Value: float64(t.out.lockAttempts)},
				Col{Name: "failed_lease_attempts", Ideal: "0", Value: float64(t.out.lockFailures)})
		}
		reps = append(reps, Entry{Alternative: s.label(alt), Reps: 1, Cols: cols})
		r.log.Info("run done", "setup", s.label(alt), "rep", i+1, "elapsed_s", t.out.elapsed.Seconds(), "max_1s", t.snap.MaxUnits1s)
	}
	return median(reps), nil
}

// scenario3 is scale-out efficiency: 2,000 records/s, 20 partitions,
// cost 1; (a) 1 worker with 60,000 records, (b) 2 workers with 10,000
// each, (c) 4 with 5,000 each, each worker its own topic.
func (r *runner) scenario3(ctx context.Context) ([]Scenario, error) {
	setups, err := r.scaleSetups(ctx)
	if err != nil {
		return nil, err
	}
	p := pool{capacity: scaleCapacity, unit: ingest.UnitRecords, partitions: 20}
	sc := Scenario{ID: "3", Title: "Scale-out: 2,000 records/s, 20 partitions, cost 1, each worker its own backlog",
		Notes: []string{
			"each worker drains its own 4-partition topic with its own consumer, Redis client and lease manager, as separate pods",
			"utilization = ideal ÷ elapsed for the whole job (first fetch of any worker to last acknowledgement of any)",
			"lease_attempts, failed_lease_attempts: redsync SET NX calls and those refused (partition taken), counted by a go-redis hook (lease.Manager has no counter)",
			"redis_cmds_per_1000_records: every command the workers' Redis clients sent (leases, renewals, demand announcements, member reads)",
		}}
	for _, s := range setups {
		e, err := r.scaleEntry(ctx, s, "sluice", "s3-"+s.id, func() build {
			return r.sluiceMembers(ctx, r.withGroups(s.specs), p, ingest.Pricing{Unit: ingest.UnitRecords})
		})
		if err != nil {
			return nil, err
		}
		sc.Entries = append(sc.Entries, e)
		r.scaleSluice = append(r.scaleSluice, e)
	}
	return []Scenario{sc}, nil
}

// scenario4 runs the alternatives on scenario 3's setups: a static
// per-worker limiter at capacity ÷ workers, and a global Redis GCRA
// limiter, one call per batch. sluice's rows are scenario 3's.
func (r *runner) scenario4(ctx context.Context) ([]Scenario, error) {
	setups, err := r.scaleSetups(ctx)
	if err != nil {
		return nil, err
	}
	pricing := ingest.Pricing{Unit: ingest.UnitRecords}
	sc := Scenario{ID: "4", Title: "Alternatives on scenario 3: static per-worker limiter and global Redis GCRA limiter",
		Notes: []string{
			"static: golang.org/x/time/rate at 2,000 ÷ workers records/s per worker, burst one 200 ms slice of it",
			"gcra: github.com/go-redis/redis_rate/v10 on one key shared by all workers, rate 2,000/s, burst 400 (one 200 ms slice), one AllowN per batch of ≤ 100, sleeping RetryAfter when denied",
			"both write with the same HTTP sink client, batch size (100) and concurrency (16) as sluice, and retry rejected records with the same policy",
		}}
	if len(r.scaleSluice) > 0 {
		sc.Notes = append(sc.Notes, "the sluice rows are scenario 3's, repeated for comparison")
	}
	for i, s := range setups {
		e, err := r.scaleEntry(ctx, s, "static", "s4-"+s.id, func() build {
			return r.peerMembers(r.withGroups(s.specs), pricing, func(int) (func(context.Context, int64) error, *redisProbe) {
				return staticLimiter(scaleCapacity/float64(s.workers), batchSize), nil
			})
		})
		if err != nil {
			return nil, err
		}
		sc.Entries = append(sc.Entries, e)
		key := r.env.name("gcra")
		e, err = r.scaleEntry(ctx, s, "gcra", "s4-"+s.id, func() build {
			return r.peerMembers(r.withGroups(s.specs), pricing, func(int) (func(context.Context, int64) error, *redisProbe) {
				probe := new(redisProbe)
				lim := redis_rate.NewLimiter(r.env.redisClient(probe))
				return gcraLimiter(lim, key, scaleCapacity, batchSize), probe
			})
		})
		if err != nil {
			return nil, err
		}
		sc.Entries = append(sc.Entries, e)
		if i < len(r.scaleSluice) {
			sc.Entries = append(sc.Entries, r.scaleSluice[i])
		}
	}
	return []Scenario{sc}, nil
}
