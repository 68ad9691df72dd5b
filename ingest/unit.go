package ingest

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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
	// capacity in units/s, a record costs what its Pricing says (a fixed
	// cost per record, or a cost per started KiB of payload).
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
	// PerRecord is the fixed cost of one record when Unit is UnitCost (e.g.
	// 10 RU per write). Default 1.
	PerRecord int64
	// PerKiB, when > 0 and Unit is UnitCost, prices a record by its size
	// instead: ⌈len(value) / 1 KiB⌉ × PerKiB (at least one KiB), the shape
	// of Cosmos DB's write charge, which grows with the item's size.
	PerKiB int64
}

// Price returns the cost of a record with the given value: 1 for records,
// len(value) for bytes (at least 1); for cost, ⌈len(value)/1024⌉ × PerKiB
// when PerKiB is set, else PerRecord (at least 1).
func (p Pricing) Price(value []byte) int64 {
	switch p.Unit {
	case UnitBytes:
		return max(int64(len(value)), 1)
	case UnitCost:
		if p.PerKiB > 0 {
			return max((int64(len(value))+1023)/1024, 1) * p.PerKiB
		}
		return max(p.PerRecord, 1)
	}
	return 1
}

// String renders the cost rule as ParseCost reads it.
func (p Pricing) String() string {
	if p.PerKiB > 0 {
		return strconv.FormatInt(p.PerKiB, 10) + "/KiB"
	}
	return strconv.FormatInt(max(p.PerRecord, 1), 10)
}

// ParseCost reads a cost rule for unit: "N" (N units per record) or "N/KiB"
// (N units per started KiB of payload), N a whole number ≥ 1. Only UnitCost
// takes a rule other than "1": records cost 1 and bytes cost their length.
func ParseCost(unit Unit, rule string) (Pricing, error) {
	p := Pricing{Unit: unit}
	num, perKiB := strings.CutSuffix(strings.TrimSpace(rule), "/KiB")
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 1 || n > math.MaxInt32 {
		return p, fmt.Errorf("cost rule %q: want N or N/KiB with N a whole number ≥ 1", rule)
	}
	if unit != UnitCost && (n != 1 || perKiB) {
		return p, fmt.Errorf("cost rule %q needs unit cost (unit %s prices every record itself)", rule, unit)
	}
	if perKiB {
		p.PerKiB = n
	} else {
		p.PerRecord = n
	}
	return p, nil
}

// Inf is the demand of a worker with a backlog it cannot drain at its rate.
var Inf = math.Inf(1)
