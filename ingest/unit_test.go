package ingest_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func TestPricing(t *testing.T) {
	t.Parallel()
	kib := func(n int) []byte { return []byte(strings.Repeat("x", n)) }
	for _, tc := range []struct {
		unit  ingest.Unit
		rule  string
		value []byte
		cost  int64
	}{
		{ingest.UnitRecords, "1", kib(5000), 1},
		{ingest.UnitBytes, "1", kib(5000), 5000},
		{ingest.UnitBytes, "1", nil, 1},
		{ingest.UnitCost, "10", kib(5000), 10},
		{ingest.UnitCost, "5/KiB", kib(1), 5},
		{ingest.UnitCost, "5/KiB", kib(1024), 5},
		{ingest.UnitCost, "5/KiB", kib(1025), 10},
		{ingest.UnitCost, "5/KiB", kib(0), 5},
		{ingest.UnitCost, " 3 /KiB", kib(4096), 12},
	} {
		p, err := ingest.ParseCost(tc.unit, tc.rule)
		require.NoError(t, err, tc.rule)
		require.Equal(t, tc.cost, p.Price(tc.value), "%s %s on %d bytes", tc.unit, tc.rule, len(tc.value))
	}
}

func TestParseCostRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		unit ingest.Unit
		rule string
	}{
		{ingest.UnitCost, ""}, {ingest.UnitCost, "0"}, {ingest.UnitCost, "-2"}, {ingest.UnitCost, "1.5"},
		{ingest.UnitCost, "5/MiB"}, {ingest.UnitCost, "/KiB"}, {ingest.UnitRecords, "10"}, {ingest.UnitBytes, "2/KiB"},
	} {
		_, err := ingest.ParseCost(tc.unit, tc.rule)
		require.Error(t, err, "%s %q", tc.unit, tc.rule)
		require.Contains(t, err.Error(), "cost rule")
	}
	p, err := ingest.ParseCost(ingest.UnitCost, "7/KiB")
	require.NoError(t, err)
	require.Equal(t, "7/KiB", p.String())
}
