package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinksim"
)

// scenario5 is overhead: with an unthrottled sink, sluice's pipeline
// records/s against a bare kafka-go FetchMessage + CommitMessages loop on
// the same topic (1 KiB records).
func (r *runner) scenario5(ctx context.Context) ([]Scenario, error) {
	n := int64(200_000 * r.cfg.Scale)
	topic := r.env.name("s5")
	pad := strings.Repeat("x", 1024-80)
	t0 := time.Now()
	if err := r.env.produce(ctx, topic, 4, int(n), func(i int) ingest.Record {
		id := fmt.Sprintf("%s-%07d", topic, i)
		return ingest.Record{ID: id, Value: fmt.Appendf(nil, `{"id":%q,"seq":%d,"pad":%q}`, id, i, pad)}
	}); err != nil {
		return nil, err
	}
	r.log.Info("produced", "topic", topic, "records", n, "seconds", time.Since(t0).Seconds())
	const unthrottled = sinksim.MaxCapacity
	spec := workerSpec{topic: topic, records: n}
	sc := Scenario{ID: "5", Title: fmt.Sprintf("Overhead: %d records of 1 KiB, unthrottled sink", n),
		Notes: []string{
			"sluice: the full pipeline (one worker: consumer, leases, pacer, validation, batches of 100 over HTTP to the emulator at 10⁹ records/s, commits)",
			"raw: a bare kafka-go Reader loop, FetchMessage then CommitMessages every 100 messages (sluice's batch size), no sink",
			"overhead = sluice records/s ÷ raw records/s (ideal 1.000: the pipeline costs nothing beyond reading the queue)",
		}}
	if n < 200_000 {
		sc.Notes = append(sc.Notes, fmt.Sprintf("scaled down from the issue's 200,000 records to %d (--scale)", n))
	}
	ideal := time.Duration(0)
	var rawRate, sluiceRate []float64
	for i := range r.repsFor(ideal) {
		rate, err := r.rawLoop(ctx, topic, n)
		if err != nil {
			return nil, fmt.Errorf("raw: %w", err)
		}
		rawRate = append(rawRate, rate)
		p := pool{capacity: unthrottled, unit: ingest.UnitRecords, partitions: 20}
		t, err := r.trial(ctx, sinksim.Config{Capacity: unthrottled}, 5*time.Minute, r.sluiceMembers(ctx, r.withGroups([]workerSpec{spec}), p, ingest.Pricing{}))
		if err != nil {
			return nil, fmt.Errorf("sluice: %w", err)
		}
		sluiceRate = append(sluiceRate, float64(t.out.records)/t.out.elapsed.Seconds())
		r.log.Info("run done", "scenario", 5, "rep", i+1, "raw_records_per_s", rate, "sluice_records_per_s", sluiceRate[i])
	}
	var reps []Entry
	for i := range rawRate {
		reps = append(reps, Entry{Alternative: "sluice vs raw kafka-go", Reps: 1, Cols: []Col{
			{Name: "records", Value: float64(n)},
			{Name: "raw_records_per_s", Value: rawRate[i]},
			{Name: "sluice_records_per_s", Value: sluiceRate[i]},
			{Name: "overhead_ratio", Ideal: "1.000", Value: sluiceRate[i] / rawRate[i], Digits: 3},
		}})
	}
	sc.Entries = append(sc.Entries, median(reps))
	return []Scenario{sc}, nil
}

// rawLoop drains topic with a fresh group in a bare kafka-go loop and
// returns its records/s (first fetch to last commit).
func (r *runner) rawLoop(ctx context.Context, topic string, n int64) (float64, error) {
	reader := kafka.NewReader(kafka.ReaderConfig{
		Brokers: r.env.brokers, GroupID: r.env.name("raw"), Topic: topic,
		MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 50 * time.Millisecond,
		StartOffset: kafka.FirstOffset, CommitInterval: 0, ReadLagInterval: -1,
	})
	defer reader.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var first time.Time
	pending := make([]kafka.Message, 0, batchSize)
	for got := int64(0); got < n; {
		m, err := reader.FetchMessage(ctx)
		if err != nil {
			return 0, err
		}
		if first.IsZero() {
			first = time.Now()
		}
		got++
		pending = append(pending, m)
		if len(pending) == batchSize || got == n {
			if err := reader.CommitMessages(ctx, pending...); err != nil {
				return 0, err
			}
			pending = pending[:0]
		}
	}
	return float64(n) / time.Since(first).Seconds(), nil
}
