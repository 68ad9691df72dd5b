package ingest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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

// RecordID returns the idempotency key of a JSON record: the string value of
// its idField when idField is set and present (numbers are formatted as
// written), else "sha256:" followed by the hex SHA-256 of the raw value, so
// the same content always gets the same ID.
//
// It returns an error only when idField is set and the value is not a JSON
// object, or the field is neither a string nor a number.
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
		return ContentID(value), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return ContentID(value), nil
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
