package bench

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinksim"
)

// scenario1 is the pattern's own example: 10,000 records of 10 RU into a
// sink provisioned at 20,000 RU/s. naive sends everything and resends what
// was rejected (after the policy's backoff and the sink's Retry-After);
// sluice leases and paces. Ideal: 10,000 attempts, no 429, 5 s.
func (r *runner) scenario1(ctx context.Context) ([]Scenario, error) {
	const (
		records  = 10_000
		cost     = 10
		capacity = 20_000
	)
	ideal := secs(float64(records*cost) / capacity)
	topic := r.env.name("s1")
	if err := r.env.produce(ctx, topic, 4, records, smallRecord(topic)); err != nil {
		return nil, err
	}
	pricing := ingest.Pricing{Unit: ingest.UnitCost, PerRecord: cost}
	simCfg := sinksim.Config{Capacity: capacity, Unit: ingest.UnitCost}
	specs := []workerSpec{{topic: topic, records: records}}
	p := pool{capacity: capacity, unit: ingest.UnitCost, partitions: 20}
	sc := Scenario{ID: "1", Title: "Naive retry vs rate limiting: 10,000 records × 10 RU into 20,000 RU/s",
		Notes: []string{
			"one worker, one 4-partition topic; the sink is the emulator in bucket mode (one second of capacity, like a per-second RU budget)",
			"naive: no client-side limit, batches of 100, 16 in flight, rejected records retried with the project's backoff policy honouring Retry-After",
			"elapsed_s: first fetch to last acknowledgement; max_1s_window: most RU the sink accepted in any sliding second ÷ capacity",
		}}
	alts := []struct {
		name string
		b    func() build
	}{
		{"naive", func() build { return r.peerMembers(r.withGroups(specs), pricing, nil) }},
		{"sluice", func() build { return r.sluiceMembers(ctx, r.withGroups(specs), p, pricing) }},
	}
	for _, alt := range alts {
		var reps []Entry
		for i := range r.repsFor(ideal) {
			t, err := r.trial(ctx, simCfg, 10*ideal+30e9, alt.b())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", alt.name, err)
			}
			if i == 0 {
				r.addLine("s1", alt.name, t.snap.UnitsPer200ms, capacity)
			}
			reps = append(reps, Entry{Alternative: alt.name, Reps: 1, Cols: append([]Col{
				{Name: "records", Value: float64(t.out.records)},
				{Name: "sink_record_attempts", Ideal: fmt.Sprint(records), Value: float64(t.snap.Records)},
				{Name: "throttled_429", Ideal: "0", Value: float64(t.snap.Throttled)},
				{Name: "ideal_s", Value: ideal.Seconds(), Digits: 2},
				{Name: "elapsed_s", Value: t.out.elapsed.Seconds(), Digits: 2},
				{Name: "utilization", Ideal: "1.000", Value: utilization(ideal, t.out.elapsed), Digits: 3},
			}, rateCols(t, capacity)...)})
			r.log.Info("run done", "scenario", 1, "alternative", alt.name, "rep", i+1, "elapsed_s", t.out.elapsed.Seconds(), "throttled", t.snap.Throttled)
		}
		sc.Entries = append(sc.Entries, median(reps))
	}
	return []Scenario{sc}, nil
}
