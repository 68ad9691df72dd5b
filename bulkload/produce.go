package bulkload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"slices"

	"github.com/sluicehq/sluice/ingest"
)

// Rows yields a file's records in the order they are to be produced: a
// Record, a *RowError for a malformed row (call Next again to go on), or
// io.EOF. *FileReader is one. Rows that also have Where() report
// "path:line" of the record returned last.
type Rows interface {
	Next() (ingest.Record, error)
}

// DefaultChunk is the number of records produced per broker request.
const DefaultChunk = 500

// maxIDExamples is how many repeated IDs a load names.
const maxIDExamples = 5

// ProduceConfig configures Produce.
type ProduceConfig struct {
	// Topic receives the records; required. Dead letters go to its
	// dead-letter topic.
	Topic string
	// Chunk is the number of records per produce call. Defaults to
	// DefaultChunk (500).
	Chunk int
	// IDField is the field the IDs come from ("": a content hash); it
	// names the field in the warning about repeated IDs.
	IDField string
	// Skip is how many rows of the input an earlier run of the same load
	// produced: they are read (and their IDs counted) but not produced
	// again.
	Skip int64
	// Acked, when set, is called after each chunk the broker acknowledged,
	// with the rows of the input done so far (produced or dead-lettered);
	// an error stops producing (a bulk load saves its progress and checks
	// its dead-letter limit there).
	Acked func(ctx context.Context, p Produced) error
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
}

// Produced is what Produce did.
type Produced struct {
	// Read counts the rows read from the input; Skipped those an earlier
	// run produced; Produced the records the broker acknowledged in this
	// run; DeadLettered the rows refused before producing (malformed, no
	// ID, invalid, too large for a Kafka message).
	Read, Skipped, Produced, DeadLettered int64
	// DuplicateIDs counts the records whose ID an earlier row of the input
	// already had: the sink stores each ID once, so these rows are not
	// stored as rows of their own. DuplicateIDExamples names a few.
	DuplicateIDs        int64
	DuplicateIDExamples []string
}

// fitter is implemented by producers that can tell a record too large to
// produce (queue.Producer).
type fitter interface {
	Fits(rec ingest.Record) error
}

// Produce sends every record of rows to the topic in chunks, and every row
// that cannot be produced — malformed, without an ID, refused by its
// type's schema, too large for a Kafka message — to the dead-letter topic
// with its file:line; its neighbours are produced. Only records the broker
// acknowledged count as produced. It returns what it did, and an error
// when the input cannot be read, the broker or the dead-letter topic fails,
// or Acked stops it.
func Produce(ctx context.Context, rows Rows, p ingest.Producer, dlq ingest.DeadLetters, cfg ProduceConfig) (Produced, error) {
	var out Produced
	if cfg.Topic == "" {
		return out, errors.New("bulkload: produce needs a topic")
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	fits, _ := p.(fitter)
	located, _ := rows.(interface{ Where() string })
	ids := make(map[uint64]struct{})
	buf := make([]ingest.Record, 0, cmp.Or(cfg.Chunk, DefaultChunk))
	flush := func() error {
		if len(buf) > 0 {
			if err := p.Produce(ctx, cfg.Topic, buf); err != nil {
				return fmt.Errorf("produce to %q: %w", cfg.Topic, err)
			}
			out.Produced += int64(len(buf))
			buf = buf[:0]
		}
		if cfg.Acked != nil {
			return cfg.Acked(ctx, out)
		}
		return nil
	}
	deadLetter := func(rec ingest.Record, reason string) error {
		out.DeadLettered++
		rec.Pos = ingest.Position{Topic: cfg.Topic, Offset: -1}
		if err := dlq.DeadLetter(ctx, ingest.DeadLetter{Record: rec, Reason: reason}); err != nil {
			return fmt.Errorf("dead-letter %s: %w", reason, err)
		}
		return nil
	}
	for {
		rec, err := rows.Next()
		if err == io.EOF {
			break
		}
		out.Read++
		skip := out.Read <= cfg.Skip
		if skip {
			out.Skipped++
		}
		var rowErr *RowError
		switch {
		case errors.As(err, &rowErr):
			if skip {
				continue
			}
			if out.DeadLettered < maxIDExamples {
				log.Warn("row dead-lettered", "err", rowErr.Error())
			}
			if err := deadLetter(ingest.Record{ID: ingest.ContentID(rowErr.Raw), Value: rowErr.Raw}, rowErr.Error()); err != nil {
				return out, err
			}
			continue
		case err != nil:
			return out, err
		}
		h := fnv.New64a()
		_, _ = h.Write([]byte(rec.ID))
		if _, seen := ids[h.Sum64()]; seen {
			out.DuplicateIDs++
			if len(out.DuplicateIDExamples) < maxIDExamples && !slices.Contains(out.DuplicateIDExamples, rec.ID) {
				out.DuplicateIDExamples = append(out.DuplicateIDExamples, rec.ID)
			}
		} else {
			ids[h.Sum64()] = struct{}{}
		}
		if skip {
			continue
		}
		if fits != nil {
			if err := fits.Fits(rec); err != nil {
				where := "record " + rec.ID
				if located != nil {
					where = located.Where()
				}
				if err := deadLetter(rec, fmt.Sprintf("%s: %v", where, err)); err != nil {
					return out, err
				}
				continue
			}
		}
		buf = append(buf, rec)
		if len(buf) == cap(buf) {
			if err := flush(); err != nil {
				return out, err
			}
		}
	}
	if err := flush(); err != nil {
		return out, err
	}
	if out.DuplicateIDs > 0 {
		field := cmp.Or(cfg.IDField, "the content hash")
		log.Warn("IDs repeat in the input: the sink stores one record per ID, so these rows are not stored on their own; check the ID field",
			"id_field", field, "repeated", out.DuplicateIDs, "rows", out.Read, "examples", out.DuplicateIDExamples)
	}
	return out, nil
}
