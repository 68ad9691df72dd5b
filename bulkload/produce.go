package bulkload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Rows yields an input's records in the order they are to be produced: a
// Record, a *RowError for a malformed row (call Next again to go on), or
// io.EOF. *Input is one. Rows that also have Pos() report the input and
// line of the record returned last.
type Rows interface {
	Next() (ingest.Record, error)
}

// positioned is implemented by Rows that know where their last record
// came from (*Input).
type positioned interface {
	Pos() (name string, line int)
}

// AsyncProducer is a producer that keeps many chunks of records on their
// way to the broker at once (queue.Producer). ProduceAsync returns once
// recs are queued (blocking while too many are unacknowledged) and calls
// done once when every record is answered: nil when all were
// acknowledged, else one error per record (nil for those acknowledged).
// A record's error whose chain has a Refused() bool method returning true
// is the broker's verdict about that record: it is dead-lettered; any
// other error is a failure of the broker and stops the load. An error
// from ProduceAsync itself means nothing was queued.
type AsyncProducer interface {
	ProduceAsync(ctx context.Context, topic string, recs []ingest.Record, done func(errs []error)) error
}

// syncProducer runs an ingest.Producer as an AsyncProducer, one chunk at a
// time.
type syncProducer struct{ p ingest.Producer }

func (s syncProducer) ProduceAsync(ctx context.Context, topic string, recs []ingest.Record, done func([]error)) error {
	if err := s.p.Produce(ctx, topic, recs); err != nil {
		return err
	}
	done(nil)
	return nil
}

// DefaultChunk is the number of records handed to the producer at once.
const DefaultChunk = 500

// DefaultIDMemory is how many distinct IDs Produce remembers to find IDs
// that repeat in the input: 500,000 (8 MiB of 64-bit hashes). A row is
// checked against the IDs remembered, so in a longer input a repeat of an
// ID first read after them goes unreported (the sink still stores one
// record per ID); an ID field that repeats (a wrong --id-field) shows long
// before. Two different IDs share a hash with probability about n²/2⁶⁵
// over n IDs (7·10⁻⁹ for 500,000): the second would be reported as a
// repeat, and still produced.
const DefaultIDMemory = 500_000

// DefaultAckEvery is how often Produce reports its progress (Acked) while
// records are acknowledged: 25 ms. A bulk load saves its progress there,
// so a rerun after a crash produces again at most what was acknowledged
// in that time (about 5,000 rows at 200,000 rows/s; at 100 ms a rerun
// produced up to 1.10 × the input, TestBulkLoadResumesAfterKillDuringProduction).
const DefaultAckEvery = 25 * time.Millisecond

// drainTimeout bounds the wait, once producing stopped early, for the
// answers of the records on their way, so they are counted.
const drainTimeout = 10 * time.Second

// maxIDExamples is how many repeated IDs a load names.
const maxIDExamples = 5

// ProduceConfig configures Produce.
type ProduceConfig struct {
	// Topic receives the records; required. Dead letters go to its
	// dead-letter topic.
	Topic string
	// Chunk is the number of records handed to the producer at once.
	// Defaults to DefaultChunk (500).
	Chunk int
	// IDField is the field the IDs come from ("": a content hash); it
	// names the field in the warning about repeated IDs.
	IDField string
	// IDMemory is how many distinct IDs are remembered to find repeated
	// ones. Default DefaultIDMemory; negative: none.
	IDMemory int
	// Skip is how many rows of the input an earlier run of the same load
	// produced: they are read (and their IDs counted) but not produced
	// again.
	Skip int64
	// Acked, when set, is called as records are acknowledged (at once
	// for the first chunk, then at most every AckEvery, and once at the
	// end), with what was done so far; Produced.Done is the rows of the
	// input done from its start. An error stops producing (a bulk load
	// saves its progress and checks its dead-letter limit there).
	Acked func(ctx context.Context, p Produced) error
	// AckEvery is how often Acked is called at most. Default
	// DefaultAckEvery (25 ms).
	AckEvery time.Duration
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
}

// Produced is what Produce did.
type Produced struct {
	// Read counts the rows read from the input; Skipped those an earlier
	// run produced; Produced the records the broker acknowledged in this
	// run; DeadLettered the rows refused before producing (malformed, no
	// ID, invalid, too large for a Kafka message) and the records the
	// broker refused.
	Read, Skipped, Produced, DeadLettered int64
	// Done is how many rows of the input, from its start, are done:
	// produced and acknowledged, dead-lettered, or skipped. A rerun of the
	// same load skips them.
	Done int64
	// DuplicateIDs counts the records whose ID an earlier row of the input
	// already had (among the IDs remembered, see DefaultIDMemory): the
	// sink stores each ID once, so these rows are not stored as rows of
	// their own. DuplicateIDExamples names a few.
	DuplicateIDs        int64
	DuplicateIDExamples []string
	// Files counts per input, in the order read (inputs that report
	// where their rows come from, like *Input).
	Files []FileCounts
	// Started is when the first row was read; Elapsed the time from then
	// to the last answer.
	Started time.Time
	Elapsed time.Duration
}

// FileCounts is what Produce did with one input.
type FileCounts struct {
	Name         string `json:"name"`
	Rows         int64  `json:"rows"`          // rows read
	Produced     int64  `json:"produced"`      // acknowledged by the broker in this run
	Skipped      int64  `json:"skipped"`       // produced by an earlier run of the load
	DeadLettered int64  `json:"dead_lettered"` // refused before producing or by the broker
}

// fitter is implemented by producers that can tell a record too large to
// produce (queue.Producer).
type fitter interface {
	Fits(rec ingest.Record) error
}

// rowPos is where a record came from: an index into Produced.Files (-1:
// unknown) and a line.
type rowPos struct {
	file int
	line int
}

// sentChunk is a chunk handed to the producer and not yet counted.
type sentChunk struct {
	recs        []ingest.Record
	pos         []rowPos
	readThrough int64 // rows read when it was sent: all done once it is
	answered    bool
	errs        []error
}

// producing is the state Produce's reader and acknowledger share.
type producing struct {
	cfg    ProduceConfig
	log    *slog.Logger
	dlq    ingest.DeadLetters
	signal chan struct{} // an answer arrived, or the reader finished

	mu         sync.Mutex
	out        Produced
	sent       []*sentChunk // in the order sent
	readerDone bool
	failed     error // the first failure of the broker
}

// Produce sends every record of rows to the topic, keeping many chunks on
// their way at once when p is an AsyncProducer, and every row that cannot
// be produced — malformed, without an ID, refused by its type's schema,
// too large for a Kafka message, refused by the broker — to the
// dead-letter topic with its file:line; its neighbours are produced. Only
// records the broker acknowledged count as produced. Memory holds the
// records on their way (bounded by the producer) and the IDs remembered
// (IDMemory), whatever the input's size. It returns what it did, and an
// error when the input cannot be read, the broker or the dead-letter topic
// fails, or Acked stops it.
func Produce(ctx context.Context, rows Rows, p ingest.Producer, dlq ingest.DeadLetters, cfg ProduceConfig) (Produced, error) {
	if cfg.Topic == "" {
		return Produced{}, errors.New("bulkload: produce needs a topic")
	}
	cfg.Chunk = cmp.Or(cfg.Chunk, DefaultChunk)
	cfg.AckEvery = cmp.Or(cfg.AckEvery, DefaultAckEvery)
	if cfg.IDMemory == 0 {
		cfg.IDMemory = DefaultIDMemory
	}
	ap, ok := p.(AsyncProducer)
	if !ok {
		ap = syncProducer{p}
	}
	pr := &producing{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()), dlq: dlq, signal: make(chan struct{}, 1)}
	began := time.Now()

	readCtx, stopReading := context.WithCancelCause(ctx)
	defer stopReading(nil)
	ackCtx, stopAcking := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAcking()
	acked := make(chan error, 1)
	go func() { acked <- pr.acknowledge(ackCtx, stopReading) }()

	readErr := pr.read(readCtx, rows, ap, p)
	pr.mu.Lock()
	pr.readerDone = true
	pr.mu.Unlock()
	pr.wake()
	var ackErr error
	if readErr == nil {
		select {
		case ackErr = <-acked:
		case <-ctx.Done():
			readErr = context.Cause(ctx)
		}
	}
	if readErr != nil {
		// Count what is answered within drainTimeout; the rest is
		// produced, or not, without being counted.
		select {
		case ackErr = <-acked:
		case <-time.After(drainTimeout):
			stopAcking()
			ackErr = <-acked
		}
	}
	pr.mu.Lock()
	out := pr.snapshot()
	if pr.failed == nil && readErr == nil && ackErr == nil && len(pr.sent) == 0 {
		out.Done = out.Read
		pr.out.Done = out.Done
	}
	pr.mu.Unlock()
	out.Started, out.Elapsed = began, time.Since(began)
	// A reader stopped by the acknowledger returns its error as the cause.
	err := cmp.Or(readErr, ackErr)
	if cfg.Acked != nil {
		if aerr := cfg.Acked(context.WithoutCancel(ctx), out); err == nil {
			err = aerr
		}
	}
	if out.DuplicateIDs > 0 {
		field := cmp.Or(cfg.IDField, "the content hash")
		pr.log.Warn("IDs repeat in the input: the sink stores one record per ID, so these rows are not stored on their own; check the ID field",
			"id_field", field, "repeated", out.DuplicateIDs, "rows", out.Read, "examples", out.DuplicateIDExamples)
	}
	return out, err
}

// snapshot copies out; mu held.
func (pr *producing) snapshot() Produced {
	out := pr.out
	out.DuplicateIDExamples = slices.Clone(out.DuplicateIDExamples)
	out.Files = slices.Clone(out.Files)
	return out
}

func (pr *producing) wake() {
	select {
	case pr.signal <- struct{}{}:
	default:
	}
}

func rowsRead(pr *producing) int64 {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.out.Read
}

// describe names where a record came from: file:line, else its ID.
func (pr *producing) describe(at rowPos, rec ingest.Record) string {
	if at.file < 0 {
		return "record " + rec.ID
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return fmt.Sprintf("%s:%d", pr.out.Files[at.file].Name, at.line)
}

// acknowledge counts the answered chunks in the order they were sent,
// dead-letters the records the broker refused, reports progress, and
// returns once the reader is done and every chunk is counted (or ctx
// ends). A failure of the broker stops the reader.
func (pr *producing) acknowledge(ctx context.Context, stopReading context.CancelCauseFunc) error {
	var lastAck time.Time
	first := true
	for {
		select {
		case <-pr.signal:
		case <-ctx.Done():
			return nil
		}
		for {
			pr.mu.Lock()
			if len(pr.sent) == 0 || !pr.sent[0].answered {
				pr.mu.Unlock()
				break
			}
			c := pr.sent[0]
			pr.sent = pr.sent[1:]
			pr.mu.Unlock()
			if err := pr.count(ctx, c); err != nil {
				stopReading(err)
				return err
			}
		}
		pr.mu.Lock()
		finished := pr.readerDone && len(pr.sent) == 0
		out := pr.snapshot()
		pr.mu.Unlock()
		if pr.cfg.Acked != nil && !finished && (first || time.Since(lastAck) >= pr.cfg.AckEvery) && out.Done > 0 {
			first, lastAck = false, time.Now()
			if err := pr.cfg.Acked(ctx, out); err != nil {
				stopReading(err)
				return err
			}
		}
		if finished {
			pr.mu.Lock()
			failed := pr.failed
			pr.mu.Unlock()
			return failed
		}
	}
}

// count counts one answered chunk.
func (pr *producing) count(ctx context.Context, c *sentChunk) error {
	var produced int64
	var refused []ingest.DeadLetter
	var refusedAt []rowPos
	var failure error
	for i := range c.recs {
		var err error
		if c.errs != nil {
			err = c.errs[i]
		}
		switch {
		case err == nil:
			produced++
			if c.pos[i].file >= 0 {
				pr.mu.Lock()
				pr.out.Files[c.pos[i].file].Produced++
				pr.mu.Unlock()
			}
		case isRefused(err):
			rec := c.recs[i]
			rec.Pos = ingest.Position{Topic: pr.cfg.Topic, Offset: -1}
			refused = append(refused, ingest.DeadLetter{Record: rec, Reason: fmt.Sprintf("%s: %v", pr.describe(c.pos[i], rec), err)})
			refusedAt = append(refusedAt, c.pos[i])
		default:
			failure = cmp.Or(failure, err)
		}
	}
	if len(refused) > 0 {
		if err := pr.dlq.DeadLetter(ctx, refused...); err != nil {
			return fmt.Errorf("dead-letter %d records the broker refused: %w", len(refused), err)
		}
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.out.Produced += produced
	pr.out.DeadLettered += int64(len(refused))
	for _, at := range refusedAt {
		if at.file >= 0 {
			pr.out.Files[at.file].DeadLettered++
		}
	}
	if failure != nil && pr.failed == nil {
		pr.failed = fmt.Errorf("produce to %q: %w", pr.cfg.Topic, failure)
	}
	if pr.failed == nil {
		pr.out.Done = c.readThrough
	}
	if failure != nil {
		return pr.failed
	}
	return nil
}

// isRefused reports whether a producer's error for one record is the
// broker's verdict about that record (see AsyncProducer).
func isRefused(err error) bool {
	var r interface{ Refused() bool }
	return errors.As(err, &r) && r.Refused()
}
