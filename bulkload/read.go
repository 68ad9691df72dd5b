package bulkload

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"slices"

	"github.com/sluicehq/sluice/ingest"
)

// read reads rows, dead-letters the rows that cannot be produced, and
// hands the others to ap in chunks.
func (pr *producing) read(ctx context.Context, rows Rows, ap AsyncProducer, p ingest.Producer) error {
	r := &rowReader{pr: pr, ap: ap, seed: maphash.MakeSeed(), remembering: pr.cfg.IDMemory > 0, fileIndex: map[string]int{}, lastIndex: -1}
	r.fits, _ = p.(fitter)
	r.where, _ = rows.(positioned)
	r.fresh()
	ahead := readAhead(ctx, rows)
	defer ahead.stop()
	var batch []fetched
	for {
		if len(batch) == 0 {
			if err := ctx.Err(); err != nil {
				return context.Cause(ctx)
			}
			var ok bool
			if batch, ok = <-ahead.batches; !ok {
				break
			}
			continue
		}
		f := batch[0]
		batch = batch[1:]
		if err := r.row(ctx, f); err != nil {
			return err
		}
	}
	return r.send(ctx)
}

// rowReader is read's state: where rows come from, the IDs seen, and the
// chunk being filled.
type rowReader struct {
	pr          *producing
	ap          AsyncProducer
	fits        fitter     // nil: the producer takes any record
	where       positioned // nil: rows have no file and line
	seed        maphash.Seed
	ids         idSet
	remembering bool
	fileIndex   map[string]int
	lastName    string
	lastIndex   int
	buf         []ingest.Record
	pos         []rowPos
}

// row counts one row read and dead-letters it, skips it (a resumed load's
// rows produced before) or adds it to the chunk, which goes once full.
func (r *rowReader) row(ctx context.Context, f fetched) error {
	pr, cfg := r.pr, r.pr.cfg
	rec, err := f.rec, f.err
	var rowErr *RowError
	if err != nil && !errors.As(err, &rowErr) {
		return err
	}
	at := r.posOf(rowErr, f.name, f.line)
	pr.mu.Lock()
	pr.out.Read++
	skip := pr.out.Read <= cfg.Skip
	if skip {
		pr.out.Skipped++
	}
	if at.file >= 0 {
		pr.out.Files[at.file].Rows++
		if skip {
			pr.out.Files[at.file].Skipped++
		}
	}
	dead := pr.out.DeadLettered
	pr.mu.Unlock()
	if rowErr != nil {
		if skip {
			return nil
		}
		if dead < maxIDExamples {
			pr.log.Warn("row dead-lettered", "err", rowErr.Error())
		}
		return r.deadLetter(ctx, ingest.Record{ID: ingest.ContentID(rowErr.Raw), Value: rowErr.Raw}, at, rowErr.Error())
	}
	r.noteID(rec.ID)
	if skip {
		return nil
	}
	if r.fits != nil {
		if err := r.fits.Fits(rec); err != nil {
			return r.deadLetter(ctx, rec, at, fmt.Sprintf("%s: %v", pr.describe(at, rec), err))
		}
	}
	r.buf = append(r.buf, rec)
	r.pos = append(r.pos, at)
	if len(r.buf) == cap(r.buf) {
		return r.send(ctx)
	}
	return nil
}

// noteID counts id when an earlier row had it, and remembers it while
// the ID memory lasts.
func (r *rowReader) noteID(id string) {
	pr := r.pr
	h := maphash.String(r.seed, id)
	if r.ids.has(h) {
		pr.mu.Lock()
		pr.out.DuplicateIDs++
		if len(pr.out.DuplicateIDExamples) < maxIDExamples && !slices.Contains(pr.out.DuplicateIDExamples, id) {
			pr.out.DuplicateIDExamples = append(pr.out.DuplicateIDExamples, id)
		}
		pr.mu.Unlock()
		return
	}
	if r.remembering {
		r.ids.add(h)
		if r.ids.n >= pr.cfg.IDMemory {
			r.remembering = false
			pr.log.Info("repeated IDs: no more IDs remembered; a later repeat of an ID read from here on is not reported (the sink still stores one record per ID)",
				"ids_remembered", r.ids.n, "rows", rowsRead(pr))
		}
	}
}

// posOf returns where a row is; a malformed row's error names its own
// place.
func (r *rowReader) posOf(rowErr *RowError, name string, line int) rowPos {
	switch {
	case rowErr != nil:
		name, line = rowErr.Path, rowErr.Line
	case r.where == nil:
		return rowPos{file: -1}
	}
	if name != r.lastName || r.lastIndex < 0 {
		i, ok := r.fileIndex[name]
		if !ok {
			i = len(r.pr.out.Files)
			r.fileIndex[name] = i
			r.pr.mu.Lock()
			r.pr.out.Files = append(r.pr.out.Files, FileCounts{Name: name})
			r.pr.mu.Unlock()
		}
		r.lastName, r.lastIndex = name, i
	}
	return rowPos{file: r.lastIndex, line: line}
}

// fresh starts an empty chunk.
func (r *rowReader) fresh() {
	r.buf = make([]ingest.Record, 0, r.pr.cfg.Chunk)
	r.pos = make([]rowPos, 0, r.pr.cfg.Chunk)
}

// send hands the chunk to the producer and starts a new one.
func (r *rowReader) send(ctx context.Context) error {
	pr := r.pr
	if len(r.buf) == 0 {
		return nil
	}
	pr.mu.Lock()
	c := &sentChunk{recs: r.buf, pos: r.pos, readThrough: pr.out.Read}
	pr.sent = append(pr.sent, c)
	pr.mu.Unlock()
	err := r.ap.ProduceAsync(ctx, pr.cfg.Topic, r.buf, func(errs []error) {
		pr.mu.Lock()
		c.answered, c.errs = true, errs
		pr.mu.Unlock()
		pr.wake()
	})
	if err != nil {
		pr.mu.Lock()
		pr.sent = slices.DeleteFunc(pr.sent, func(s *sentChunk) bool { return s == c })
		pr.mu.Unlock()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return fmt.Errorf("produce to %q: %w", pr.cfg.Topic, err)
	}
	r.fresh()
	return nil
}

// deadLetter stores a row that cannot be produced in the dead-letter
// topic, with reason, and counts it.
func (r *rowReader) deadLetter(ctx context.Context, rec ingest.Record, at rowPos, reason string) error {
	pr := r.pr
	rec.Pos = ingest.Position{Topic: pr.cfg.Topic, Offset: -1}
	if err := pr.dlq.DeadLetter(ctx, ingest.DeadLetter{Record: rec, Reason: reason}); err != nil {
		if ctx.Err() != nil {
			// Stopped (the dead-letter limit reached, the load
			// interrupted): the cause says why, not the write it cut.
			return context.Cause(ctx)
		}
		return fmt.Errorf("dead-letter %s: %w", reason, err)
	}
	pr.mu.Lock()
	pr.out.DeadLettered++
	if at.file >= 0 {
		pr.out.Files[at.file].DeadLettered++
	}
	pr.mu.Unlock()
	return nil
}

// readAheadBatch is how many rows the read-ahead hands over at once.
const readAheadBatch = 256

// fetched is a row read ahead: Next's answer and, for inputs that tell,
// where the row is.
type fetched struct {
	rec  ingest.Record
	err  error
	name string
	line int
}

// aheadReader reads rows in a goroutine of its own, a few batches ahead,
// so parsing and encoding run beside producing.
type aheadReader struct {
	batches chan []fetched
	cancel  context.CancelFunc
	done    chan struct{}
}

// readAhead starts reading rows; the batches end after io.EOF or the
// first error that is not a *RowError (sent as the last fetched).
func readAhead(ctx context.Context, rows Rows) *aheadReader {
	ctx, cancel := context.WithCancel(ctx)
	a := &aheadReader{batches: make(chan []fetched, 4), cancel: cancel, done: make(chan struct{})}
	where, _ := rows.(positioned)
	go func() {
		defer close(a.done)
		defer close(a.batches)
		for {
			batch := make([]fetched, 0, readAheadBatch)
			end := false
			for len(batch) < readAheadBatch && !end {
				rec, err := rows.Next()
				if err == io.EOF {
					end = true
					break
				}
				f := fetched{rec: rec, err: err}
				if where != nil {
					f.name, f.line = where.Pos()
				}
				batch = append(batch, f)
				end = err != nil && !isRowError(err)
			}
			if len(batch) > 0 {
				select {
				case a.batches <- batch:
				case <-ctx.Done():
					return
				}
			}
			if end || ctx.Err() != nil {
				return
			}
		}
	}()
	return a
}

// stop ends the read-ahead and waits for its goroutine (which finishes
// the row it is reading: reading standard input may wait for its writer).
func (a *aheadReader) stop() {
	a.cancel()
	<-a.done
}

// idSet is a set of 64-bit ID hashes in an open-addressing table with
// linear probing, kept at most half full: 8 bytes a slot, so 16 MiB for a
// million IDs (a Go map takes 25 to 38 bytes an entry).
type idSet struct {
	slots []uint64 // 0: empty
	n     int
}

func (s *idSet) has(h uint64) bool {
	if len(s.slots) == 0 {
		return false
	}
	h = max(h, 1)
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case h:
			return true
		case 0:
			return false
		}
	}
}

func (s *idSet) add(h uint64) {
	if 2*(s.n+1) > len(s.slots) {
		old := s.slots
		s.slots, s.n = make([]uint64, max(2*len(old), 1<<16)), 0
		for _, v := range old {
			if v != 0 {
				s.insert(v)
			}
		}
	}
	s.insert(max(h, 1))
}

func (s *idSet) insert(h uint64) {
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case h:
			return
		case 0:
			s.slots[i] = h
			s.n++
			return
		}
	}
}
