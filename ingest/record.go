package ingest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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
// apart). It also returns an error when the value is not a JSON object or
// the field is neither a string nor a number.
func RecordID(value []byte, idField string) (string, error) {
	if idField == "" {
		return ContentID(value), nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(value, &obj); err != nil {
		return "", fmt.Errorf("record is not a JSON object: %w", err)
	}
	raw, ok := obj[idField]
	if !ok || string(raw) == "null" {
		return "", fmt.Errorf("%w: field %q is missing", ErrNoID, idField)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return "", fmt.Errorf("%w: field %q is empty", ErrNoID, idField)
		}
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("id field %q is neither a string nor a number: %s", idField, raw)
}

// ContentID is the content-hash ID of a record without an explicit ID field.
func ContentID(value []byte) string {
	sum := sha256.Sum256(value)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// IsJSONObject reports whether b is one valid JSON object (white space
// around it allowed).
func IsJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{' && json.Valid(b)
}
