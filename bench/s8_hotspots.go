package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/recordtype"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/sinkwire"
)

// usgsPath is the real input, relative to the repository root (where make
// bench runs).
const usgsPath = "testdata/usgs-earthquakes-2025-05.csv"

// usgsReplicated returns n records made of the USGS events, oldest first,
// copied as often as needed: copy k has its IDs suffixed "-k" and its times
// shifted by k × 31 days, so "time" keeps growing as in a live feed.
func usgsReplicated(n int) ([]ingest.Record, error) {
	f, err := bulkload.OpenFile(usgsPath, "csv", "id")
	if err != nil {
		return nil, fmt.Errorf("%w (run the benchmarks from the repository root)", err)
	}
	type event struct {
		at  time.Time
		obj map[string]any
	}
	var events []event
	for {
		rec, err := f.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		var obj map[string]any
		if err := json.Unmarshal(rec.Value, &obj); err != nil {
			return nil, err
		}
		ts, _ := obj["time"].(string)
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return nil, fmt.Errorf("%s: record %s: time %q: %w", usgsPath, rec.ID, ts, err)
		}
		events = append(events, event{at, obj})
	}
	slices.SortStableFunc(events, func(a, b event) int { return a.at.Compare(b.at) })
	out := make([]ingest.Record, n)
	for i := range out {
		e, k := events[i%len(events)], i/len(events)
		obj := make(map[string]any, len(e.obj))
		for key, v := range e.obj {
			obj[key] = v
		}
		id := fmt.Sprintf("%s-%d", obj["id"], k)
		obj["id"] = id
		obj["time"] = e.at.Add(time.Duration(k) * 31 * 24 * time.Hour).UTC().Format("2006-01-02T15:04:05.000Z")
		value, err := json.Marshal(obj)
		if err != nil {
			return nil, err
		}
		out[i] = ingest.Record{ID: id, Key: []byte(id), Value: value}
	}
	return out, nil
}

// scenario8 is hotspot-free writes: 100,000 USGS records at 10,000
// records/s into an emulator whose key ranges take 2,000 ops/s each and
// split after 1 s of heat (the condition the hotspot targets are set for;
// the emulator's default is 5 s), with the sink key {time}/{id} under each
// strategy, and in file order vs bulk-load's interleaved order.
func (r *runner) scenario8(ctx context.Context) ([]Scenario, error) {
	const (
		records        = 100_000
		capacity       = 10_000
		partitionLimit = sinksim.DefaultPartitionLimit
		splitAfter     = time.Second
		template       = "{time}/{id}"
	)
	ideal := secs(float64(records) / capacity)
	recs, err := usgsReplicated(records)
	if err != nil {
		return nil, err
	}
	ordered := r.env.name("s8", "file")
	if err := r.env.produce(ctx, ordered, 8, records, func(i int) ingest.Record { return recs[i] }); err != nil {
		return nil, err
	}
	none, err := recordtype.NewSinkKey(template, "none")
	if err != nil {
		return nil, err
	}
	rows, err := bulkload.Interleave(&recordRows{recs: recs}, func(rec ingest.Record) (string, error) { return none.Key(rec.Value) }, 0)
	if err != nil {
		return nil, err
	}
	var mixed []ingest.Record
	for rec, err := rows.Next(); err == nil; rec, err = rows.Next() {
		mixed = append(mixed, rec)
	}
	interleaved := r.env.name("s8", "interleave")
	if err := r.env.produce(ctx, interleaved, 8, records, func(i int) ingest.Record { return mixed[i] }); err != nil {
		return nil, err
	}

	simCfg := sinksim.Config{Capacity: capacity, Unit: ingest.UnitRecords, PartitionLimit: partitionLimit, SplitAfter: splitAfter, MaxPartitions: sinksim.DefaultMaxPartitions}
	p := pool{capacity: capacity, unit: ingest.UnitRecords, partitions: 20}
	sc := Scenario{ID: "8", Title: "Hotspots: 100,000 USGS records at 10,000 records/s into 2,000 ops/s key ranges, by sink key strategy",
		Notes: []string{
			"the USGS events oldest first, copied with times shifted a month per copy (time grows throughout), in an 8-partition topic; one sluice worker, pool 10,000 records/s in 20 partitions",
			"the emulator: 10,000 records/s overall; keys ordered lexicographically in ranges of 2,000 ops/s (Azure Tables' and OSS's per-partition figure); a range hot for 1 s splits at the median of its recent keys, up to 64",
			"sink key {time}/{id} through each strategy; interleave: strategy none, records produced in bulk-load --order interleave order",
			"throttled_429: record attempts refused (by a hot range); the worker holds only the records headed to a range it found hot, at the rate that range accepted, and retries the refused ones there",
			"last_quarter_records_per_s: the accepted rate over the last quarter of the run, once the ranges have split (records_per_s includes the seconds of splitting)",
		}}
	runs := []struct{ label, strategy, topic string }{
		{"none", "none", ordered},
		{"hash-prefix:4", "hash-prefix:4", ordered},
		{"reverse", "reverse", ordered},
		{"shard:16", "shard:16", ordered},
		{"none, interleaved", "none", interleaved},
	}
	for _, run := range runs {
		sk, err := recordtype.NewSinkKey(template, run.strategy)
		if err != nil {
			return nil, err
		}
		specs := []workerSpec{{topic: run.topic, records: records, processor: sk.Processor()}}
		var reps []Entry
		for i := range r.repsFor(ideal) {
			t, err := r.trial(ctx, simCfg, 15*ideal+30*time.Second, r.sluiceMembers(ctx, r.withGroups(specs), p, ingest.Pricing{Unit: ingest.UnitRecords}))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", run.label, err)
			}
			if i == 0 {
				r.addLine("s8", run.label, t.snap.UnitsPer200ms, capacity)
			}
			hottest := slices.MaxFunc(t.snap.Partitions, func(a, b sinkwire.PartitionStats) int { return cmp.Compare(a.Accepted, b.Accepted) })
			reps = append(reps, Entry{Alternative: run.label, Reps: 1, Cols: append([]Col{
				{Name: "records", Value: float64(t.out.records)},
				{Name: "ideal_s", Value: ideal.Seconds(), Digits: 2},
				{Name: "elapsed_s", Value: t.out.elapsed.Seconds(), Digits: 2},
				{Name: "records_per_s", Ideal: fmt.Sprint(capacity), Value: float64(t.out.records) / t.out.elapsed.Seconds()},
				{Name: "utilization", Ideal: "1.000", Value: utilization(ideal, t.out.elapsed), Digits: 3},
				{Name: "throttled_429", Ideal: "0", Value: float64(t.snap.Throttled)},
				{Name: "last_quarter_records_per_s", Ideal: fmt.Sprint(capacity), Value: lastQuarterRate(t.snap.UnitsPer200ms)},
				{Name: "ranges", Value: float64(len(t.snap.Partitions))},
				{Name: "hottest_range_share", Value: float64(hottest.Accepted) / float64(max(t.snap.Accepted, 1)), Digits: 3},
			}, rateCols(t, capacity)...)})
			r.log.Info("run done", "scenario", 8, "strategy", run.label, "rep", i+1, "elapsed_s", t.out.elapsed.Seconds(), "throttled", t.snap.Throttled, "ranges", len(t.snap.Partitions))
		}
		sc.Entries = append(sc.Entries, median(reps))
	}
	return []Scenario{sc}, nil
}

// recordRows yields records held in memory.
type recordRows struct{ recs []ingest.Record }

func (r *recordRows) Next() (ingest.Record, error) {
	if len(r.recs) == 0 {
		return ingest.Record{}, io.EOF
	}
	rec := r.recs[0]
	r.recs = r.recs[1:]
	return rec, nil
}

// lastQuarterRate is the mean accepted rate, in records/s, over the last
// quarter of the 200 ms buckets from the first to the last non-empty one.
func lastQuarterRate(per200ms []int64) float64 {
	first := slices.IndexFunc(per200ms, func(n int64) bool { return n > 0 })
	if first < 0 {
		return 0
	}
	last := len(per200ms) - 1
	for per200ms[last] == 0 {
		last--
	}
	span := per200ms[first : last+1]
	tail := span[len(span)*3/4:]
	var sum int64
	for _, n := range tail {
		sum += n
	}
	return float64(sum) / (float64(len(tail)) * 0.2)
}
