package bulkload

import (
	"cmp"
	"errors"
	"io"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/ingest"
)

// DefaultInterleaveBuckets is the number of key ranges Interleave spreads
// consecutive records over.
const DefaultInterleaveBuckets = 64

// Interleave reads all of rows into memory (so it is for inputs that fit
// there) and returns them reordered for a bulk load
// so that consecutive writes land in different key ranges of a
// range-partitioned store, instead of all on the range holding the latest
// key (Cloud Storage advises this for bulk uploads and deletes of
// sequentially named objects). The records, sorted by sink key, are cut
// into buckets contiguous ranges of equal size and taken round-robin over
// them: consecutive records are about n/buckets apart in key order. (Hash
// buckets of the key would not do: round-robin over them takes each
// bucket's first record first, and those all sit near the start of the key
// order.)
//
// key returns a record's sink key; when it fails, or is nil, the record's
// ID stands in. buckets ≤ 0 means DefaultInterleaveBuckets. Malformed rows
// come first, in file order. The error is the first non-row error of rows.
func Interleave(rows Rows, key func(ingest.Record) (string, error), buckets int) (Rows, error) {
	buckets = cmp.Or(max(buckets, 0), DefaultInterleaveBuckets)
	type keyed struct {
		key  string
		name string
		line int
		rec  ingest.Record
	}
	located, _ := rows.(positioned)
	var bad []error
	var all []keyed
	for {
		rec, err := rows.Next()
		if err == io.EOF {
			break
		}
		var rowErr *RowError
		if errors.As(err, &rowErr) {
			bad = append(bad, err)
			continue
		}
		if err != nil {
			return nil, err
		}
		k := rec.ID
		if key != nil {
			if sk, err := key(rec); err == nil {
				k = sk
			}
		}
		kr := keyed{key: k, rec: rec}
		if located != nil {
			kr.name, kr.line = located.Pos()
		}
		all = append(all, kr)
	}
	slices.SortStableFunc(all, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	size := (len(all) + buckets - 1) / buckets
	out := &orderedRows{bad: bad, recs: make([]keyedPos, 0, len(all))}
	for i := range size {
		for start := 0; start < len(all); start += size {
			if start+i < min(start+size, len(all)) {
				k := all[start+i]
				out.recs = append(out.recs, keyedPos{k.rec, k.name, k.line})
			}
		}
	}
	return out, nil
}

// keyedPos is a record and where it is in its input.
type keyedPos struct {
	rec  ingest.Record
	name string
	line int
}

// orderedRows replays rows already read: the malformed ones, then the
// records.
type orderedRows struct {
	bad  []error
	recs []keyedPos
	last keyedPos
}

// Pos returns where the record Next returned last is in its input; a
// malformed row's RowError names its own.
func (o *orderedRows) Pos() (string, int) { return o.last.name, o.last.line }

func (o *orderedRows) Next() (ingest.Record, error) {
	if len(o.bad) > 0 {
		err := o.bad[0]
		o.bad = o.bad[1:]
		return ingest.Record{}, err
	}
	if len(o.recs) == 0 {
		return ingest.Record{}, io.EOF
	}
	o.last, o.recs = o.recs[0], o.recs[1:]
	return o.last.rec, nil
}
