package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sinksim"
)

// scenario11 is a pool whose capacity nobody knows: three workers, each
// with a backlog of 20,000 records on its own topic, write to a service
// provisioned for 1,500 records/s (the emulator's bucket mode). A fixed
// --capacity 1500 is the ideal (60,000 ÷ 1,500 = 40 s); a fixed capacity
// set 50 % low (750) takes twice as long; --capacity probe starts at 100
// records/s and finds the service's capacity while it loads.
func (r *runner) scenario11(ctx context.Context) ([]Scenario, error) {
	const capacity, each, workers = 1500, 20_000, 3
	var specs []workerSpec
	for w := range workers {
		topic := r.env.name("s11", fmt.Sprint(w))
		if err := r.env.produce(ctx, topic, 4, each, smallRecord(topic)); err != nil {
			return nil, err
		}
		specs = append(specs, workerSpec{topic: topic, records: each})
	}
	ideal := secs(float64(workers*each) / capacity)
	pricing := ingest.Pricing{Unit: ingest.UnitRecords}
	simCfg := sinksim.Config{Capacity: capacity, Unit: ingest.UnitRecords}
	sc := Scenario{ID: "11", Title: "Capacity nobody knows: 3 workers × 20,000 records into a service of 1,500 records/s",
		Notes: []string{
			"fixed 1500: --capacity set right (the ideal); fixed 750: set 50 % low; probe: --capacity probe from its floor (100/s), raised ×1.5 every 2 s while the service answers without throttling, then 3 % below what it accepted at the first throttles",
			"each worker has its own controller, as separate processes would; the pool's capacity is decided once per 2 s for all three through Redis",
			"converged_s: from when the pool's capacity stayed within 90-100 % of the service's (sampled every 500 ms); final_capacity: the pool's capacity at the end",
			"the emulator runs in its bucket mode (a second of capacity in reserve), which hides an overshoot until it runs dry",
		}}
	alts := []struct {
		name string
		pool lease.Pool
	}{
		{"fixed 1500", lease.Pool{Capacity: capacity, Partitions: 12}},
		{"fixed 750", lease.Pool{Capacity: capacity / 2, Partitions: 12}},
		{"probe", lease.Pool{Capacity: lease.DefaultProbeFloor, Partitions: 12, Source: lease.Source{Kind: lease.SourceProbe}}},
	}
	for _, alt := range alts {
		var reps []Entry
		for i := range r.repsFor(ideal) {
			p := alt.pool
			p.Name = r.env.name("pool")
			trace := &capacityTrace{}
			stop := trace.sample(ctx, r, p.Name)
			t, err := r.trial(ctx, simCfg, 3*ideal+60*time.Second, r.poolMembers(ctx, r.withGroups(specs), p, pricing))
			stop()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", alt.name, err)
			}
			if i == 0 {
				r.addLine("s11", alt.name, t.snap.UnitsPer200ms, capacity)
			}
			converged, final := trace.converged(capacity, t.out.elapsed)
			sends := t.snap.Accepted + t.snap.Duplicates + t.snap.Throttled + t.snap.Rejected
			reps = append(reps, Entry{Alternative: alt.name, Reps: 1, Cols: append([]Col{
				{Name: "records", Value: float64(t.out.records)},
				{Name: "ideal_s", Value: ideal.Seconds(), Digits: 2},
				{Name: "elapsed_s", Value: t.out.elapsed.Seconds(), Digits: 2},
				{Name: "utilization", Ideal: "1.000", Value: utilization(ideal, t.out.elapsed), Digits: 3},
				{Name: "throttled_share", Ideal: "≤ 0.02", Value: float64(t.snap.Throttled) / float64(max(sends, 1)), Digits: 4},
				{Name: "converged_s", Ideal: "≤ 30", Value: converged.Seconds(), Digits: 1},
				{Name: "final_capacity", Value: final},
			}, rateCols(t, capacity)...)})
			r.log.Info("run done", "scenario", 11, "alternative", alt.name, "rep", i+1, "elapsed_s", t.out.elapsed.Seconds())
		}
		sc.Entries = append(sc.Entries, median(reps))
	}
	return []Scenario{sc}, nil
}

// poolMembers builds a sluice worker per spec on pool p (a controller
// beside each when p's capacity comes from a source).
func (r *runner) poolMembers(ctx context.Context, specs []workerSpec, p lease.Pool, pricing ingest.Pricing) build {
	return func(url string, epoch time.Time) ([]member, chan struct{}, []string, error) {
		var ms []member
		var groups []string
		for _, s := range specs {
			w, err := r.env.newSluiceWorker(ctx, s, p, pricing, url, epoch, nil)
			if err != nil {
				return nil, nil, nil, err
			}
			ms = append(ms, w)
			groups = append(groups, s.group)
		}
		return ms, nil, groups, nil
	}
}

// capacityTrace samples a pool's capacity in force.
type capacityTrace struct {
	mu      sync.Mutex
	began   time.Time
	samples []capacitySample
}

type capacitySample struct {
	at       time.Duration
	capacity float64
}

// sample reads the pool's capacity every 500 ms until stop is called.
func (c *capacityTrace) sample(ctx context.Context, r *runner, pool string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	c.began = time.Now()
	client := r.env.redisClient(new(redisProbe))
	go func() {
		defer close(done)
		defer client.Close()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			st, err := lease.Status(ctx, client, "", pool)
			if err != nil {
				continue
			}
			c.mu.Lock()
			c.samples = append(c.samples, capacitySample{time.Since(c.began), st.Pool.Capacity})
			c.mu.Unlock()
		}
	}()
	return func() { cancel(); <-done }
}

// converged returns from when (since the first sample's start) the
// capacity stayed within 90-100 % of capacity, and the last capacity seen;
// the run's elapsed time when it never did.
func (c *capacityTrace) converged(capacity float64, elapsed time.Duration) (time.Duration, float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, final := time.Duration(-1), 0.0
	for _, s := range c.samples {
		final = s.capacity
		switch in := s.capacity >= 0.9*capacity && s.capacity <= capacity; {
		case in && at < 0:
			at = s.at
		case !in:
			at = -1
		}
	}
	if at < 0 {
		return elapsed, final
	}
	return at, final
}
