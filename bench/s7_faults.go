package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sinksim"
)

// Scenario 7's pool: 2,000 records/s in 20 partitions, 15 s leases, two
// workers each with a backlog that outlasts the run.
const (
	faultCapacity = 2000
	faultBacklog  = 60_000
)

// scenario7 is reaction and reclaim. Reaction: a worker holding 10 of 20
// partitions loses Redis access (its client is cut by a hook, as by a
// network partition); its leases stop counting at the first failed renewal
// and the time from then until the sink accepts nothing more from it is
// measured. Reclaim: a `sluice worker` process holding 10 partitions is
// killed (SIGKILL, no unlock); the time until its peer's leased rate is the
// whole pool again is measured against the physical limit, the TTL its
// leases still had in Redis.
func (r *runner) scenario7(ctx context.Context) ([]Scenario, error) {
	var specs []workerSpec
	for i := range 2 {
		topic := r.env.name("s7", fmt.Sprint(i))
		if err := r.env.produce(ctx, topic, 4, faultBacklog, smallRecord(topic)); err != nil {
			return nil, err
		}
		specs = append(specs, workerSpec{topic: topic, records: faultBacklog})
	}
	p := pool{capacity: faultCapacity, unit: ingest.UnitRecords, partitions: 20, ttl: 15 * time.Second}
	sc := Scenario{ID: "7", Title: "Reaction and reclaim: 2,000 records/s, 20 partitions, 15 s leases, two workers with a backlog each",
		Notes: []string{
			"reaction: worker A (10 of 20 partitions) is cut off Redis; lease_invalid_after_cut_s is the cut to A's first lease no longer counting (its next renewal fails, at most TTL/3 = 5 s after the last one); reaction_s is from then to A's last record accepted by the sink, 0 when nothing of A's was accepted after it (ideal: in-flight requests only, ≤ one 200 ms slice); units_accepted_after_invalid counts them",
			"reclaim: worker A is a `sluice worker` process, killed with SIGKILL; reclaim_s is the kill to the in-process peer B leasing the whole pool; ideal_s is the longest TTL A's leases still had in Redis at the kill (B cannot safely take them sooner)",
			"max_1s_window: the sink's most units in any sliding second ÷ capacity over the whole run, across the hand-over",
		}}
	var reaction, reclaim []Entry
	for i := range r.repsFor(20 * time.Second) {
		e, err := r.reactionRun(ctx, specs, p)
		if err != nil {
			return nil, fmt.Errorf("reaction: %w", err)
		}
		reaction = append(reaction, e)
		r.log.Info("run done", "scenario", "7 reaction", "rep", i+1)
		e, err = r.reclaimRun(ctx, specs, p, i == 0)
		if err != nil {
			return nil, fmt.Errorf("reclaim: %w", err)
		}
		reclaim = append(reclaim, e)
		r.log.Info("run done", "scenario", "7 reclaim", "rep", i+1)
	}
	sc.Entries = append(sc.Entries, median(reaction), median(reclaim))
	return []Scenario{sc}, nil
}

// waitFor polls cond every 5 ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

func (r *runner) reactionRun(ctx context.Context, specs []workerSpec, p pool) (Entry, error) {
	sim, err := startSim(ctx, sinksim.Config{Capacity: faultCapacity})
	if err != nil {
		return Entry{}, err
	}
	defer sim.stop()
	b := r.sluiceMembers(ctx, r.withGroups(specs), p, ingest.Pricing{})
	ms, start, groups, err := b(sim.url, sim.sim.Snapshot(true).SeriesStart)
	if err != nil {
		return Entry{}, err
	}
	a, peer := ms[0].(*sluiceWorker), ms[1].(*sluiceWorker)
	jctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, 2)
	for _, m := range ms {
		go func() { errs <- m.run(jctx) }()
	}
	defer func() {
		cancel()
		<-errs
		<-errs
	}()
	r.env.awaitGroups(jctx, groups)
	close(start)
	half := faultCapacity / 2.0
	if err := waitFor(ctx, 30*time.Second, func() bool {
		now := time.Now()
		return a.w.Lease().Rate(now) == half && peer.w.Lease().Rate(now) == half
	}); err != nil {
		return Entry{}, fmt.Errorf("workers did not settle at 10 partitions each: %w", err)
	}
	time.Sleep(2 * time.Second) // steady state
	cut := time.Now()
	a.probe.cut.Store(true)
	var firstDrop time.Time
	if err := waitFor(ctx, 20*time.Second, func() bool {
		rate := a.w.Lease().Rate(time.Now())
		if rate < half && firstDrop.IsZero() {
			firstDrop = time.Now()
		}
		return rate == 0
	}); err != nil {
		return Entry{}, fmt.Errorf("A's leases kept counting: %w", err)
	}
	invalid := time.Now()
	time.Sleep(2 * time.Second) // let in-flight requests finish
	last := a.tally.lastAccepted()
	reaction := max(last.Sub(invalid), 0)
	after := sumUntil(a.tally, time.Now()) - sumUntil(a.tally, invalid)
	snap := sim.sim.Snapshot(false)
	return Entry{Alternative: "sluice: reaction (Redis lost)", Reps: 1, Cols: []Col{
		{Name: "lease_invalid_after_cut_s", Value: firstDrop.Sub(cut).Seconds(), Digits: 3},
		{Name: "reaction_s", Ideal: "≤ 0.200", Value: reaction.Seconds(), Digits: 3},
		{Name: "units_accepted_after_invalid", Ideal: "in-flight only", Value: float64(after)},
		{Name: "max_1s_window", Ideal: "≤ 1.000", Value: float64(snap.MaxUnits1s) / faultCapacity, Digits: 3},
		{Name: "throttled_429", Ideal: "0", Value: float64(snap.Throttled)},
	}}, nil
}

func (r *runner) reclaimRun(ctx context.Context, specs []workerSpec, p pool, chart bool) (Entry, error) {
	sim, err := startSim(ctx, sinksim.Config{Capacity: faultCapacity})
	if err != nil {
		return Entry{}, err
	}
	defer sim.stop()
	specs = r.withGroups(specs)
	poolName := r.env.name("pool")
	lp := p.lease(poolName)
	procID := r.env.name("proc")
	proc, err := r.env.startWorkerProcess(ctx, sim.url, p, poolName, procID, specs[0])
	if err != nil {
		return Entry{}, err
	}
	defer func() {
		select {
		case <-proc.done:
		default:
			proc.kill()
		}
	}()
	// Let the process store the pool first, then start the in-process peer
	// (a pod: leases on demand).
	status := r.env.redisClient(nil)
	defer status.Close()
	if err := waitFor(ctx, 30*time.Second, func() bool {
		_, err := lease.Status(ctx, status, "", poolName)
		return err == nil
	}); err != nil {
		return Entry{}, fmt.Errorf("the worker process did not define the pool: %w", err)
	}
	peer, err := r.env.newSluiceWorker(ctx, specs[1], lp, ingest.Pricing{}, sim.url, sim.sim.Snapshot(true).SeriesStart, nil)
	if err != nil {
		return Entry{}, err
	}
	jctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- peer.run(jctx) }()
	defer func() { cancel(); <-done }()

	held := func() int {
		st, err := lease.Status(ctx, status, "", poolName)
		if err != nil {
			return -1
		}
		n := 0
		for _, pt := range st.Partitions {
			if strings.HasPrefix(pt.Holder, procID) {
				n++
			}
		}
		return n
	}
	if err := waitFor(ctx, 40*time.Second, func() bool {
		return held() == 10 && peer.w.Lease().Rate(time.Now()) == faultCapacity/2
	}); err != nil {
		return Entry{}, fmt.Errorf("workers did not settle at 10 partitions each (process holds %d): %w", held(), err)
	}
	time.Sleep(2 * time.Second) // steady state
	kill := time.Now()
	proc.kill()
	st, err := lease.Status(ctx, status, "", poolName)
	if err != nil {
		return Entry{}, err
	}
	var ideal time.Duration
	for _, pt := range st.Partitions {
		if strings.HasPrefix(pt.Holder, procID) {
			ideal = max(ideal, pt.TTLLeft)
		}
	}
	if err := waitFor(ctx, 30*time.Second, func() bool { return peer.w.Lease().Rate(time.Now()) == faultCapacity }); err != nil {
		return Entry{}, fmt.Errorf("peer did not reclaim the pool: %w", err)
	}
	reclaimed := time.Now()
	time.Sleep(2 * time.Second)
	snap := sim.sim.Snapshot(true)
	if chart {
		r.addLine("s7-reclaim", "total accepted (kill at "+fmt.Sprintf("%.1f s", kill.Sub(snap.SeriesStart).Seconds())+")", snap.UnitsPer200ms, faultCapacity)
	}
	return Entry{Alternative: "sluice: reclaim (worker killed)", Reps: 1, Cols: []Col{
		{Name: "ideal_s", Value: ideal.Seconds(), Digits: 3},
		{Name: "reclaim_s", Value: reclaimed.Sub(kill).Seconds(), Digits: 3},
		{Name: "reclaim_over_ideal_s", Ideal: "≤ 0.200", Value: reclaimed.Sub(kill).Seconds() - ideal.Seconds(), Digits: 3},
		{Name: "max_1s_window", Ideal: "≤ 1.000", Value: float64(snap.MaxUnits1s) / faultCapacity, Digits: 3},
		{Name: "throttled_429", Ideal: "0", Value: float64(snap.Throttled)},
	}}, nil
}
