package sink

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/ingest/ingesttest"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/pipeline"
	"github.com/sluicehq/sluice/sink/sinktest"
)

var pgSeq atomic.Int64

// postgresURL is the URL of a real PostgreSQL server: SLUICE_TEST_POSTGRES_URL,
// or the one scripts/postgres.sh starts (idempotent; the Makefile stops it).
func postgresURL(t testing.TB) string {
	t.Helper()
	return postgresService.URL(t)
}

// freshTable returns a new table name, unique in this test run.
func freshTable(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano()%1e9, pgSeq.Add(1))
}

// openPostgres opens a PostgresSink on a fresh table whose values must have
// a "mag" field (a CHECK constraint).
func openPostgres(t testing.TB, timeout time.Duration) (*PostgresSink, string) {
	t.Helper()
	table := freshTable("t")
	s, err := NewPostgres(t.Context(), PostgresConfig{URL: postgresURL(t), Table: table, CreateTable: true, StatementTimeout: timeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	_, err = s.pool.Exec(t.Context(), fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT has_mag CHECK (value ? 'mag')`, table))
	require.NoError(t, err)
	return s, table
}

func TestPostgresConformance(t *testing.T) {
	t.Parallel()
	sinktest.Suite{
		Open: func(t *testing.T) ingest.Sink {
			s, _ := openPostgres(t, 300*time.Millisecond)
			return s
		},
		// Another transaction inserts the same id and holds it: the sink's
		// insert waits on it until the statement timeout cancels it (57014).
		Retryable: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			ps := s.(*PostgresSink)
			conn, err := pgx.Connect(t.Context(), postgresURL(t))
			require.NoError(t, err)
			tx, err := conn.Begin(t.Context())
			require.NoError(t, err)
			t.Cleanup(func() {
				_ = tx.Rollback(context.Background())
				_ = conn.Close(context.Background())
			})
			_, err = tx.Exec(t.Context(), fmt.Sprintf(`INSERT INTO %s (id, value) VALUES ('locked', '{"mag":1}')`, ps.table))
			require.NoError(t, err)
			return s, []ingest.Record{{ID: "locked", Value: []byte(`{"mag":2}`), Cost: 1}}
		},
		NoThrottling: "PostgreSQL has no throttling answer: a server at its limits makes statements wait (locks, " +
			"statement_timeout: the retryable case) or refuses connections (53300), never a rate-limit verdict about a row",
		// The table is gone (dropped under the sink): 42P01 for every batch.
		Down: func(t *testing.T) ingest.Sink {
			s, table := openPostgres(t, time.Second)
			_, err := s.pool.Exec(t.Context(), "DROP TABLE "+table)
			require.NoError(t, err)
			return s
		},
	}.Run(t)
}

func TestPostgresStoresSinkKeyAndValue(t *testing.T) {
	t.Parallel()
	s, table := openPostgres(t, 0)
	res, err := s.Write(t.Context(), []ingest.Record{
		{ID: "id-1", SinkKey: "2025-05/us1", Value: []byte(`{"mag":4.5}`)},
		{ID: "id-2", Value: []byte(`{"mag":1}`)},
		{ID: "id-2", Value: []byte(`{"mag":1}`)}, // repeated in the batch
	})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered, ingest.Duplicate}, []ingest.Outcome{res[0].Outcome, res[1].Outcome, res[2].Outcome})
	var mag float64
	require.NoError(t, s.pool.QueryRow(t.Context(), fmt.Sprintf(`SELECT (value->>'mag')::float FROM %s WHERE id = '2025-05/us1'`, table)).Scan(&mag))
	require.Equal(t, 4.5, mag)
}

func TestNewPostgresRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []PostgresConfig{
		{URL: "postgres://127.0.0.1:1/x", Table: ""},
		{URL: "postgres://127.0.0.1:1/x", Table: "t; DROP TABLE x"},
		{URL: "postgres://127.0.0.1:1/x", Table: "t", IDColumn: "a b"},
		{URL: "::bad", Table: "t"},
	} {
		_, err := NewPostgres(t.Context(), cfg)
		require.ErrorIs(t, err, ErrPostgresConfig, "%+v", cfg)
	}
}

func TestOpenPostgresFromURL(t *testing.T) {
	t.Parallel()
	table := freshTable("open")
	s, err := Open(t.Context(), postgresURL(t)+"?table="+table, OpenConfig{})
	require.NoError(t, err)
	defer s.Close()
	res, err := s.Write(t.Context(), []ingest.Record{{ID: "x", Value: []byte(`{}`)}})
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)

	for _, bad := range []string{"postgres://127.0.0.1:1/db", "ftp://x/y", "postgres:///db?table=t"} {
		_, err := Open(t.Context(), bad, OpenConfig{})
		require.ErrorIs(t, err, ErrSinkURL, bad)
	}
}

// BenchmarkPostgresWrite measures unthrottled inserts into a real server,
// by batch size: go test -run '^$' -bench PostgresWrite ./sink/
func BenchmarkPostgresWrite(b *testing.B) {
	for _, size := range []int{100, 500, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s, _ := openPostgres(b, 0)
			value := []byte(`{"mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`)
			n := 0
			b.ResetTimer()
			for b.Loop() {
				batch := make([]ingest.Record, size)
				for i := range batch {
					n++
					batch[i] = ingest.Record{ID: fmt.Sprintf("r%09d", n), Value: value}
				}
				if _, err := s.Write(b.Context(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// copyMerge is the alternative to the sink's INSERT … ON CONFLICT that
// BenchmarkPostgresCopyMerge measures: COPY into a temporary staging table,
// then one INSERT … SELECT … ON CONFLICT DO NOTHING, in one transaction.
func copyMerge(ctx context.Context, p *PostgresSink, keys, values []string) (int64, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS sluice_stage (id text, value jsonb) ON COMMIT DELETE ROWS`); err != nil {
		return 0, err
	}
	rows := make([][]any, len(keys))
	for i := range keys {
		rows[i] = []any{keys[i], values[i]}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"sluice_stage"}, []string{"id", "value"}, pgx.CopyFromRows(rows)); err != nil {
		return 0, err
	}
	tag, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (id, value) SELECT id, value FROM sluice_stage ON CONFLICT (id) DO NOTHING`, p.table))
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), tx.Commit(ctx)
}

// BenchmarkPostgresCopyMerge measures the COPY + merge alternative with the
// same records as BenchmarkPostgresWrite:
// go test -run '^$' -bench 'Postgres' ./sink/
func BenchmarkPostgresCopyMerge(b *testing.B) {
	for _, size := range []int{100, 500, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s, _ := openPostgres(b, 0)
			value := `{"mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`
			n := 0
			for b.Loop() {
				keys, values := make([]string, size), make([]string, size)
				for i := range keys {
					n++
					keys[i], values[i] = fmt.Sprintf("r%09d", n), value
				}
				if inserted, err := copyMerge(b.Context(), s, keys, values); err != nil || inserted != int64(size) {
					b.Fatal(inserted, err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// A statement that would outlive the request deadline is cancelled at the
// deadline (the pipeline puts its request timeout on every write), so it
// ends before the lease the write was paced under stops counting (the lease
// margin covers the request timeout and a slice): a trigger makes every
// insert take 3 s, the deadline is 500 ms.
func TestPostgresStatementOutlivingTheRequestDeadlineIsCancelled(t *testing.T) {
	t.Parallel()
	const deadline = 500 * time.Millisecond
	_, err := Open(t.Context(), postgresURL(t)+"?table=x", OpenConfig{Timeout: deadline, StatementTimeout: time.Second})
	require.ErrorContains(t, err, "must fit inside the request timeout", "a statement timeout longer than the request timeout is refused")

	s, table := openPostgres(t, 10*time.Second) // the server's own timeout would not stop it in time
	_, err = s.pool.Exec(t.Context(), fmt.Sprintf(`
		CREATE FUNCTION %[1]s_slow() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$ LANGUAGE plpgsql;
		CREATE TRIGGER slow BEFORE INSERT ON %[1]s FOR EACH ROW EXECUTE FUNCTION %[1]s_slow();`, table))
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	began := time.Now()
	_, err = s.Write(ctx, []ingest.Record{{ID: "slow", Value: []byte(`{"mag":1}`)}})
	took := time.Since(began)
	require.Error(t, err)
	t.Logf("write returned after %s: %v", took, err)
	margin := deadline + ingest.DefaultSlice // lease.Config's least margin, but for clock drift
	require.Less(t, took, margin, "the write ended before the lease could stop counting")

	time.Sleep(3 * time.Second) // had the statement gone on, the row would be in by now
	var n int
	require.NoError(t, s.pool.QueryRow(t.Context(), fmt.Sprintf(`SELECT count(*) FROM %s`, table)).Scan(&n))
	require.Zero(t, n, "the statement was cancelled on the server, not left running")
}

// fixedCapacity is a capacity of its value in records/s, held for good
// (lease.Manager's stands in for it in a worker).
type fixedCapacity float64

func (c fixedCapacity) Rate(time.Time) float64            { return float64(c) }
func (c fixedCapacity) Credit(from, to time.Time) float64 { return float64(c) * to.Sub(from).Seconds() }
func (fixedCapacity) SetDemand(float64)                   {}

// lockedBuffer is a log destination safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The pipeline's request deadline, end to end into PostgreSQL: the worker
// pipeline (its pacer at 1,000 records/s, its retry policy and breaker)
// writes 40 records into a table whose inserts, while a switch row is
// present, hold their rows and sleep 4 s in an AFTER INSERT trigger; the
// sink's own statement_timeout (10 s) would not stop them. Every write
// ends at the pipeline's request timeout (1 s) as a failure of the whole
// write and the sink is paused; by the time a statement that went on
// running would have committed, nothing is stored. Once the switch is
// gone the records are stored, each once, every one delivered and none a
// duplicate (a statement left running would have committed rows that the
// retry, waiting on them, would have found stored).
func TestPipelineCancelsAPostgresStatementAtTheRequestDeadline(t *testing.T) {
	t.Parallel()
	const n, deadline, slow = 40, time.Second, 4 * time.Second
	s, table := openPostgres(t, 10*time.Second)
	_, err := s.pool.Exec(t.Context(), fmt.Sprintf(`
		CREATE TABLE %[1]s_switch (slow boolean);
		INSERT INTO %[1]s_switch VALUES (true);
		CREATE FUNCTION %[1]s_slow() RETURNS trigger AS $$
		BEGIN IF EXISTS (SELECT 1 FROM %[1]s_switch) THEN PERFORM pg_sleep(%[2]d); END IF; RETURN NULL; END $$ LANGUAGE plpgsql;
		CREATE TRIGGER slow AFTER INSERT ON %[1]s FOR EACH STATEMENT EXECUTE FUNCTION %[1]s_slow();`, table, int(slow.Seconds())))
	require.NoError(t, err)

	values := make([][]byte, n)
	for i := range values {
		values[i] = fmt.Appendf(nil, `{"id":"q%02d","mag":1.5}`, i)
	}
	q := ingesttest.NewQueue("quakes", values...)
	capacity := fixedCapacity(1000)
	pacer, err := pacing.New(pacing.Config{}, capacity)
	require.NoError(t, err)
	var logs lockedBuffer
	var mu sync.Mutex
	var took []time.Duration // of every write attempt
	tookSoFar := func() []time.Duration { mu.Lock(); defer mu.Unlock(); return slices.Clone(took) }
	p, err := pipeline.New(pipeline.Config{
		IDField: "id", RequestTimeout: deadline, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		ObserveWrite: func(_ int, d time.Duration) { mu.Lock(); took = append(took, d); mu.Unlock() },
	}, pipeline.Ports{Source: q, DeadLetters: ingesttest.Discard{}, Sink: s, Retry: Policy{}, Pacer: pacer, Capacity: capacity})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	// The first writes and a probe after them, all cut at the deadline.
	require.Eventually(t, func() bool {
		paused, _ := p.SinkPaused()
		return paused && p.Counters().Totals().FailedWrites >= 2
	}, 20*time.Second, 10*time.Millisecond, "the sink was not paused by writes cut at the deadline")
	// Had the first statements gone on running, they would have committed
	// by now.
	select {
	case <-time.After(time.Until(began.Add(slow + deadline))):
	case <-t.Context().Done():
	}
	var stored int
	require.NoError(t, s.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&stored))
	require.Zero(t, stored, "a statement cut at the deadline went on to store its rows; writes took %v", tookSoFar())
	paused, _ := p.SinkPaused()
	require.True(t, paused, "the sink stays paused while every write outlives the deadline")
	_, err = s.pool.Exec(t.Context(), fmt.Sprintf("DELETE FROM %s_switch", table))
	require.NoError(t, err)

	select {
	case <-q.Finished():
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the records were not all written once the statements were fast", logs.String())
	}
	tot := p.Counters().Totals()
	require.EqualValues(t, n, tot.Delivered, "every record stored for the first time by its own write: %+v; writes took %v", tot, tookSoFar())
	require.Zero(t, tot.Duplicates, "no statement cut at the deadline went on to store its rows")
	require.Zero(t, tot.DeadLettered)
	require.NoError(t, s.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&stored))
	require.Equal(t, n, stored)
	log := logs.String()
	require.Contains(t, log, "sink paused")
	require.Contains(t, log, "no answer within the request timeout (1s)")
	require.Contains(t, log, "sink resumed")
	cut := 0
	for _, d := range tookSoFar() {
		if d >= deadline {
			cut++
			require.Less(t, d, deadline+ingest.DefaultSlice, "a write outlived the request deadline: %v", d)
		}
	}
	require.GreaterOrEqual(t, cut, 2, "writes cut at the deadline: %v", tookSoFar())
	t.Logf("write attempts took %v", tookSoFar())
}
