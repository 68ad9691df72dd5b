package sinksim

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/sinkwire"
)

// readBody reads every element as encoding/json fills a sink.WireRecord:
// names without regard to case, the last of a repeated name, null leaving
// a field as it is, escapes, and a wrong type named for the element alone.
func TestReadBodyAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	body := `[
		{"id":"a","cost":3,"value":{"x":1},"key":"k"},
		{"ID":"upper","Cost":2,"VALUE":{"y":[1,{"z":null}]},"Key":"K"},
		{"id":"first","id":"last","value":{}},
		{"id":"kept","id":null,"cost":null,"value":{}},
		{"id":"esc\u00e9\n","key":"\ud83d\ude00","value":{"s":"\"q\""},"other":{"id":"nested"}},
		{"id":"val-null","value":null},
		{"id":"val-str","value":"text"},
		{"value":{}}
	]`
	var want []sinkwire.Record
	require.NoError(t, json.Unmarshal([]byte(body), &want))
	got, err := readBody([]byte(body), true)
	require.NoError(t, err)
	require.Len(t, got, len(want))
	for i, w := range want {
		el := got[i]
		require.True(t, el.object, "element %d", i)
		require.NoError(t, el.typeErr, "element %d", i)
		require.Equal(t, w.ID, el.rec.ID, "element %d", i)
		require.Equal(t, w.Key, el.rec.Key, "element %d", i)
		require.Equal(t, w.Cost, el.rec.Cost, "element %d", i)
		require.Equal(t, string(w.Value), string(el.value), "element %d", i)
		require.Equal(t, len(w.Value), el.valueN, "element %d", i)
	}

	for _, bad := range []string{`[{"id":7,"value":{}}]`, `[{"id":"a","cost":1.5,"value":{}}]`, `[{"id":"a","cost":"1","value":{}}]`,
		`[{"id":["a"],"value":{}}]`, `[{"id":"a","key":true,"value":{}}]`} {
		var w []sinkwire.Record
		require.Error(t, json.Unmarshal([]byte(bad), &w), bad)
		got, err := readBody([]byte(bad), false)
		require.NoError(t, err, bad)
		require.Error(t, got[0].typeErr, bad)
	}
}
