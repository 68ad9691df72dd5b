package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinksim"
)

// s5Records is scenario 5's size at scale 1: the million records.
const s5Records = 1_000_000

// s5Size is the size of a scenario 5 record in bytes.
const s5Size = 1024

// scenario5 is overhead: with a sink that is never the limit, the worker's
// records/s against a bare kafka-go FetchMessage + CommitMessages loop on
// the same topic, in the same run: the worker into a sink that discards
// (the whole pipeline minus the network) and through the HTTP emulator;
// with each, allocations per record.
func (r *runner) scenario5(ctx context.Context) ([]Scenario, error) {
	n := int64(s5Records * r.cfg.Scale)
	// A real broker, as in scenario 9: a gigabyte of records does not
	// belong in an in-process one, and the raw loop is only a yardstick
	// against real Kafka.
	brokers, stopKafka, err := r.realKafka(ctx)
	if err != nil {
		return nil, err
	}
	defer stopKafka()
	defer r.env.useBrokers(brokers)()
	topic := r.env.name("s5")
	defer r.deleteTopics(brokers, []string{topic, topic + ".dlq"})
	values, err := s5Values(s5Size)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := r.env.produce(ctx, topic, 4, int(n), func(i int) ingest.Record {
		return ingest.Record{Value: s5Value(values, i)}
	}); err != nil {
		return nil, err
	}
	r.log.Info("produced", "topic", topic, "records", n, "seconds", time.Since(t0).Seconds())
	const unthrottled = sinksim.MaxCapacity
	sc := Scenario{ID: "5", Title: fmt.Sprintf("Overhead: %d records of 1 KiB, a sink that is never the limit", n),
		Notes: []string{
			"Kafka: a real broker (scripts/kafka.sh, started by the benchmark unless --real names one), 4 partitions; the topic is deleted afterwards",
			"records: the USGS rows as JSON objects, repeated with fresh IDs and padded to 1 KiB; the ID travels only in the \"id\" field, which the worker reads from every record (--id-field id), and every record is checked to be a JSON object",
			"raw: a bare kafka-go Reader loop, FetchMessage then CommitMessages every 100 messages (sluice's batch size), no sink",
			"discard: one sluice worker with the CLI's defaults (consumer, leases in Redis, pacer at 10⁹ records/s, ID and validation, batches of 100, commits) into a sink that answers every record stored at once",
			"http: the same worker through the HTTP emulator (in this process, so its own work shares the 2 cores and is in the allocation count)",
			"one untimed raw pass reads the topic before the first repetition (disk cache, broker warm-up); ratio = records/s ÷ the raw loop's in the same repetition; allocs/record = runtime.MemStats.Mallocs over the run ÷ records, cpu_us/record = the process's user + system CPU time over the run ÷ records (both for the whole process, the harness's bookkeeping included): on a shared machine the rates move with the load, the CPU per record much less",
		}}
	if n != s5Records {
		sc.Notes = append(sc.Notes, fmt.Sprintf("scaled from the issue's %d records to %d (--scale %g)", s5Records, n, r.cfg.Scale))
	}
	type result struct{ rate, allocs, cpu float64 }
	measure := func(run func() (float64, error)) (result, error) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		cpu0 := processCPU()
		rate, err := run()
		cpu := processCPU() - cpu0
		runtime.ReadMemStats(&after)
		return result{rate, float64(after.Mallocs-before.Mallocs) / float64(n), cpu.Seconds() * 1e6 / float64(n)}, err
	}
	worker := func(s ingest.Sink) func() (float64, error) {
		return func() (float64, error) {
			spec := workerSpec{topic: topic, records: n, sink: s}
			p := pool{capacity: unthrottled, unit: ingest.UnitRecords, partitions: 20}
			t, err := r.trial(ctx, sinksim.Config{Capacity: unthrottled}, 10*time.Minute, r.sluiceMembers(ctx, r.withGroups([]workerSpec{spec}), p, ingest.Pricing{}))
			if err != nil {
				return 0, err
			}
			if t.out.records != n {
				return 0, fmt.Errorf("finished %d records of %d", t.out.records, n)
			}
			return float64(t.out.records) / t.out.elapsed.Seconds(), nil
		}
	}
	// One untimed pass first, so that the first variant measured does not
	// pay alone for reading the topic from disk and the broker warming up.
	if _, err := r.rawLoop(ctx, topic, n); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var reps []Entry
	for i := range r.repsFor(0) {
		raw, err := measure(func() (float64, error) { return r.rawLoop(ctx, topic, n) })
		if err != nil {
			return nil, fmt.Errorf("raw: %w", err)
		}
		discard, err := measure(worker(discardSink{}))
		if err != nil {
			return nil, fmt.Errorf("discard: %w", err)
		}
		http, err := measure(worker(nil))
		if err != nil {
			return nil, fmt.Errorf("http: %w", err)
		}
		r.log.Info("run done", "scenario", 5, "rep", i+1, "raw_records_per_s", raw.rate,
			"discard_records_per_s", discard.rate, "http_records_per_s", http.rate,
			"raw_allocs", raw.allocs, "discard_allocs", discard.allocs, "http_allocs", http.allocs,
			"raw_cpu_us", raw.cpu, "discard_cpu_us", discard.cpu, "http_cpu_us", http.cpu)
		reps = append(reps, Entry{Alternative: "sluice vs raw kafka-go", Reps: 1, Cols: []Col{
			{Name: "records", Value: float64(n)},
			{Name: "raw_records_per_s", Value: raw.rate},
			{Name: "raw_allocs_per_record", Value: raw.allocs, Digits: 1},
			{Name: "raw_cpu_us_per_record", Value: raw.cpu, Digits: 2},
			{Name: "discard_records_per_s", Value: discard.rate},
			{Name: "discard_ratio", Ideal: "≥ 0.80", Value: discard.rate / raw.rate, Digits: 3},
			{Name: "discard_allocs_per_record", Ideal: "≤ 15", Value: discard.allocs, Digits: 1},
			{Name: "discard_cpu_us_per_record", Value: discard.cpu, Digits: 2},
			{Name: "http_records_per_s", Value: http.rate},
			{Name: "http_ratio", Ideal: "≥ 0.40", Value: http.rate / raw.rate, Digits: 3},
			{Name: "http_allocs_per_record", Value: http.allocs, Digits: 1},
			{Name: "http_cpu_us_per_record", Value: http.cpu, Digits: 2},
		}})
	}
	sc.Entries = append(sc.Entries, median(reps))
	return []Scenario{sc}, nil
}

// processCPU is the user + system CPU time the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// discardSink answers every record stored at once and keeps nothing: the
// worker's path without the network.
type discardSink struct{}

func (discardSink) Write(_ context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	return make([]ingest.Result, len(batch)), nil // the zero Result is Delivered
}

// s5Values returns the USGS rows as JSON objects (a column that parses as
// a number is a number, an empty one null), split around the ID: the text
// before it and the text after it.
func s5Values(size int) ([][2][]byte, error) {
	data, err := os.ReadFile(usgsPath)
	if err != nil {
		return nil, err
	}
	all, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", usgsPath, err)
	}
	header := all[0]
	out := make([][2][]byte, 0, len(all)-1)
	for _, row := range all[1:] {
		var before, after bytes.Buffer
		b := &before
		b.WriteByte('{')
		for i, v := range row {
			if i > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(header[i])
			b.Write(k)
			b.WriteByte(':')
			switch _, err := strconv.ParseFloat(v, 64); {
			case header[i] == "id":
				b.WriteByte('"')
				b.WriteString(v)
				b = &after // the ID's repetition suffix goes between
				b.WriteByte('"')
			case v == "":
				b.WriteString("null")
			case err == nil:
				b.WriteString(v)
			default:
				s, _ := json.Marshal(v)
				b.Write(s)
			}
		}
		if pad := size - before.Len() - after.Len() - len(`,"pad":""}`) - 8; pad > 0 {
			after.WriteString(`,"pad":"` + strings.Repeat("x", pad) + `"`)
		}
		after.WriteByte('}')
		out = append(out, [2][]byte{before.Bytes(), after.Bytes()})
	}
	return out, nil
}

// s5Value is record i: row i mod the rows, its ID suffixed "-k" on the
// k-th repetition.
func s5Value(values [][2][]byte, i int) []byte {
	v := values[i%len(values)]
	out := make([]byte, 0, len(v[0])+len(v[1])+8)
	out = append(out, v[0]...)
	if k := i / len(values); k > 0 {
		out = append(out, '-')
		out = strconv.AppendInt(out, int64(k), 10)
	}
	return append(out, v[1]...)
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
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
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
