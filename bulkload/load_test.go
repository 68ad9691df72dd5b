package bulkload_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/pipeline"
)

// memTopic is an in-memory topic of one partition, its consumer group's
// committed offset, and a producer that refuses records over maxBytes.
type memTopic struct {
	// gate, when set, holds every Produce call after the first until it
	// is closed.
	gate      chan struct{}
	calls     int
	mu        sync.Mutex
	recs      []ingest.Record
	committed int64
	members   int
	maxBytes  int
	failAfter int           // Produce fails once this many records are in (0: never)
	delay     time.Duration // each Produce call takes this long
}

func (m *memTopic) Produce(ctx context.Context, _ string, recs []ingest.Record) error {
	time.Sleep(m.delay)
	m.mu.Lock()
	m.calls++
	gate := m.gate
	if m.calls == 1 {
		gate = nil
	}
	m.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(30 * time.Second):
			return errors.New("the file was held after its first chunk and nobody drained it")
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failAfter > 0 && len(m.recs)+len(recs) > m.failAfter {
		return errors.New("broker down")
	}
	m.recs = append(m.recs, recs...)
	return nil
}

func (m *memTopic) Fits(rec ingest.Record) error {
	if m.maxBytes > 0 && len(rec.Value) > m.maxBytes {
		return fmt.Errorf("%d bytes, the limit is %d", len(rec.Value), m.maxBytes)
	}
	return nil
}

func (m *memTopic) EndOffsets(context.Context, string) (map[int]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return map[int]int64{0: int64(len(m.recs))}, nil
}

func (m *memTopic) CommittedOffsets(context.Context, string, string) (map[int]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return map[int]int64{0: m.committed}, nil
}

func (m *memTopic) GroupMembers(context.Context, string) (int, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.members, true, nil
}

// standIn is a worker stack that runs f and leases nothing.
type standIn func(ctx context.Context) error

func (f standIn) Run(ctx context.Context) error { return f(ctx) }
func (standIn) Rate(time.Time) float64          { return 0 }

// drain is a stand-in worker: it delivers what is produced and commits it,
// counting into c, dead-lettering records whose ID starts with "bad".
func (m *memTopic) drain(c *ingest.Counters, dlq *memDLQ) bulkload.Worker {
	return standIn(func(ctx context.Context) error {
		m.mu.Lock()
		m.members++
		m.mu.Unlock()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Millisecond):
			}
			m.mu.Lock()
			for ; m.committed < int64(len(m.recs)); m.committed++ {
				rec := m.recs[m.committed]
				if strings.HasPrefix(rec.ID, "bad") {
					_ = dlq.DeadLetter(ctx, ingest.DeadLetter{Record: rec, Reason: "refused"})
					c.Add(ingest.Totals{DeadLettered: 1})
				} else {
					c.Add(ingest.Totals{Delivered: 1, UnitsDelivered: 1})
				}
			}
			m.mu.Unlock()
		}
	})
}

type memDLQ struct {
	mu      sync.Mutex
	letters []ingest.DeadLetter
}

func (d *memDLQ) DeadLetter(_ context.Context, ls ...ingest.DeadLetter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.letters = append(d.letters, ls...)
	return nil
}

func ndjsonFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in.ndjson")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

func open(t *testing.T, path string) *bulkload.Input {
	t.Helper()
	f, err := bulkload.OpenFile(path, "", "id")
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func digest(t *testing.T, path string) []byte {
	t.Helper()
	d, err := open(t, path).Digest()
	require.NoError(t, err)
	return d
}

// Rows that cannot be produced — malformed, without an ID, too large for a
// Kafka message — are dead-lettered with their file:line; their neighbours
// are produced; only acknowledged records count; repeated IDs are counted
// and named.
func TestProduceDeadLettersWhatCannotBeProduced(t *testing.T) {
	t.Parallel()
	path := ndjsonFile(t,
		`{"id":"a"}`,
		`{"id":"b","pad":"`+strings.Repeat("x", 200)+`"}`,
		`not json`,
		`{"n":4}`,
		`{"id":"a","again":true}`,
		`{"id":"c"}`,
	)
	topic, dlq := &memTopic{maxBytes: 100}, &memDLQ{}
	p, err := bulkload.Produce(t.Context(), open(t, path), topic, dlq, bulkload.ProduceConfig{Topic: "t", Chunk: 2})
	require.NoError(t, err)
	require.Positive(t, p.Elapsed)
	require.False(t, p.Started.IsZero())
	p.Elapsed, p.Started = 0, time.Time{}
	require.Equal(t, bulkload.Produced{Read: 6, Produced: 3, DeadLettered: 3, Done: 6, DuplicateIDs: 1, DuplicateIDExamples: []string{"a"},
		Files: []bulkload.FileCounts{{Name: path, Rows: 6, Produced: 3, DeadLettered: 3}}}, p)
	require.Len(t, topic.recs, 3)
	reasons := make([]string, len(dlq.letters))
	for i, l := range dlq.letters {
		reasons[i] = l.Reason
		require.Equal(t, "t", l.Record.Pos.Topic)
	}
	require.Equal(t, []string{
		path + ":2: 219 bytes, the limit is 100",
		path + ":3: not a JSON object",
		path + `:4: ingest: no record ID: field "id" is missing`,
	}, reasons)
}

// The count is exact when the broker fails: only acknowledged chunks.
func TestProduceCountsOnlyAcknowledgedRecords(t *testing.T) {
	t.Parallel()
	lines := make([]string, 10)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":"r%d"}`, i)
	}
	topic := &memTopic{failAfter: 5}
	p, err := bulkload.Produce(t.Context(), open(t, ndjsonFile(t, lines...)), topic, &memDLQ{}, bulkload.ProduceConfig{Topic: "t", Chunk: 4})
	require.ErrorContains(t, err, "broker down")
	require.EqualValues(t, 4, p.Produced)
}

func TestParseDeadLetterLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in         string
		dead, read int64
		allows     bool
	}{
		{"0", 1, 1000, false},
		{"10", 10, 1000, true},
		{"10", 11, 1000, false},
		{"1%", 100, 100, true}, // at least 100
		{"1%", 101, 1000, false},
		{"1%", 150, 20000, true},
		{"50%", 5000, 10000, true},
		{"none", 1 << 40, 1, true},
	} {
		l, err := bulkload.ParseDeadLetterLimit(tt.in)
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.allows, l.Allows(tt.dead, tt.read), "%s: %d of %d", tt.in, tt.dead, tt.read)
	}
	for _, bad := range []string{"", "-1", "0%", "101%", "lots"} {
		_, err := bulkload.ParseDeadLetterLimit(bad)
		require.Error(t, err, bad)
	}
}

func TestCheckFieldsNamesTheMissingOne(t *testing.T) {
	t.Parallel()
	require.NoError(t, bulkload.CheckFields([]string{"id", "time"}, map[string]string{"id": "--id-field", "time": "--sink-key"}))
	err := bulkload.CheckFields([]string{"id", "time"}, map[string]string{"id": "--id-field", "tiem": "--sink-key"})
	require.EqualError(t, err, `--sink-key: field "tiem" is not in the input (fields: id, time)`)
}

func newLoad(t *testing.T, cfg bulkload.Config, p bulkload.Ports) *bulkload.Load {
	t.Helper()
	cfg.Topic, cfg.Group, cfg.Capacity = "t", "g", 1000
	cfg.Poll = 5 * time.Millisecond
	l, err := bulkload.New(cfg, p)
	require.NoError(t, err)
	return l
}

// A rerun of a load that a crash interrupted produces only the rows not
// produced before; a run of a finished load produces nothing.
func TestLoadResumesFromItsProgress(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	progress := bulkload.RedisProgress{Client: client, ClaimTTL: 300 * time.Millisecond}
	lines := make([]string, 1000)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":"r%d"}`, i)
	}
	path := ndjsonFile(t, lines...)
	topic, dlq := &memTopic{failAfter: 600}, &memDLQ{}
	id := bulkload.LoadID("t", digest(t, path))

	// The first run dies with 500 produced (chunks of 100 after 600).
	c := new(ingest.Counters)
	_, err := newLoad(t, bulkload.Config{LoadID: id, Chunk: 100, MaxDeadLetters: bulkload.DefaultDeadLetterLimit},
		bulkload.Ports{File: open(t, path), Producer: topic, DeadLetters: dlq, Offsets: topic, Counters: c,
			Workers: []bulkload.Worker{topic.drain(c, dlq)}, Progress: progress}).Run(t.Context())
	require.ErrorContains(t, err, "broker down")
	require.Len(t, topic.recs, 600)

	// The rerun: the broker is back.
	topic.mu.Lock()
	topic.failAfter = 0
	topic.mu.Unlock()
	c = new(ingest.Counters)
	s, err := newLoad(t, bulkload.Config{LoadID: id, Chunk: 100, MaxDeadLetters: bulkload.DefaultDeadLetterLimit},
		bulkload.Ports{File: open(t, path), Producer: topic, DeadLetters: dlq, Offsets: topic, Counters: c,
			Workers: []bulkload.Worker{topic.drain(c, dlq)}, Progress: progress}).Run(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1000, s.RecordsTotal)
	require.EqualValues(t, 600, s.RecordsSkipped)
	require.EqualValues(t, 400, s.RecordsProduced)
	require.Len(t, topic.recs, 1000, "nothing produced twice")

	// Another run of the same, finished load: nothing to produce.
	s, err = newLoad(t, bulkload.Config{LoadID: id, MaxDeadLetters: bulkload.DefaultDeadLetterLimit},
		bulkload.Ports{File: open(t, path), Producer: topic, DeadLetters: dlq, Offsets: topic, Counters: new(ingest.Counters),
			Workers: []bulkload.Worker{topic.drain(new(ingest.Counters), dlq)}, Progress: progress}).Run(t.Context())
	require.NoError(t, err)
	require.Zero(t, s.RecordsProduced)
	require.Equal(t, bulkload.OutcomeNothingToDo, s.Outcome)
	require.Contains(t, s.Message, "load "+id+" finished at ")
	require.False(t, s.FinishedAt.IsZero())
	require.Len(t, topic.recs, 1000)

	// While a run holds the load, another is refused.
	release, err := progress.Claim(t.Context(), id)
	require.NoError(t, err)
	_, err = progress.Claim(t.Context(), id)
	require.ErrorIs(t, err, bulkload.ErrLoadRunning)
	release()
}

// The workers drain while the input is produced, whatever the capacity:
// the producer holds everything after the first chunk until a worker has
// delivered a record, so a load whose workers waited for the whole input
// would never finish.
func TestLoadDrainsWhileProducing(t *testing.T) {
	t.Parallel()
	lines := make([]string, 1000)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":"r%d"}`, i)
	}
	gate := make(chan struct{})
	// members: the worker is in the group from the start (a real worker
	// joins before its first fetch, which Start holds).
	topic, dlq, c := &memTopic{gate: gate, members: 1}, &memDLQ{}, new(ingest.Counters)
	start := make(chan struct{})
	drain := topic.drain(c, dlq)
	worker := standIn(func(ctx context.Context) error {
		select { // as a worker does: no fetch before Start
		case <-start:
		case <-ctx.Done():
			return nil
		}
		go func() {
			for c.Totals().Delivered == 0 {
				time.Sleep(time.Millisecond)
			}
			close(gate)
		}()
		return drain.Run(ctx)
	})
	s, err := newLoad(t, bulkload.Config{Chunk: 100, MaxDeadLetters: bulkload.DefaultDeadLetterLimit},
		bulkload.Ports{File: open(t, ndjsonFile(t, lines...)), Producer: topic, DeadLetters: dlq, Offsets: topic, Counters: c,
			Workers: []bulkload.Worker{worker}, Start: start}).Run(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1000, s.RecordsDelivered)
	require.Less(t, s.DrainStartS, s.ProduceS, "draining began before producing ended")
	require.GreaterOrEqual(t, s.LoadS, s.ProduceS)
}

// More dead letters than the limit stop the load (exit 3 in the CLI).
func TestLoadStopsPastTheDeadLetterLimit(t *testing.T) {
	t.Parallel()
	lines := make([]string, 3000)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":"bad%d"}`, i)
	}
	// Producing is slower than draining, so the dead letters pile up
	// while the file is produced.
	topic, dlq, c := &memTopic{delay: 20 * time.Millisecond}, &memDLQ{}, new(ingest.Counters)
	s, err := newLoad(t, bulkload.Config{Chunk: 100, MaxDeadLetters: bulkload.DeadLetterLimit{Count: 50}},
		bulkload.Ports{File: open(t, ndjsonFile(t, lines...)), Producer: topic, DeadLetters: dlq, Offsets: topic, Counters: c,
			Workers: []bulkload.Worker{topic.drain(c, dlq)}}).Run(t.Context())
	require.ErrorIs(t, err, bulkload.ErrTooManyDeadLetters)
	require.Less(t, s.RecordsProduced, int64(3000), "it stopped producing")
	require.Greater(t, s.RecordsDeadLettered, int64(50))
}

// Without in-process workers, progress comes from the group's committed
// offsets; with no member in the group for SinkTimeout, the load says so.
func TestLoadWithoutWorkers(t *testing.T) {
	t.Parallel()
	lines := make([]string, 200)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":"r%d"}`, i)
	}
	path := ndjsonFile(t, lines...)

	// A pod drains it.
	topic, dlq := &memTopic{}, &memDLQ{}
	ctx, cancel := context.WithCancel(t.Context())
	pod := make(chan error, 1)
	go func() { pod <- topic.drain(new(ingest.Counters), dlq).Run(ctx) }()
	s, err := newLoad(t, bulkload.Config{MaxDeadLetters: bulkload.DefaultDeadLetterLimit},
		bulkload.Ports{File: open(t, path), Producer: topic, DeadLetters: dlq, Offsets: topic, Counters: new(ingest.Counters)}).Run(t.Context())
	cancel()
	require.NoError(t, <-pod)
	require.NoError(t, err)
	require.EqualValues(t, 200, s.RecordsDelivered, "as the group committed it")

	// Nobody drains it.
	topic = &memTopic{}
	_, err = newLoad(t, bulkload.Config{SinkTimeout: 100 * time.Millisecond, MaxDeadLetters: bulkload.DefaultDeadLetterLimit},
		bulkload.Ports{File: open(t, path), Producer: topic, DeadLetters: dlq, Offsets: topic, Counters: new(ingest.Counters)}).Run(t.Context())
	require.ErrorIs(t, err, bulkload.ErrNoWorkers)
	require.ErrorContains(t, err, `consumer group "g" has had no live member`)
}

// stuck is a stand-in worker that finishes every record but the last,
// which it reports retrying.
type stuck struct{ standIn }

func (stuck) Rate(time.Time) float64 { return 250 }

func (stuck) Waiting() pipeline.Waiting { return pipeline.Waiting{Retrying: 1} }

// lockedLog is a log buffer safe for the load's goroutines.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A load that stops advancing with no sink paused says so every
// StallWarn, naming the partition the group's committed offset waits on
// and where the worker's records wait, and goes on waiting.
func TestLoadWarnsWhereAStalledLoadWaits(t *testing.T) {
	t.Parallel()
	lines := make([]string, 50)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":"r%d"}`, i)
	}
	topic, dlq, c := &memTopic{members: 1}, &memDLQ{}, new(ingest.Counters)
	worker := stuck{standIn(func(ctx context.Context) error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Millisecond):
			}
			topic.mu.Lock()
			for ; topic.committed < int64(len(topic.recs))-1; topic.committed++ {
				c.Add(ingest.Totals{Delivered: 1, UnitsDelivered: 1})
			}
			topic.mu.Unlock()
		}
	})}
	var log lockedLog
	const warning = "no record finished and no offset committed for a while; the load waits"
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := newLoad(t, bulkload.Config{StallWarn: 100 * time.Millisecond, MaxDeadLetters: bulkload.DefaultDeadLetterLimit,
			Logger: slog.New(slog.NewTextHandler(&log, nil))},
			bulkload.Ports{File: open(t, ndjsonFile(t, lines...)), Producer: topic, DeadLetters: dlq, Offsets: topic, Counters: c,
				Workers: []bulkload.Worker{worker}}).Run(ctx)
		done <- err
	}()
	require.Eventually(t, func() bool { return strings.Count(log.String(), warning) >= 2 }, 10*time.Second, 10*time.Millisecond,
		"a stalled load warns again while it lasts:\n%s", log.String())
	cancel()
	require.ErrorIs(t, <-done, context.Canceled, "it waited on")
	out := log.String()
	require.Contains(t, out, `partitions_behind="0: committed 49 of 50"`)
	require.Contains(t, out, "worker0.leased_units_per_s=250 worker0.fetched=0 worker0.retrying=1 worker0.held_by_hot_ranges=0 worker0.requests_unanswered=0")
}

// The dead-letter file holds every dead letter whole, one JSON object a
// line, and is created only when there is one.
func TestDeadLetterFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dlq.ndjson")
	f := bulkload.NewDeadLetterFile(path)
	require.NoError(t, f.Close())
	_, err := os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "no dead letter, no file")

	f = bulkload.NewDeadLetterFile(path)
	require.NoError(t, f.DeadLetter(t.Context(),
		ingest.DeadLetter{Record: ingest.Record{ID: "a", Value: []byte(`{"x":1}`), Pos: ingest.Position{Topic: "t", Offset: 7}}, Reason: "HTTP 400"},
		ingest.DeadLetter{Record: ingest.Record{ID: "b", Value: []byte(`not json`), Pos: ingest.Position{Topic: "t", Offset: -1}}, Reason: "in.csv:3: bad"},
	))
	require.NoError(t, f.Close())
	data, err := os.Open(path)
	require.NoError(t, err)
	defer data.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(data)
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		lines = append(lines, m)
	}
	require.Equal(t, []map[string]any{
		{"id": "a", "reason": "HTTP 400", "source": "t/0@7", "value": map[string]any{"x": 1.0}},
		{"id": "b", "reason": "in.csv:3: bad", "value": "not json"},
	}, lines)
}

// refusal is a broker's verdict about one record.
type refusal struct{}

func (refusal) Error() string { return "refused by Kafka: message too large" }
func (refusal) Refused() bool { return true }

// scriptedAsync answers each chunk from another goroutine with the errors
// script gives its records (nil: acknowledged).
type scriptedAsync struct {
	memTopic
	script func(rec ingest.Record) error
	wg     sync.WaitGroup
}

func (s *scriptedAsync) ProduceAsync(_ context.Context, _ string, recs []ingest.Record, done func([]error)) error {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var errs []error
		for i, rec := range recs {
			if err := s.script(rec); err != nil {
				if errs == nil {
					errs = make([]error, len(recs))
				}
				errs[i] = err
			}
		}
		done(errs)
	}()
	return nil
}

// With chunks answered asynchronously, a record the broker refuses is
// dead-lettered with its file:line and its neighbours count as produced;
// a broker failure stops producing, and only acknowledged records count,
// with the rows done (what a rerun skips) ending before the failed chunk.
func TestProduceAsyncAnswers(t *testing.T) {
	t.Parallel()
	lines := make([]string, 1000)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"id":"r%d"}`, i)
	}
	path := ndjsonFile(t, lines...)

	p := &scriptedAsync{script: func(rec ingest.Record) error {
		if rec.ID == "r42" {
			return refusal{}
		}
		return nil
	}}
	dlq := &memDLQ{}
	out, err := bulkload.Produce(t.Context(), open(t, path), p, dlq, bulkload.ProduceConfig{Topic: "t", Chunk: 100})
	p.wg.Wait()
	require.NoError(t, err)
	require.EqualValues(t, 999, out.Produced)
	require.EqualValues(t, 1, out.DeadLettered)
	require.EqualValues(t, 1000, out.Done)
	require.Len(t, dlq.letters, 1)
	require.Equal(t, "r42", dlq.letters[0].Record.ID)
	require.Equal(t, path+":43: refused by Kafka: message too large", dlq.letters[0].Reason)

	p = &scriptedAsync{script: func(rec ingest.Record) error {
		if n, _ := strconv.Atoi(strings.TrimPrefix(rec.ID, "r")); n >= 500 && n < 600 {
			return errors.New("broker down")
		}
		return nil
	}}
	var acked []int64
	out, err = bulkload.Produce(t.Context(), open(t, path), p, &memDLQ{}, bulkload.ProduceConfig{Topic: "t", Chunk: 100,
		Acked: func(_ context.Context, pr bulkload.Produced) error { acked = append(acked, pr.Done); return nil }})
	p.wg.Wait()
	require.ErrorContains(t, err, "broker down")
	require.Less(t, out.Produced, int64(1000))
	require.GreaterOrEqual(t, out.Produced, int64(500), "the chunks before the failed one")
	require.EqualValues(t, 500, out.Done, "a rerun produces the failed chunk again")
	require.EqualValues(t, 500, acked[len(acked)-1], "the last progress saved")
	require.Zero(t, out.DeadLettered, "a broker failure dead-letters nothing")
}
