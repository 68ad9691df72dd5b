package bulkload

import (
	"bytes"
	"crypto/sha256"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
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

// FileReader reads records from a CSV file (header row first; quoting and
// UTF-8 per RFC 4180) or an NDJSON file (one JSON object per line). Each CSV
// row becomes a JSON object keyed by the header, with string values and
// null for empty fields.
type FileReader struct {
	// Validate, when set, checks each record's JSON value (a record type's
	// schema, say); a record it refuses is a malformed row.
	Validate func(value []byte) error

	path    string
	idField string
	data    []byte
	csv     *csv.Reader
	header  []string
	rest    []byte // NDJSON not yet read
	line    int    // NDJSON: the last line read
	where   int    // the line of the last record returned
}

// OpenFile reads path whole and prepares to parse it. format is "csv",
// "ndjson" or "" (from the extension: .csv, .ndjson/.jsonl). idField names
// the ID column or field (see RecordID). Errors name the file.
func OpenFile(path, format, idField string) (*FileReader, error) {
	if format == "" {
		switch strings.ToLower(filepath.Ext(path)) {
		case ".csv":
			format = "csv"
		case ".ndjson", ".jsonl":
			format = "ndjson"
		default:
			return nil, fmt.Errorf("%s: cannot tell the format from the extension; use --format csv or ndjson", path)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f := &FileReader{path: path, idField: idField, data: data}
	switch format {
	case "csv":
		f.csv = csv.NewReader(bytes.NewReader(data))
		f.csv.ReuseRecord = false
		header, err := f.csv.Read()
		if err != nil {
			return nil, fmt.Errorf("%s: reading the header row: %w", path, err)
		}
		f.header = append([]string(nil), header...)
		f.header[0] = strings.TrimPrefix(f.header[0], "\ufeff")
		f.csv.FieldsPerRecord = len(f.header)
		if idField != "" && !slices.Contains(f.header, idField) {
			return nil, fmt.Errorf("%s: --id-field %q is not a column (columns: %s)", path, idField, strings.Join(f.header, ", "))
		}
	case "ndjson":
		f.rest = data
	default:
		return nil, fmt.Errorf("%s: unknown format %q (want csv or ndjson)", path, format)
	}
	return f, nil
}

// Next returns the next record with Value, ID and Key (= ID) set, a
// *RowError for a malformed row (call Next again to go on), or io.EOF.
func (f *FileReader) Next() (ingest.Record, error) {
	if f.csv != nil {
		return f.nextCSV()
	}
	return f.nextNDJSON()
}

func (f *FileReader) nextCSV() (ingest.Record, error) {
	start := f.csv.InputOffset()
	fields, err := f.csv.Read()
	raw := bytes.TrimRight(f.data[start:f.csv.InputOffset()], "\r\n")
	if err == io.EOF {
		return ingest.Record{}, io.EOF
	}
	if err != nil {
		line := 0
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			line, err = pe.StartLine, pe.Err
		}
		return ingest.Record{}, &RowError{Path: f.path, Line: line, Raw: bytes.Clone(raw), Err: err}
	}
	line, _ := f.csv.FieldPos(0)
	obj := make(map[string]any, len(fields))
	for i, v := range fields {
		if v == "" {
			obj[f.header[i]] = nil
		} else {
			obj[f.header[i]] = v
		}
	}
	value, err := json.Marshal(obj)
	if err != nil {
		return ingest.Record{}, &RowError{Path: f.path, Line: line, Raw: bytes.Clone(raw), Err: err}
	}
	return f.record(value, line, raw)
}

func (f *FileReader) nextNDJSON() (ingest.Record, error) {
	for len(f.rest) > 0 {
		line, rest, _ := bytes.Cut(f.rest, []byte("\n"))
		f.rest = rest
		f.line++
		raw := bytes.TrimSpace(line)
		if len(raw) == 0 {
			continue
		}
		if !ingest.IsJSONObject(raw) {
			return ingest.Record{}, &RowError{Path: f.path, Line: f.line, Raw: bytes.Clone(raw), Err: errors.New("not a JSON object")}
		}
		return f.record(bytes.Clone(raw), f.line, raw)
	}
	return ingest.Record{}, io.EOF
}

// Digest returns the SHA-256 of the file's bytes: with the topic, the
// identity of a load (see LoadID).
func (f *FileReader) Digest() []byte {
	sum := sha256.Sum256(f.data)
	return sum[:]
}

// Where returns "path:line" of the record Next returned last.
func (f *FileReader) Where() string { return fmt.Sprintf("%s:%d", f.path, f.where) }

// Fields returns the fields a record of the file has: the CSV header, or
// the union of the top-level keys of the first 100 NDJSON records, sorted.
// A preflight checks the ID field and the sink key's fields against it.
func (f *FileReader) Fields() []string {
	if f.csv != nil {
		return slices.Clone(f.header)
	}
	seen := map[string]bool{}
	rest := f.data
	for n := 0; n < 100 && len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
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

func (f *FileReader) record(value []byte, line int, raw []byte) (ingest.Record, error) {
	f.where = line
	id, err := ingest.RecordID(value, f.idField)
	if err == nil && f.Validate != nil {
		err = f.Validate(value)
	}
	if err != nil {
		return ingest.Record{}, &RowError{Path: f.path, Line: line, Raw: bytes.Clone(raw), Err: err}
	}
	return ingest.Record{ID: id, Key: []byte(id), Value: value}, nil
}
