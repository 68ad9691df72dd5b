package bulkload

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/ingest"
)

// RowError is a malformed row of an input file. The row goes to the
// dead-letter topic with Error() as the reason; the rows around it load.
type RowError struct {
	Path string
	Line int    // 1-based line where the row starts
	Raw  []byte // the row as it appears in the file
	Err  error
}

func (e *RowError) Error() string { return fmt.Sprintf("%s:%d: %v", e.Path, e.Line, e.Err) }
func (e *RowError) Unwrap() error { return e.Err }

// DefaultMaxRowBytes is the longest row or line an input may have: 16 MiB
// (a Kafka message is about 1 MiB by default). A longer NDJSON line is a
// malformed row; a longer CSV row (an unclosed quote, usually) ends the
// file with an error naming where it starts, since the row's end cannot be
// found.
const DefaultMaxRowBytes = 16 << 20

// ndjsonBuffer is the read buffer of an NDJSON stream: the preflight peeks
// at the first records within it.
const ndjsonBuffer = 1 << 20

// fileReader streams the records of one input: a CSV file (header row
// first; quoting and UTF-8 per RFC 4180) or an NDJSON file (one JSON object
// per line), counting lines as it goes. Each CSV row becomes a JSON object
// keyed by the header (see CSVTypes).
type fileReader struct {
	name     string // as errors and dead letters name it
	idField  string
	validate func(value []byte) error
	maxRow   int
	src      io.ReadCloser // the decompressed stream

	// CSV
	rec      *recorder
	csv      *csv.Reader
	header   []string
	enc      *rowEncoder
	lastSize int // the last value's length
	next     int // the line the next CSV row starts at, at the earliest

	// NDJSON
	br   *bufio.Reader
	line int // the last line read

	where int   // the line of the last record returned
	err   error // sticky: the stream cannot be read on
}

// newFileReader prepares to read src, an input in format ("csv" or
// "ndjson") named name. A CSV header without idField is an error naming the
// columns.
func newFileReader(name, format string, src io.ReadCloser, cfg InputConfig) (*fileReader, error) {
	f := &fileReader{name: name, idField: cfg.IDField, validate: cfg.Validate, maxRow: cfg.MaxRowBytes, src: src}
	switch format {
	case "csv":
		f.rec = &recorder{r: src, max: f.maxRow}
		f.csv = csv.NewReader(f.rec)
		f.csv.ReuseRecord = true
		header, err := f.csv.Read()
		if err != nil {
			return nil, fmt.Errorf("%s: reading the header row: %w", name, err)
		}
		f.header = slices.Clone(header)
		f.header[0] = strings.TrimPrefix(f.header[0], "\ufeff")
		f.csv.FieldsPerRecord = len(f.header)
		if cfg.IDField != "" && !slices.Contains(f.header, cfg.IDField) {
			return nil, &SettingError{Setting: "IDField", Err: fmt.Errorf("%s: %q is not a column (columns: %s)", name, cfg.IDField, strings.Join(f.header, ", "))}
		}
		f.enc = newRowEncoder(f.header, cfg.CSV, cfg.IDField)
		line, _ := f.csv.FieldPos(0)
		f.next = line + 1
	case "ndjson":
		f.br = bufio.NewReaderSize(src, ndjsonBuffer)
		if bom, err := f.br.Peek(3); err == nil && string(bom) == "\ufeff" {
			_, _ = f.br.Discard(3)
		}
	default:
		return nil, fmt.Errorf("%s: unknown format %q (want csv or ndjson)", name, format)
	}
	return f, nil
}

// next returns the next record with Value, ID and Key (= ID) set, a
// *RowError for a malformed row (call next again to go on), or io.EOF.
func (f *fileReader) nextRecord() (ingest.Record, error) {
	if f.err != nil {
		return ingest.Record{}, f.err
	}
	var rec ingest.Record
	var err error
	if f.csv != nil {
		rec, err = f.nextCSV()
	} else {
		rec, err = f.nextNDJSON()
	}
	if err != nil && !errors.Is(err, io.EOF) && !isRowError(err) {
		f.err = err
	}
	return rec, err
}

func isRowError(err error) bool {
	var re *RowError
	return errors.As(err, &re)
}

func (f *fileReader) nextCSV() (ingest.Record, error) {
	start := f.csv.InputOffset()
	f.rec.mark(start)
	fields, err := f.csv.Read()
	raw := bytes.TrimRight(f.rec.bytes(start, f.csv.InputOffset()), "\r\n")
	if err == io.EOF {
		return ingest.Record{}, io.EOF
	}
	if errors.Is(err, errRowTooLong) {
		return ingest.Record{}, fmt.Errorf("%s: the row starting at line %d or after is longer than %d bytes (an unclosed quote?); the rest of the file cannot be read", f.name, f.next, f.maxRow)
	}
	if err != nil {
		var pe *csv.ParseError
		if !errors.As(err, &pe) {
			return ingest.Record{}, fmt.Errorf("%s: %w", f.name, err)
		}
		f.next = max(f.next, pe.Line+1)
		return ingest.Record{}, &RowError{Path: f.name, Line: pe.StartLine, Raw: bytes.Clone(raw), Err: pe.Err}
	}
	line, _ := f.csv.FieldPos(0)
	end, _ := f.csv.FieldPos(len(fields) - 1)
	f.next = end + 1
	f.where = line
	// Encoded straight into the record's own buffer, sized by the last
	// row's value (the rows of a file are alike).
	value, id, err := f.enc.encode(make([]byte, 0, f.lastSize+f.lastSize/8+64), fields, f.idField)
	if err != nil {
		return ingest.Record{}, &RowError{Path: f.name, Line: line, Raw: bytes.Clone(raw), Err: err}
	}
	f.lastSize = len(value)
	if f.idField == "" {
		id = ingest.ContentID(value)
	}
	if f.validate != nil {
		if err := f.validate(value); err != nil {
			return ingest.Record{}, &RowError{Path: f.name, Line: line, Raw: bytes.Clone(raw), Err: err}
		}
	}
	return ingest.Record{ID: id, Key: []byte(id), Value: value}, nil
}

func (f *fileReader) nextNDJSON() (ingest.Record, error) {
	for {
		line, tooLong, err := f.readLine()
		if len(line) == 0 && err != nil {
			if err == io.EOF {
				return ingest.Record{}, io.EOF
			}
			return ingest.Record{}, fmt.Errorf("%s: %w", f.name, err)
		}
		f.line++
		if tooLong {
			return ingest.Record{}, &RowError{Path: f.name, Line: f.line, Raw: bytes.Clone(line),
				Err: fmt.Errorf("line longer than %d bytes", f.maxRow)}
		}
		raw := bytes.TrimSpace(line)
		if len(raw) == 0 {
			continue
		}
		f.where = f.line
		if !ingest.IsJSONObject(raw) {
			return ingest.Record{}, &RowError{Path: f.name, Line: f.line, Raw: bytes.Clone(raw), Err: errors.New("not a JSON object")}
		}
		value := bytes.Clone(raw)
		id, err := ingest.RecordID(value, f.idField)
		if err == nil && f.validate != nil {
			err = f.validate(value)
		}
		if err != nil {
			return ingest.Record{}, &RowError{Path: f.name, Line: f.line, Raw: value, Err: err}
		}
		return ingest.Record{ID: id, Key: []byte(id), Value: value}, nil
	}
}

// readLine returns the next line without its newline, valid until the
// next read; tooLong: it was longer than maxRow (its start is returned,
// the rest skipped).
func (f *fileReader) readLine() (line []byte, tooLong bool, err error) {
	line, err = f.br.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		line = bytes.TrimSuffix(line, []byte("\n"))
		if len(line) > f.maxRow { // a limit below the buffer's size
			return line[:f.maxRow], true, err
		}
		return line, false, err
	}
	long := slices.Clone(line)
	for err == bufio.ErrBufferFull {
		line, err = f.br.ReadSlice('\n')
		if len(long) < f.maxRow {
			long = append(long, line...)
		} else {
			tooLong = true
		}
	}
	if len(long) > f.maxRow {
		tooLong, long = true, long[:f.maxRow]
	}
	return bytes.TrimSuffix(long, []byte("\n")), tooLong, err
}

// fields returns the fields a record of the input has: the CSV header, or
// the union of the top-level keys of the NDJSON records in its first MiB
// (at most 100), sorted. It reads nothing the records need.
func (f *fileReader) fields() []string {
	if f.csv != nil {
		return slices.Clone(f.header)
	}
	peek, _ := f.br.Peek(ndjsonBuffer)
	seen := map[string]bool{}
	for n := 0; n < 100 && len(peek) > 0; {
		var line []byte
		line, peek, _ = bytes.Cut(peek, []byte("\n"))
		var obj map[string]json.RawMessage
		if json.Unmarshal(line, &obj) == nil && obj != nil {
			for k := range obj {
				seen[k] = true
			}
			n++
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

func (f *fileReader) close() error { return f.src.Close() }

// errRowTooLong is what a recorder returns once a row outgrows its limit.
var errRowTooLong = errors.New("bulkload: row too long")

// recorder keeps the bytes a CSV reader reads from the current row's start
// on, so a malformed row can be dead-lettered as it was written, and
// refuses to hold more than max of them.
type recorder struct {
	r    io.Reader
	max  int
	buf  []byte // the bytes from offset base on
	base int64
	from int64 // the current row's offset; earlier bytes may be dropped
}

func (t *recorder) Read(p []byte) (int, error) {
	if drop := int(t.from - t.base); drop > 0 && drop >= len(t.buf)/2 {
		n := copy(t.buf, t.buf[drop:])
		t.buf, t.base = t.buf[:n], t.from
	}
	if len(t.buf)-int(t.from-t.base) > t.max {
		return 0, errRowTooLong
	}
	n, err := t.r.Read(p)
	t.buf = append(t.buf, p[:n]...)
	return n, err
}

// mark says the current row starts at offset off.
func (t *recorder) mark(off int64) { t.from = max(off, t.base) }

// bytes returns the bytes read between offsets from and to.
func (t *recorder) bytes(from, to int64) []byte {
	from, to = max(from-t.base, 0), min(to-t.base, int64(len(t.buf)))
	if from >= to {
		return nil
	}
	return t.buf[from:to]
}
