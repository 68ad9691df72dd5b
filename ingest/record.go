package ingest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// Record is one unit of work: a message taken from the queue, written to the
// sink, and acknowledged back to the queue.
type Record struct {
	// ID is the record's idempotency key: the sink dedupes on it, so a record
	// written twice (at-least-once delivery) is stored once. See RecordID.
	ID string
	// Key is the queue message key (Kafka partitioning), possibly empty.
	Key []byte
	// Value is the payload, a JSON object for records produced by sluice.
	Value []byte
	// Cost is what writing the record takes from the pool, in the pool's unit
	// (records, bytes or cost units such as RU). Always ≥ 1 once priced.
	Cost int64
	// Pos is where the record came from; the zero Position for records not
	// yet produced.
	Pos Position
	// SinkKey is the key the sink stores the record under (a row key, an
	// object name), built from the record's fields by its type's sink key
	// rule so that consecutive writes do not land on one range partition.
	// Empty: the sink uses ID.
	SinkKey string
	// PartitionKey groups records into entity-group batches (one partition
	// key per batch) for sinks that support them. Empty: no grouping.
	PartitionKey string
}

// Position locates a record in the queue.
type Position struct {
	Topic     string
	Partition int
	Offset    int64
}

func (p Position) String() string {
	return p.Topic + "/" + strconv.Itoa(p.Partition) + "@" + strconv.FormatInt(p.Offset, 10)
}

// ErrNoID is wrapped by RecordID's error for a record whose ID field is
// missing, null or empty.
var ErrNoID = errors.New("ingest: no record ID")

// RecordID returns the idempotency key of a JSON record: the string value of
// its idField (numbers are formatted as written), or, when idField is
// empty, "sha256:" followed by the hex SHA-256 of the raw value, so the same
// content always gets the same ID.
//
// With idField set, a record whose field is missing, null or empty has no
// ID: RecordID returns an error wrapping ErrNoID (a content hash would
// silently merge records that differ only in the column meant to tell them
// apart). It also returns an error when the value is not one JSON object
// or the field is neither a string nor a number. Only the top level of
// the object is read, from its raw bytes (see ScanObject); when the field
// repeats, the last one counts, as when the object is decoded.
func RecordID(value []byte, idField string) (string, error) {
	if idField == "" {
		return ContentID(value), nil
	}
	id, err := ScanObject(value, idField)
	if errors.Is(err, ErrNotObject) {
		return "", fmt.Errorf("record is %w", err)
	}
	return id, err
}

// ErrNotObject is wrapped by ScanObject's error for a value that is not one
// JSON object (it is another JSON value, or not JSON at all).
var ErrNotObject = errors.New("ingest: not a JSON object")

// ScanObject checks that value is exactly one JSON object (JSON white space
// around it allowed; invalid UTF-8 in strings and repeated names allowed,
// as encoding/json allows them) and, when field is not empty, returns the
// ID that field holds: a string's unescaped value, or a number as written.
// It reads the raw bytes once, without decoding the other fields: a
// 1 KiB record costs about a microsecond and no allocation but the ID's.
//
// The error wraps ErrNotObject, with the syntax error and its byte
// offset, when value is not one JSON object; ErrNoID when the field is
// missing, null or an empty string; otherwise it says the field is neither
// a string nor a number. When the field repeats, the last one counts.
func ScanObject(value []byte, field string) (id string, err error) {
	sc := scanners.Get().(*objectScanner)
	defer scanners.Put(sc)
	return sc.scan(value, field)
}

// notObjectError is a value that is not one JSON object, and why.
type notObjectError struct{ err error }

func (e *notObjectError) Error() string   { return "not a JSON object: " + e.err.Error() }
func (e *notObjectError) Unwrap() []error { return []error{ErrNotObject, e.err} }

// scanOptions make the scanner as lenient as encoding/json: invalid UTF-8
// in strings becomes U+FFFD, and a repeated name is not an error.
var scanOptions = []jsontext.Options{jsontext.AllowInvalidUTF8(true), jsontext.AllowDuplicateNames(true)}

// objectScanner reads one value's top level with a reused decoder, over a
// buffer that aliases the value (no copy).
type objectScanner struct {
	buf bytes.Buffer
	dec *jsontext.Decoder
}

var scanners = sync.Pool{New: func() any {
	sc := new(objectScanner)
	sc.dec = jsontext.NewDecoder(&sc.buf, scanOptions...)
	return sc
}}

// idState is what the last occurrence of the ID field held.
type idState int

const (
	idMissing idState = iota // absent or null
	idFound                  // a string or number
	idOther                  // another kind of value
)

func (sc *objectScanner) scan(value []byte, field string) (string, error) {
	sc.buf = *bytes.NewBuffer(value)
	sc.dec.Reset(&sc.buf, scanOptions...)
	defer sc.dec.Reset(&sc.buf) // drop the decoder's hold on value
	notObject := func(err error) error { return &notObjectError{err} }
	tok, err := sc.dec.ReadToken()
	if err == io.EOF {
		return "", notObject(errors.New("the value is empty"))
	}
	if err != nil {
		return "", notObject(err)
	}
	if tok.Kind() != '{' {
		return "", notObject(fmt.Errorf("a JSON %s", kindName(tok.Kind())))
	}
	var (
		id    string
		state idState
		other []byte
	)
	for sc.dec.PeekKind() != '}' {
		name, err := sc.dec.ReadValue() // the quoted name, unescaped below only when it may match
		if err != nil {
			return "", notObject(err)
		}
		if field == "" || !nameIs(name, field) {
			if err := sc.dec.SkipValue(); err != nil {
				return "", notObject(err)
			}
			continue
		}
		switch sc.dec.PeekKind() {
		case '"', '0':
			tok, err := sc.dec.ReadToken()
			if err != nil {
				return "", notObject(err)
			}
			id, state = tok.String(), idFound
		case 'n':
			if _, err := sc.dec.ReadToken(); err != nil {
				return "", notObject(err)
			}
			id, state = "", idMissing
		default:
			raw, err := sc.dec.ReadValue()
			if err != nil {
				return "", notObject(err)
			}
			other, state = append(other[:0], raw...), idOther
		}
	}
	if _, err := sc.dec.ReadToken(); err != nil { // the closing brace
		return "", notObject(err)
	}
	if _, err := sc.dec.ReadToken(); err != io.EOF {
		if err == nil {
			err = fmt.Errorf("more than one JSON value (another starts at offset %d)", sc.dec.InputOffset())
		}
		return "", notObject(err)
	}
	switch {
	case field == "":
		return "", nil
	case state == idMissing:
		return "", fmt.Errorf("%w: field %q is missing", ErrNoID, field)
	case state == idOther:
		return "", fmt.Errorf("id field %q is neither a string nor a number: %s", field, other)
	case id == "":
		return "", fmt.Errorf("%w: field %q is empty", ErrNoID, field)
	}
	return id, nil
}

// nameIs reports whether the quoted JSON name is field. Names without
// escapes are compared as they are; others are unescaped first.
func nameIs(quoted []byte, field string) bool {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner) == field
	}
	// The decoder has checked the syntax: an error here only reports
	// invalid UTF-8, which the name holds as U+FFFD, as encoding/json does.
	name, _ := jsontext.AppendUnquote(nil, quoted)
	return string(name) == field
}

// kindName names a JSON kind for errors.
func kindName(k jsontext.Kind) string {
	switch k {
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '[':
		return "array"
	}
	return "value"
}

// ContentID is the content-hash ID of a record without an explicit ID
// field: "sha256:" and the hex SHA-256 of its value (one allocation).
func ContentID(value []byte) string {
	const prefix = "sha256:"
	sum := sha256.Sum256(value)
	var buf [len(prefix) + 2*sha256.Size]byte
	copy(buf[:], prefix)
	hex.Encode(buf[len(prefix):], sum[:])
	return string(buf[:])
}

// IsJSONObject reports whether b is one valid JSON object (JSON white space
// around it allowed). See ScanObject.
func IsJSONObject(b []byte) bool {
	_, err := ScanObject(b, "")
	return err == nil
}
