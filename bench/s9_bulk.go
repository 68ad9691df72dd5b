package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/pgzip"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/semaphore"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sinksim"
)

// Scenario 9's settings.
const (
	// s9Capacity is the pool the bulk loads drain at, records/s: high for
	// a throttled service, and within what the two cores sustain while
	// they also produce and run the broker.
	s9Capacity = 25_000
	// s9Workers is the bulk loads' in-process workers.
	s9Workers = 2
	// s9RateRows is how many rows the producer rates (raw and sluice
	// produce) are measured on.
	s9RateRows = 1_000_000
	// s9InFlight is the records the raw loop keeps unanswered, as
	// queue.Producer does by default.
	s9InFlight = 10_000
)

// scenario9 is bulk loads of any size through real Kafka: the USGS rows
// repeated with fresh IDs, gzip-compressed, generated once into
// .cache/bench. It measures the producer against a raw kafka-go writer
// loop on the same records, and bulk-load's peak RSS and wall time against
// the longer of producing and draining, at 1,000,000 and 5,000,000 rows.
func (r *runner) scenario9(ctx context.Context) ([]Scenario, error) {
	rates := max(int(s9RateRows*r.cfg.Scale), 10_000)
	sizes := []int{max(int(1_000_000*r.cfg.Scale), 10_000), max(int(5_000_000*r.cfg.Scale), 50_000)}
	sc := Scenario{ID: "9", Title: fmt.Sprintf("Bulk loads of %d and %d USGS rows (.csv.gz) through real Kafka, drained at %d records/s", sizes[0], sizes[1], s9Capacity),
		Notes: []string{
			"input: testdata's 9,366 USGS rows repeated with fresh IDs (the k-th copy of id X is X-k), gzip-compressed, generated once into .cache/bench (not committed)",
			"Kafka: a real broker (scripts/kafka.sh, started by the benchmark unless --real names one), 6 partitions per topic, lz4 on the wire, RequireAll",
			fmt.Sprintf("raw: a bare kafka-go Writer (asynchronous, RequireAll, lz4 with the 64 KiB blocks package queue installs for sluice too, batches of 1,000 filled for up to 20 ms, at most %d records unanswered, as sluice's producer) writing the same records as sluice produces them (JSON, key and ID header), encoded beforehand: what the broker takes", s9InFlight),
			"raw lines: the same writer sending the .csv.gz's lines as they are (decompressed ahead, no parsing, messages of about 200 bytes instead of 520)",
			"sluice produce: the CLI reading, decompressing, parsing and encoding the .csv.gz and producing it; ratio_vs_raw = its rows/s ÷ raw's (the three measured alternately, medians)",
			fmt.Sprintf("bulk-load: the CLI with %d in-process workers and a pool of %d records/s, the sink emulator in the benchmark's process (not in bulk-load's RSS); peak RSS is the process's VmHWM, read every 50 ms until it exits", s9Workers, s9Capacity),
			"produce_s: first row read to the last acknowledgement by Kafka; drain_s: the records ÷ capacity; load_s: first row read to the last record delivered; load_vs_max = load_s ÷ max(produce_s, drain_s) (ideal 1.00 plus one 200 ms slice: draining while producing)",
		}}
	if r.cfg.Scale != 1 {
		sc.Notes = append(sc.Notes, fmt.Sprintf("scaled from 1,000,000 and 5,000,000 rows (--scale %v)", r.cfg.Scale))
	}
	brokers, stopKafka, err := r.realKafka(ctx)
	if err != nil {
		return nil, err
	}
	defer stopKafka()
	bin, err := r.env.sluiceBinary(ctx)
	if err != nil {
		return nil, err
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return nil, err
	}
	files := map[int]string{}
	for _, n := range append([]int{rates}, sizes...) {
		path := filepath.Join(root, ".cache", "bench", fmt.Sprintf("usgs-%d.csv.gz", n))
		if _, err := os.Stat(path); err != nil {
			t0 := time.Now()
			if err := GenerateUSGS(path, n); err != nil {
				return nil, fmt.Errorf("generate %s: %w", path, err)
			}
			r.log.Info("generated", "file", path, "rows", n, "seconds", time.Since(t0).Seconds())
		}
		files[n] = path
	}
	var topics []string
	defer func() { r.deleteTopics(brokers, topics) }()
	topic := func(parts ...string) string {
		t := r.env.name(parts...)
		topics = append(topics, t, queue.DeadLetterTopic(t))
		return t
	}

	// The producer against the raw writer, alternately.
	msgs, err := encodeRecords(files[rates])
	if err != nil {
		return nil, err
	}
	var raws, rawLines, produces []Entry
	newTopic := func(name string) (string, error) {
		t := topic(name)
		return t, queue.EnsureTopic(ctx, brokers, t, 6)
	}
	for i := range r.repsFor(0) {
		t, err := newTopic("s9-raw")
		if err != nil {
			return nil, err
		}
		raw, err := rawWriterLoop(ctx, brokers, t, func(yield func(kafka.Message) bool) error {
			for _, m := range msgs {
				if !yield(m) {
					break
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("raw writer: %w", err)
		}
		if t, err = newTopic("s9-raw-lines"); err != nil {
			return nil, err
		}
		lines, err := rawWriterLoop(ctx, brokers, t, fileLines(files[rates]))
		if err != nil {
			return nil, fmt.Errorf("raw writer of lines: %w", err)
		}
		pr, err := r.produceProcess(ctx, bin, brokers, topic("s9-produce"), files[rates])
		if err != nil {
			return nil, err
		}
		r.log.Info("run done", "scenario", 9, "rep", i+1, "raw_rows_per_s", raw, "raw_lines_per_s", lines,
			"produce_rows_per_s", pr.rowsPerS, "produce_peak_rss_mib", pr.rssMiB)
		raws = append(raws, Entry{Alternative: "raw kafka-go writer, the same records encoded beforehand", Reps: 1, Cols: []Col{
			{Name: "rows", Value: float64(len(msgs))},
			{Name: "rows_per_s", Value: raw},
		}})
		rawLines = append(rawLines, Entry{Alternative: "raw kafka-go writer, the .csv.gz's lines as they are", Reps: 1, Cols: []Col{
			{Name: "rows", Value: float64(len(msgs))},
			{Name: "rows_per_s", Value: lines},
		}})
		produces = append(produces, Entry{Alternative: "sluice produce, reading the .csv.gz", Reps: 1, Cols: []Col{
			{Name: "rows", Value: float64(pr.rows)},
			{Name: "rows_per_s", Value: pr.rowsPerS},
			{Name: "ratio_vs_raw", Ideal: "≥ 0.70", Value: pr.rowsPerS / raw, Digits: 2},
			{Name: "ratio_vs_raw_lines", Value: pr.rowsPerS / lines, Digits: 2},
			{Name: "peak_rss_mib", Value: pr.rssMiB, Digits: 1},
		}})
	}
	msgs = nil
	sc.Entries = append(sc.Entries, median(raws), median(rawLines), median(produces))

	// Bulk loads.
	for _, n := range sizes {
		e, err := r.bulkLoadProcess(ctx, bin, brokers, topic("s9-load"), files[n], n)
		if err != nil {
			return nil, err
		}
		sc.Entries = append(sc.Entries, e)
	}
	return []Scenario{sc}, nil
}

// realKafka returns the brokers of a real Kafka: --real's, else the one
// scripts/kafka.sh runs on Config.KafkaPort, started here (and stopped by
// stop) unless it was running.
func (r *runner) realKafka(ctx context.Context) (brokers []string, stop func(), err error) {
	if r.cfg.Real {
		return r.env.brokers, func() {}, nil
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return nil, nil, err
	}
	port := r.cfg.KafkaPort
	script := func(cmd string) *exec.Cmd {
		c := exec.Command(filepath.Join(root, "scripts", "kafka.sh"), cmd)
		c.Env = append(os.Environ(), "SLUICE_KAFKA_PORT="+strconv.Itoa(port), "SLUICE_KAFKA_CONTROLLER_PORT="+strconv.Itoa(port+1))
		c.Stderr = os.Stderr
		return c
	}
	brokers = []string{"127.0.0.1:" + strconv.Itoa(port)}
	if script("status").Run() == nil {
		r.log.Info("using the running Kafka broker", "brokers", brokers)
		return brokers, func() {}, nil
	}
	r.log.Info("starting a Kafka broker with scripts/kafka.sh", "port", port)
	if out, err := script("start").Output(); err != nil {
		return nil, nil, fmt.Errorf("scripts/kafka.sh start: %w\n%s", err, out)
	}
	return brokers, func() {
		if err := script("stop").Run(); err != nil {
			r.log.Warn("scripts/kafka.sh stop failed", "err", err)
		}
	}, nil
}

// deleteTopics deletes the scenario's topics, so repeated runs do not fill
// the broker's disk.
func (r *runner) deleteTopics(brokers, topics []string) {
	if len(topics) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := &kafka.Client{Addr: kafka.TCP(brokers...)}
	if _, err := c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics}); err != nil {
		r.log.Warn("deleting the scenario's topics failed", "err", err)
	}
}

// moduleRoot returns the repository's root directory.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("bench: find the module root (run from the repository): %v", err)
	}
	return filepath.Dir(mod), nil
}

// encodeRecords reads path as sluice does and returns its records as the
// Kafka messages sluice produces (key and sluice-id header = the ID).
func encodeRecords(path string) ([]kafka.Message, error) {
	in, err := bulkload.Open([]string{path}, bulkload.InputConfig{IDField: "id"})
	if err != nil {
		return nil, err
	}
	defer in.Close()
	var out []kafka.Message
	for {
		rec, err := in.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, kafka.Message{Key: rec.Key, Value: rec.Value, Headers: []kafka.Header{{Key: queue.HeaderID, Value: rec.Key}}})
	}
}

// fileLines yields the rows of a .csv.gz as messages whose value is the
// row's line, read as they come (gzip decompressed ahead, as sluice does).
func fileLines(path string) func(yield func(kafka.Message) bool) error {
	return func(yield func(kafka.Message) bool) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		z, err := pgzip.NewReaderN(f, 256<<10, 4)
		if err != nil {
			return err
		}
		defer z.Close()
		sc := bufio.NewScanner(z)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sc.Scan() // the header
		for sc.Scan() {
			if !yield(kafka.Message{Value: bytes.Clone(sc.Bytes())}) {
				break
			}
		}
		return sc.Err()
	}
}

// rawWriterLoop writes the messages of each to topic with a bare
// asynchronous kafka-go Writer, in calls of 500, at most s9InFlight
// unanswered, and returns the rows/s from the start to the last
// acknowledgement.
func rawWriterLoop(ctx context.Context, brokers []string, topic string, each func(yield func(kafka.Message) bool) error) (float64, error) {
	room := semaphore.NewWeighted(s9InFlight)
	var mu sync.Mutex
	var failed error
	// A transport of its own: a shared one's metadata may not know the
	// topic created a moment ago.
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.RoundRobin{}, RequiredAcks: kafka.RequireAll, Transport: transport,
		Async: true, BatchSize: 1000, BatchBytes: 1 << 20, BatchTimeout: 20 * time.Millisecond, Compression: kafka.Lz4,
		Completion: func(m []kafka.Message, err error) {
			if err != nil {
				mu.Lock()
				failed = errors.Join(failed, err)
				mu.Unlock()
			}
			room.Release(int64(len(m)))
		},
	}
	start := time.Now()
	const chunk = 500
	batch := make([]kafka.Message, 0, chunk)
	var n int
	var werr error
	write := func() bool {
		if len(batch) == 0 {
			return true
		}
		if werr = room.Acquire(ctx, int64(len(batch))); werr != nil {
			return false
		}
		if werr = w.WriteMessages(ctx, batch...); werr != nil {
			return false
		}
		n += len(batch)
		batch = make([]kafka.Message, 0, chunk)
		return true
	}
	err := each(func(m kafka.Message) bool {
		batch = append(batch, m)
		return len(batch) < chunk || write()
	})
	if err == nil && werr == nil {
		write()
	}
	if err = errors.Join(err, werr); err != nil {
		return 0, err
	}
	if err := room.Acquire(ctx, s9InFlight); err != nil { // every record answered
		return 0, err
	}
	elapsed := time.Since(start)
	if err := w.Close(); err != nil {
		return 0, err
	}
	if failed != nil {
		return 0, failed
	}
	return float64(n) / elapsed.Seconds(), nil
}

// produced is what a `sluice produce` process reported.
type producedRun struct {
	rows     int64
	rowsPerS float64
	rssMiB   float64
}

var producedLine = regexp.MustCompile(`read (\d+) rows: produced (\d+) records .*; ([0-9.]+) s, (\d+) rows/s`)

// produceProcess runs `sluice produce` on path into topic.
func (r *runner) produceProcess(ctx context.Context, bin string, brokers []string, topic, path string) (producedRun, error) {
	cmd := exec.CommandContext(ctx, bin, "produce", "--brokers", strings.Join(brokers, ","), "--topic", topic,
		"--id-field", "id", "--log-level", "warn", path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	rss, err := runWatchingRSS(cmd)
	if err != nil {
		return producedRun{}, fmt.Errorf("sluice produce: %w\n%s", err, out.String())
	}
	m := producedLine.FindStringSubmatch(out.String())
	if m == nil {
		return producedRun{}, fmt.Errorf("sluice produce: unexpected output %q", out.String())
	}
	read, _ := strconv.ParseInt(m[1], 10, 64)
	done, _ := strconv.ParseInt(m[2], 10, 64)
	if read != done {
		return producedRun{}, fmt.Errorf("sluice produce: %d rows read, %d produced", read, done)
	}
	rate, _ := strconv.ParseFloat(m[4], 64)
	return producedRun{rows: done, rowsPerS: rate, rssMiB: rss}, nil
}

// runWatchingRSS runs cmd and returns its peak RSS in MiB: its VmHWM,
// read every 50 ms until it exits (the peak since its exec; the rusage
// maxrss of a child counts the parent's pages it shared before exec).
func runWatchingRSS(cmd *exec.Cmd) (float64, error) {
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var peak int64
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return float64(peak) / (1 << 20), err
		case <-tick.C:
			if hwm, err := peakRSS(cmd.Process.Pid); err == nil {
				peak = max(peak, hwm)
			}
		}
	}
}

// bulkLoadProcess runs `sluice bulk-load` of path (n rows) into the
// emulator and returns its entry.
func (r *runner) bulkLoadProcess(ctx context.Context, bin string, brokers []string, topic, path string, n int) (Entry, error) {
	sim, err := startSim(ctx, sinksim.Config{Capacity: s9Capacity})
	if err != nil {
		return Entry{}, err
	}
	defer sim.stop()
	summary := filepath.Join(r.cfg.WorkDir, topic+"-summary.json")
	cmd := exec.CommandContext(ctx, bin, "bulk-load", "--brokers", strings.Join(brokers, ","), "--redis-addr", r.env.redisAddr,
		"--sink", sim.url, "--pool", r.env.name("s9-pool"), "--capacity", strconv.Itoa(s9Capacity), "--partitions", "20",
		"--workers", strconv.Itoa(s9Workers), "--topic", topic, "--id-field", "id", "--batch-size", "500",
		"--summary-json", summary, "--dead-letter-file", filepath.Join(r.cfg.WorkDir, topic+".dlq.ndjson"), "--log-level", "warn", path)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	t0 := time.Now()
	rss, err := runWatchingRSS(cmd)
	if err != nil {
		return Entry{}, fmt.Errorf("sluice bulk-load of %d rows: %w", n, err)
	}
	wall := time.Since(t0)
	data, err := os.ReadFile(summary)
	if err != nil {
		return Entry{}, err
	}
	var s bulkload.Summary
	if err := json.Unmarshal(data, &s); err != nil {
		return Entry{}, err
	}
	st := sim.sim.Stats()
	if st.Accepted != int64(n) {
		return Entry{}, fmt.Errorf("bulk-load of %d rows: the sink stored %d", n, st.Accepted)
	}
	drain := float64(n) / s9Capacity
	r.log.Info("run done", "scenario", 9, "rows", n, "peak_rss_mib", rss, "produce_s", s.ProduceS, "load_s", s.LoadS,
		"drain_s", drain, "wall_s", wall.Seconds(), "duplicates", st.Duplicates)
	return Entry{Alternative: fmt.Sprintf("sluice bulk-load, %d rows", n), Reps: 1, Cols: []Col{
		{Name: "rows", Value: float64(n)},
		{Name: "peak_rss_mib", Ideal: "flat in the rows", Value: rss, Digits: 1},
		{Name: "produce_rows_per_s", Value: s.ProduceRowsPerS},
		{Name: "produce_s", Value: s.ProduceS, Digits: 1},
		{Name: "drain_s", Value: drain, Digits: 1},
		{Name: "load_s", Value: s.LoadS, Digits: 1},
		{Name: "load_vs_max", Ideal: "1.00", Value: s.LoadS / max(s.ProduceS, drain), Digits: 3},
		{Name: "drain_start_s", Value: s.DrainStartS, Digits: 2},
		{Name: "wall_s", Value: wall.Seconds(), Digits: 1},
		{Name: "stored_once", Ideal: fmt.Sprint(n), Value: float64(st.Accepted)},
		{Name: "duplicates_at_sink", Value: float64(st.Duplicates)},
	}}, nil
}
