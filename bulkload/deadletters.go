package bulkload

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/sluicehq/sluice/ingest"
)

// DeadLetterFile appends dead letters to a file as NDJSON, one object a
// line: {"id", "reason", "source", "value"} (value as JSON when the record
// is JSON, else as a string). Dead letters written there outlive an
// in-process broker (bulk-load --embedded), and records too large for a
// Kafka message are kept whole. The file is created (or appended to) at
// the first dead letter. Safe for concurrent use.
type DeadLetterFile struct {
	mu   sync.Mutex
	f    *os.File // nil until the first dead letter
	w    *bufio.Writer
	path string
}

var _ ingest.DeadLetters = (*DeadLetterFile)(nil)

// NewDeadLetterFile returns a DeadLetterFile writing to path.
func NewDeadLetterFile(path string) *DeadLetterFile { return &DeadLetterFile{path: path} }

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
		f, err := os.OpenFile(d.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("dead-letter file: %w", err)
		}
		d.f, d.w = f, bufio.NewWriter(f)
	}
	enc := json.NewEncoder(d.w)
	for _, l := range letters {
		line := deadLetterLine{ID: l.Record.ID, Reason: l.Reason, Value: l.Record.Value}
		if l.Record.Pos.Offset >= 0 && l.Record.Pos.Topic != "" {
			line.Source = l.Record.Pos.String()
		}
		if !json.Valid(line.Value) {
			line.Value, _ = json.Marshal(string(l.Record.Value))
		}
		if err := enc.Encode(line); err != nil {
			return fmt.Errorf("dead-letter file %s: %w", d.path, err)
		}
	}
	if err := d.w.Flush(); err != nil {
		return fmt.Errorf("dead-letter file %s: %w", d.path, err)
	}
	return d.f.Sync()
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
