package bulkload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/ingest"
)

// Config configures a BulkLoad.
type Config struct {
	// Topic receives the file's records; Group is the consumer group the
	// workers drain it with. Both required.
	Topic, Group string
	// Capacity is the pool's capacity in units/s; Unit its unit. Used for
	// the ideal time, utilization and the ETA. Required.
	Capacity float64
	Unit     ingest.Unit
	// Chunk is the number of records per produce call. Default 500.
	Chunk int
	// Poll is how often progress and the group's offsets are checked.
	// Default 200 ms.
	Poll time.Duration
	// JoinTimeout bounds the wait, before producing, for the workers to
	// join the consumer group: records fetched before a member joins are
	// redelivered to it by the rebalance. Default 30 s; past it the load
	// goes on (the sink dedupes the redelivered records).
	JoinTimeout time.Duration
	// Logger receives progress lines. Default: slog.Default().
	Logger *slog.Logger
	// Bar, when set, shows a progress bar there (a terminal) instead of
	// periodic log lines.
	Bar io.Writer
}

// Ports are what a BulkLoad drives.
type Ports struct {
	File        Rows
	Producer    ingest.Producer
	DeadLetters ingest.DeadLetters // receives malformed rows
	Offsets     ingest.Offsets
	// Workers drain the topic (each a full worker stack in the group).
	// None: worker pods of the group drain it.
	Workers []ingest.Runner
	// Counters are the workers' shared totals.
	Counters *ingest.Counters
	// Rate is the workers' combined leased rate in units/s, for the ETA.
	Rate func(now time.Time) float64
	// Sink, when it keeps statistics, completes the summary.
	Sink ingest.StatsSink
	// Start, when not nil, is closed once one second of the pool's
	// capacity (counting a record as one unit) or the whole file has been
	// produced; the in-process workers wait for it (WorkerConfig.Start), so
	// their first slices are full.
	Start chan struct{}
}

// BulkLoad loads a file through the queue into the sink: it starts the
// workers, produces every record, and finishes when the group's committed
// offsets reach the offsets it produced (so workers of other processes in the
// same group help, and nothing is reported done before it is committed).
type BulkLoad struct {
	cfg Config
	p   Ports
}

// New checks cfg and returns a BulkLoad.
func New(cfg Config, p Ports) (*BulkLoad, error) {
	switch {
	case cfg.Topic == "" || cfg.Group == "":
		return nil, errors.New("ingest: bulk load needs a topic and a group")
	case cfg.Capacity <= 0:
		return nil, fmt.Errorf("ingest: bulk load capacity must be > 0, got %v", cfg.Capacity)
	case p.File == nil || p.Producer == nil || p.DeadLetters == nil || p.Offsets == nil || p.Counters == nil:
		return nil, errors.New("ingest: bulk load needs a file, producer, dead letters, offsets and counters")
	}
	cfg.Chunk = cmp.Or(cfg.Chunk, 500)
	cfg.Poll = cmp.Or(cfg.Poll, 200*time.Millisecond)
	cfg.JoinTimeout = cmp.Or(cfg.JoinTimeout, 30*time.Second)
	cfg.Unit = cmp.Or(cfg.Unit, ingest.UnitRecords)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if p.Rate == nil {
		p.Rate = func(time.Time) float64 { return 0 }
	}
	return &BulkLoad{cfg: cfg, p: p}, nil
}

// Run loads the file and returns the summary. It returns ctx's cause if ctx
// ends first (the summary then covers what was done).
func (b *BulkLoad) Run(ctx context.Context) (Summary, error) {
	workCtx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	g, gctx := errgroup.WithContext(workCtx)
	for _, w := range b.p.Workers {
		g.Go(func() error { return w.Run(gctx) })
	}

	b.awaitGroup(ctx)
	start := time.Now()
	total, badRows, err := b.produce(ctx)
	b.cfg.Logger.Info("file produced", "topic", b.cfg.Topic, "records", total-badRows, "malformed", badRows,
		"seconds", time.Since(start).Seconds())
	if err == nil {
		err = b.await(ctx, total-badRows, badRows)
	}
	stopWorkers()
	if werr := g.Wait(); err == nil {
		err = werr
	}
	return b.summary(ctx, total, badRows), err
}

// awaitGroup waits until the in-process workers (and any others) have
// joined the group and it is stable, so that no rebalance hands records a
// worker already fetched to another.
func (b *BulkLoad) awaitGroup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.JoinTimeout)
	defer cancel()
	tick := time.NewTicker(b.cfg.Poll / 4)
	defer tick.Stop()
	for {
		members, stable, err := b.p.Offsets.GroupMembers(ctx, b.cfg.Group)
		if err == nil && stable && members >= len(b.p.Workers) {
			return
		}
		select {
		case <-ctx.Done():
			b.cfg.Logger.Warn("workers did not all join the consumer group in time, loading anyway",
				"group", b.cfg.Group, "members", members, "workers", len(b.p.Workers), "err", err)
			return
		case <-tick.C:
		}
	}
}

// produce sends every record of the file to the topic.
func (b *BulkLoad) produce(ctx context.Context) (total, bad int64, err error) {
	start := sync.OnceFunc(func() {
		if b.p.Start != nil {
			close(b.p.Start)
		}
	})
	defer start()
	threshold := int64(b.cfg.Capacity)
	producer := producerFunc(func(ctx context.Context, topic string, recs []ingest.Record) error {
		err := b.p.Producer.Produce(ctx, topic, recs)
		if threshold -= int64(len(recs)); threshold <= 0 {
			start()
		}
		return err
	})
	return Produce(ctx, b.p.File, b.cfg.Topic, b.cfg.Chunk, producer, b.p.DeadLetters, b.cfg.Logger)
}

// producerFunc adapts a function to Producer.
type producerFunc func(ctx context.Context, topic string, recs []ingest.Record) error

func (f producerFunc) Produce(ctx context.Context, topic string, recs []ingest.Record) error {
	return f(ctx, topic, recs)
}

// Produce sends every record of f to topic in chunks of chunk records
// (default 500), and every malformed row to the dead-letter topic with its
// file:line. It returns the rows read and how many were malformed.
func Produce(ctx context.Context, f Rows, topic string, chunk int, p ingest.Producer, dlq ingest.DeadLetters, log *slog.Logger) (total, bad int64, err error) {
	buf := make([]ingest.Record, 0, cmp.Or(chunk, 500))
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		if err := p.Produce(ctx, topic, buf); err != nil {
			return fmt.Errorf("produce to %q: %w", topic, err)
		}
		buf = buf[:0]
		return nil
	}
	for {
		rec, err := f.Next()
		if err == io.EOF {
			break
		}
		total++
		var rowErr *RowError
		if errors.As(err, &rowErr) {
			bad++
			log.Warn("malformed row dead-lettered", "err", rowErr.Error())
			dead := ingest.Record{ID: ingest.ContentID(rowErr.Raw), Value: rowErr.Raw, Pos: ingest.Position{Topic: topic, Offset: -1}}
			if err := dlq.DeadLetter(ctx, ingest.DeadLetter{Record: dead, Reason: rowErr.Error()}); err != nil {
				return total, bad, fmt.Errorf("dead-letter %s: %w", rowErr.Error(), err)
			}
			continue
		}
		if err != nil {
			return total, bad, err
		}
		buf = append(buf, rec)
		if len(buf) == cap(buf) {
			if err := flush(); err != nil {
				return total, bad, err
			}
		}
	}
	return total, bad, flush()
}

// await waits until the group has committed every offset produced so far,
// reporting progress.
func (b *BulkLoad) await(ctx context.Context, records, badRows int64) error {
	target, err := b.p.Offsets.EndOffsets(ctx, b.cfg.Topic)
	if err != nil {
		return fmt.Errorf("read end offsets of %q: %w", b.cfg.Topic, err)
	}
	progress := newProgress(b.cfg, records)
	defer progress.close()
	tick := time.NewTicker(b.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
		t := b.p.Counters.Totals()
		progress.update(t, b.p.Rate(time.Now()))
		committed, err := b.p.Offsets.CommittedOffsets(ctx, b.cfg.Group, b.cfg.Topic)
		if err != nil {
			b.cfg.Logger.Warn("reading committed offsets failed", "group", b.cfg.Group, "err", err)
			continue
		}
		if reached(committed, target) {
			progress.update(b.p.Counters.Totals(), 0)
			return nil
		}
	}
}

// reached reports whether every partition's committed offset is at or past
// its target.
func reached(committed, target map[int]int64) bool {
	for p, end := range target {
		if end > 0 && committed[p] < end {
			return false
		}
	}
	return true
}

func (b *BulkLoad) summary(ctx context.Context, total, badRows int64) Summary {
	t := b.p.Counters.Totals()
	s := Summary{
		RecordsTotal:        total,
		RecordsDelivered:    t.Delivered,
		RecordsDeadLettered: t.DeadLettered + badRows,
		SinkRequests:        t.Requests,
		SinkRecordAttempts:  t.Attempts,
		SinkThrottled:       t.Throttled,
		Unit:                string(b.cfg.Unit),
		CapacityUnitsPerS:   b.cfg.Capacity,
		CostTotal:           t.UnitsDelivered,
		ElapsedS:            t.Elapsed().Seconds(),
	}
	if b.p.Sink != nil {
		statsCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if st, err := b.p.Sink.Stats(statsCtx); err != nil {
			b.cfg.Logger.Warn("reading sink statistics failed", "err", err)
		} else {
			s.DuplicatesAtSink = st.Duplicates
			s.MaxUnits1sWindow = st.MaxUnits1s
			s.MaxUnits200msWindow = st.MaxUnits200ms
			s.SinkStats = &st
		}
	}
	s.IdealS = float64(s.CostTotal) / s.CapacityUnitsPerS
	if s.ElapsedS > 0 {
		s.Utilization = s.IdealS / s.ElapsedS
	}
	return s
}
