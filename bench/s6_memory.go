package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinksim"
)

// scenario6 is memory: the peak RSS (VmHWM) of a `sluice worker` process
// draining at 2,000 records/s for 20 s from a backlog of N and of 10 × N
// records. Records are dequeued only when there is capacity to write them,
// so the peak must not grow with the backlog.
func (r *runner) scenario6(ctx context.Context) ([]Scenario, error) {
	const (
		capacity = 2000
		runFor   = 20 * time.Second
	)
	base := int64(100_000 * r.cfg.Scale)
	sc := Scenario{ID: "6", Title: fmt.Sprintf("Memory: peak RSS of a worker process at backlog %d vs %d, 2,000 records/s for 20 s", base, 10*base),
		Notes: []string{
			"the worker is the `sluice worker` binary built from ./cmd/sluice, in its own process; peak RSS is its /proc/PID/status VmHWM after 20 s of draining",
			"records of about 100 bytes; each repetition reads the same backlog with a fresh consumer group and pool",
			"rss_ratio_vs_1x: peak RSS at this backlog ÷ at the smallest (ideal 1.00: flat)",
		}}
	if base < 100_000 {
		sc.Notes = append(sc.Notes, fmt.Sprintf("scaled down from the issue's 100,000 / 1,000,000 to %d / %d (--scale)", base, 10*base))
	}
	var first float64
	for _, n := range []int64{base, 10 * base} {
		topic := r.env.name("s6", fmt.Sprint(n))
		t0 := time.Now()
		if err := r.env.produce(ctx, topic, 4, int(n), smallRecord(topic)); err != nil {
			return nil, err
		}
		r.log.Info("produced", "topic", topic, "records", n, "seconds", time.Since(t0).Seconds())
		var reps []Entry
		for i := range r.repsFor(runFor) {
			rss, accepted, err := r.memoryRun(ctx, topic, capacity, runFor)
			if err != nil {
				return nil, err
			}
			reps = append(reps, Entry{Alternative: fmt.Sprintf("sluice worker, backlog %d", n), Reps: 1, Cols: []Col{
				{Name: "backlog_records", Value: float64(n)},
				{Name: "records_written", Ideal: fmt.Sprint(int(capacity * runFor.Seconds())), Value: float64(accepted)},
				{Name: "peak_rss_mib", Value: float64(rss) / (1 << 20), Digits: 1},
			}})
			r.log.Info("run done", "scenario", 6, "backlog", n, "rep", i+1, "peak_rss_mib", float64(rss)/(1<<20), "accepted", accepted)
		}
		e := median(reps)
		mib := e.Cols[2].Value
		if first == 0 {
			first = mib
		}
		e.Cols = append(e.Cols, Col{Name: "rss_ratio_vs_1x", Ideal: "1.00", Value: mib / first, Digits: 2})
		sc.Entries = append(sc.Entries, e)
	}
	return []Scenario{sc}, nil
}

// memoryRun runs a worker process on topic for runFor and returns its peak
// RSS and the records the sink accepted.
func (r *runner) memoryRun(ctx context.Context, topic string, capacity float64, runFor time.Duration) (int64, int64, error) {
	sim, err := startSim(ctx, sinksim.Config{Capacity: int64(capacity)})
	if err != nil {
		return 0, 0, err
	}
	defer sim.stop()
	p := pool{capacity: capacity, unit: ingest.UnitRecords, partitions: 20}
	w, err := r.env.startWorkerProcess(ctx, sim.url, p, r.env.name("pool"), r.env.name("proc"), workerSpec{topic: topic, group: r.env.name("g")})
	if err != nil {
		return 0, 0, err
	}
	defer w.stop()
	// Time the 20 s from the first acceptance, not from the process start.
	deadline := time.Now().Add(time.Minute)
	for sim.sim.Stats().Accepted == 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return 0, 0, context.Cause(ctx)
		case <-w.done:
			return 0, 0, fmt.Errorf("sluice worker exited: %v", w.err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		return 0, 0, context.Cause(ctx)
	case <-w.done:
		return 0, 0, fmt.Errorf("sluice worker exited: %v", w.err)
	case <-time.After(runFor):
	}
	rss, err := peakRSS(w.cmd.Process.Pid)
	return rss, sim.sim.Stats().Accepted, err
}
