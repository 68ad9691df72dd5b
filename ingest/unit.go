package ingest

import (
	"fmt"
	"math"
)

// Unit is what a pool's capacity counts.
type Unit string

const (
	// UnitRecords counts records: capacity in records/s, every record costs 1.
	UnitRecords Unit = "records"
	// UnitBytes counts payload bytes: capacity in bytes/s, a record costs
	// the length of its value.
	UnitBytes Unit = "bytes"
	// UnitCost counts an abstract charge such as Cosmos DB request units:
	// capacity in units/s, a record costs Pricing.PerRecord.
	UnitCost Unit = "cost"
)

// ParseUnit parses "records", "bytes" or "cost".
func ParseUnit(s string) (Unit, error) {
	switch u := Unit(s); u {
	case UnitRecords, UnitBytes, UnitCost:
		return u, nil
	}
	return "", fmt.Errorf("unknown unit %q (want records, bytes or cost)", s)
}

// Pricing turns a record into its cost in the pool's unit.
type Pricing struct {
	Unit Unit
	// PerRecord is the cost of one record when Unit is UnitCost (e.g. 10
	// RU). Default 1.
	PerRecord int64
}

// Price returns the cost of a record with the given value: 1 for records,
// len(value) for bytes (at least 1), PerRecord for cost.
func (p Pricing) Price(value []byte) int64 {
	switch p.Unit {
	case UnitBytes:
		return max(int64(len(value)), 1)
	case UnitCost:
		return max(p.PerRecord, 1)
	}
	return 1
}

// Inf is the demand of a worker with a backlog it cannot drain at its rate.
var Inf = math.Inf(1)
