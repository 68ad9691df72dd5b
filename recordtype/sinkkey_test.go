package recordtype

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func TestSinkKeyStrategies(t *testing.T) {
	t.Parallel()
	rec := []byte(`{"net":"nc","time":"2025-05-01T00:00:01.234Z","id":"nc75191211","seq":1234567,"mag":4.5,"ok":true}`)
	tests := []struct {
		template, strategy, want string
	}{
		{"{time}/{id}", "", "2025-05-01T00:00:01.234Z/nc75191211"},
		{"{time}/{id}", "none", "2025-05-01T00:00:01.234Z/nc75191211"},
		{"{net}-{mag}-{ok}", "none", "nc-4.5-true"},
		{"{time}/{id}", "reverse", "Z432.10:00:00T10-50-5202/nc75191211"},
		{"{seq}/{id}", "bit-reverse", "16243155645879025664/nc75191211"},
		{"{id}", "hash-prefix:4", "4ccf/nc75191211"},
		{"{id}", "shard:16", "05/nc75191211"},
		{"{id}", "uuid4", "077d55db-54d8-45ce-a1d2-2f6d01a08072/nc75191211"},
	}
	for _, tt := range tests {
		t.Run(tt.template+" "+tt.strategy, func(t *testing.T) {
			t.Parallel()
			k, err := NewSinkKey(tt.template, tt.strategy)
			require.NoError(t, err)
			got, err := k.Key(rec)
			require.NoError(t, err)
			again, err := k.Key(rec)
			require.NoError(t, err)
			require.Equal(t, got, again, "deterministic")
			require.Equal(t, tt.want, got)
		})
	}
}

func TestSinkKeyErrors(t *testing.T) {
	t.Parallel()
	rules := []struct{ template, strategy, wantErr string }{
		{"", "none", "template is empty"},
		{"{time", "none", "unclosed '{'"},
		{"time}", "none", "unmatched '}'"},
		{"{}", "none", "empty placeholder {}"},
		{"{$id}/{time}", "none", "unknown placeholder {$id}"},
		{"{id}", "hash-prefix", "want hash-prefix:N with N in 1..32"},
		{"{id}", "hash-prefix:33", "1..32"},
		{"{id}", "shard:0", "want shard:N"},
		{"{id}", "reverse:2", "takes no argument"},
		{"{id}", "zigzag", `unknown strategy "zigzag"`},
	}
	for _, r := range rules {
		_, err := NewSinkKey(r.template, r.strategy)
		require.ErrorIs(t, err, ErrSinkKey)
		require.ErrorContains(t, err, r.wantErr)
	}
	k, err := NewSinkKey("{time}/{id}", "bit-reverse")
	require.NoError(t, err)
	_, err = k.Key([]byte(`{"id":"a"}`))
	require.ErrorContains(t, err, `field "time" is missing`)
	_, err = k.Key([]byte(`{"id":"a","time":{"x":1}}`))
	require.ErrorContains(t, err, `field "time" is an object or array`)
	_, err = k.Key([]byte(`{"id":"a","time":"2025"}`))
	require.NoError(t, err)
	_, err = k.Key([]byte(`{"id":"a","time":"-1"}`))
	require.ErrorContains(t, err, "bit-reverse needs an unsigned 64-bit number")
	_, err = k.Key([]byte(`[1]`))
	require.ErrorContains(t, err, "not a JSON object")
}

func TestSinkKeyProcessorSetsThePartitionKey(t *testing.T) {
	t.Parallel()
	k, err := NewSinkKey("{id}", "shard:16")
	require.NoError(t, err)
	out, err := k.Processor().Process(ingest.Record{ID: "nc1", Value: []byte(`{"id":"nc1"}`)})
	require.NoError(t, err)
	require.Equal(t, "nc1", out.ID)
	require.True(t, strings.HasSuffix(out.SinkKey, "/nc1"))
	require.Len(t, out.PartitionKey, 2)
	_, err = k.Processor().Process(ingest.Record{ID: "x", Value: []byte(`{}`)})
	require.ErrorContains(t, err, `field "id" is missing`)
}

// Sequential keys (10,000 timestamps a millisecond apart) and 64 equal
// ranges of the sorted key space, as a store splits it: with "none" the
// newest 1/16 of the writes all fall in the newest ranges, the hotspot;
// with a spreading strategy they reach at least 16 ranges (shard:16 has
// exactly 16 prefixes) and no range gets more than twice its share.
func TestSinkKeySpread(t *testing.T) {
	t.Parallel()
	const n, ranges, newest = 10_000, 64, 10_000 / 16
	recs := make([][]byte, n)
	for i := range n {
		recs[i] = fmt.Appendf(nil, `{"time":"2025-05-01T00:%02d:%02d.%03dZ","id":"nc%08d","seq":%d}`, i/60000, i/1000%60, i%1000, i, i+1)
	}
	for _, tt := range []struct {
		template, strategy string
		spread             bool
	}{
		{"{time}/{id}", "none", false},
		{"{time}/{id}", "hash-prefix:4", true},
		{"{time}/{id}", "reverse", true},
		{"{time}/{id}", "shard:16", true},
		{"{time}/{id}", "uuid4", true},
		{"{seq}/{id}", "bit-reverse", true},
	} {
		t.Run(tt.strategy, func(t *testing.T) {
			t.Parallel()
			k, err := NewSinkKey(tt.template, tt.strategy)
			require.NoError(t, err)
			keys := make([]string, n)
			for i, r := range recs {
				keys[i], err = k.Key(r)
				require.NoError(t, err)
			}
			sorted := append([]string(nil), keys...)
			sort.Strings(sorted)
			hit := map[int]int{}
			for _, key := range keys[n-newest:] {
				hit[sort.SearchStrings(sorted, key)*ranges/n]++
			}
			if !tt.spread {
				require.Len(t, hit, ranges/16, "sequential keys: the newest writes fill the newest ranges")
				return
			}
			require.GreaterOrEqual(t, len(hit), 16, "the newest writes reach many ranges")
			for r, c := range hit {
				require.LessOrEqual(t, c, 2*newest/16, "range %d gets at most twice its share", r)
			}
		})
	}
}

func FuzzSinkKey(f *testing.F) {
	f.Add(`{"time":"2025-05-01T00:00:00Z","id":"nc1","seq":42}`, "hash-prefix:4")
	f.Add(`{"time":"","id":"\u00e9\u4e16","seq":18446744073709551615}`, "reverse")
	f.Add(`{"time":"1","id":"x","seq":0}`, "bit-reverse")
	f.Add(`{"time":null,"id":[1]}`, "shard:16")
	f.Add(`{"id":"a/b/c","time":"t/u"}`, "uuid4")
	f.Add(`not json`, "none")
	f.Fuzz(func(t *testing.T, value, strategy string) {
		for _, template := range []string{"{time}/{id}", "{seq}/{id}", "{id}"} {
			k, err := NewSinkKey(template, strategy)
			if err != nil {
				require.ErrorIs(t, err, ErrSinkKey)
				continue
			}
			a, errA := k.Key([]byte(value))
			b, errB := k.Key([]byte(value))
			require.Equal(t, errA == nil, errB == nil)
			require.Equal(t, a, b, "deterministic")
			if errA == nil && strategy != "" && strategy != "none" {
				require.NotEmpty(t, a)
			}
		}
	})
}
