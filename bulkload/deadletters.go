package bulkload

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/ingest"
)

// DeadLetterFile appends dead letters to a file as NDJSON, one object a
// line: {"id", "reason", "source", "value"} (value as JSON when the record
// is JSON, else as a string). Dead letters written there outlive an
// in-process broker (bulk-load --embedded), and records too large for a
// Kafka message are kept whole. The file (and its directory) is created,
// or appended to, at the first dead letter. A letter the file holds
// already — the same record ID from the same place (its source offset, or
// the reason naming its file:line) — is not written again, so a resumed
// load that meets the same bad rows keeps one line each. Safe for
// concurrent use.
type DeadLetterFile struct {
	mu   sync.Mutex
	f    *os.File // nil until the first dead letter
	w    *bufio.Writer
	path string
	seen map[uint64]struct{} // hashes of the letters in the file
	seed maphash.Seed
}

var _ ingest.DeadLetters = (*DeadLetterFile)(nil)

// NewDeadLetterFile returns a DeadLetterFile writing to path.
func NewDeadLetterFile(path string) *DeadLetterFile {
	return &DeadLetterFile{path: path, seed: maphash.MakeSeed()}
}

// key is what makes a dead letter the same as another: its record's ID
// and where it came from.
func (d *DeadLetterFile) key(id, source, reason string) uint64 {
	where := source
	if where == "" {
		where = reason
	}
	return maphash.String(d.seed, id+"\x00"+where)
}

// open opens the file for appending and remembers the letters it holds.
func (d *DeadLetterFile) open() error {
	if dir := filepath.Dir(d.path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("dead-letter file: %w", err)
		}
	}
	d.seen = map[uint64]struct{}{}
	if old, err := os.Open(d.path); err == nil {
		sc := bufio.NewScanner(old)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			var line deadLetterLine
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				d.seen[d.key(line.ID, line.Source, line.Reason)] = struct{}{}
			}
		}
		_ = old.Close()
	}
	f, err := os.OpenFile(d.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("dead-letter file: %w", err)
	}
	d.f, d.w = f, bufio.NewWriter(f)
	return nil
}

// Path returns the file's path.
func (d *DeadLetterFile) Path() string { return d.path }

// deadLetterLine is one line of a dead-letter file.
type deadLetterLine struct {
	ID     string          `json:"id"`
	Reason string          `json:"reason"`
	Source string          `json:"source,omitempty"`
	Value  json.RawMessage `json:"value"`
}

// DeadLetter implements ingest.DeadLetters: the letters are on disk (synced)
// before it returns nil.
func (d *DeadLetterFile) DeadLetter(_ context.Context, letters ...ingest.DeadLetter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		if err := d.open(); err != nil {
			return err
		}
	}
	enc := json.NewEncoder(d.w)
	var written []uint64 // remembered once on disk: a failed write is written again
	for _, l := range letters {
		line := deadLetterLine{ID: l.Record.ID, Reason: l.Reason, Value: l.Record.Value}
		if l.Record.Pos.Offset >= 0 && l.Record.Pos.Topic != "" {
			line.Source = l.Record.Pos.String()
		}
		if !json.Valid(line.Value) {
			line.Value, _ = json.Marshal(string(l.Record.Value))
		}
		k := d.key(line.ID, line.Source, line.Reason)
		if _, dup := d.seen[k]; dup || slices.Contains(written, k) {
			continue
		}
		written = append(written, k)
		if err := enc.Encode(line); err != nil {
			return fmt.Errorf("dead-letter file %s: %w", d.path, err)
		}
	}
	if err := d.w.Flush(); err != nil {
		return fmt.Errorf("dead-letter file %s: %w", d.path, err)
	}
	if err := d.f.Sync(); err != nil {
		return err
	}
	for _, k := range written {
		d.seen[k] = struct{}{}
	}
	return nil
}

// Close flushes and closes the file.
func (d *DeadLetterFile) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	return errors.Join(d.w.Flush(), d.f.Close())
}
