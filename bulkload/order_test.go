package bulkload_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/ingest"
)

// sliceRows yields fixed records and errors.
type sliceRows struct {
	items []any // ingest.Record or error
}

func (s *sliceRows) Next() (ingest.Record, error) {
	if len(s.items) == 0 {
		return ingest.Record{}, io.EOF
	}
	it := s.items[0]
	s.items = s.items[1:]
	if err, ok := it.(error); ok {
		return ingest.Record{}, err
	}
	return it.(ingest.Record), nil
}

func drain(t *testing.T, rows bulkload.Rows) (recs []ingest.Record, bad []error) {
	t.Helper()
	for {
		rec, err := rows.Next()
		if err == io.EOF {
			return recs, bad
		}
		if err != nil {
			bad = append(bad, err)
			continue
		}
		recs = append(recs, rec)
	}
}

func TestInterleaveSpreadsSequentialKeys(t *testing.T) {
	t.Parallel()
	const n = 2000
	src := &sliceRows{}
	for i := range n {
		if i == 700 {
			src.items = append(src.items, &bulkload.RowError{Path: "f.csv", Line: 702, Err: errors.New("bad")})
		}
		src.items = append(src.items, ingest.Record{ID: fmt.Sprintf("r%05d", i)})
	}
	rank := func(r ingest.Record) int {
		var i int
		_, err := fmt.Sscanf(r.ID, "r%05d", &i)
		require.NoError(t, err)
		return i
	}
	rows, err := bulkload.Interleave(src, func(r ingest.Record) (string, error) { return "2025-05-01/" + r.ID, nil }, 16)
	require.NoError(t, err)
	recs, bad := drain(t, rows)
	require.Len(t, bad, 1, "the malformed row is kept")
	require.Len(t, recs, n)

	seen := map[string]bool{}
	var jump int
	for i, r := range recs {
		require.False(t, seen[r.ID], "%s twice", r.ID)
		seen[r.ID] = true
		if i > 0 {
			jump += abs(rank(r) - rank(recs[i-1]))
		}
	}
	// File order moves one key at a time; interleaved over 16 ranges,
	// consecutive records are n/16 (125) apart in key order, but for the
	// jump back at the end of each round.
	require.GreaterOrEqual(t, jump/(n-1), n/16-5, "mean distance in key order between consecutive records")
	require.Equal(t, 0, rank(recs[0]))
	require.Equal(t, n/16, rank(recs[1]), "the second record is from the second range")
}

func TestInterleaveFallsBackToTheID(t *testing.T) {
	t.Parallel()
	src := &sliceRows{items: []any{ingest.Record{ID: "a"}, ingest.Record{ID: "b"}, ingest.Record{ID: "c"}}}
	rows, err := bulkload.Interleave(src, func(ingest.Record) (string, error) { return "", errors.New("no key") }, 1)
	require.NoError(t, err)
	recs, _ := drain(t, rows)
	require.Equal(t, []string{"a", "b", "c"}, []string{recs[0].ID, recs[1].ID, recs[2].ID}, "one bucket: key order (the IDs)")

	src = &sliceRows{items: []any{ingest.Record{ID: "a"}, errors.New("disk")}}
	_, err = bulkload.Interleave(src, nil, 0)
	require.EqualError(t, err, "disk")
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
