package placeholder_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/placeholder"
)

func TestParseSplitsTextAndNames(t *testing.T) {
	t.Parallel()
	parts, err := placeholder.Parse("/v1/{net}/items/{$id}?m={mag}&again={net}", placeholder.ID)
	require.NoError(t, err)
	require.Equal(t, []string{"/v1/", "net", "/items/", "$id", "?m=", "mag", "&again=", "net", ""}, parts)
	require.Equal(t, []string{"net", "mag"}, placeholder.Fields(parts))
	for _, tc := range []struct{ s, want string }{
		{"{time", "unclosed '{'"},
		{"a}b", "unmatched '}'"},
		{"{a{b}}", "unclosed '{'"},
		{"x{ }y", "empty placeholder {}"},
		{"{$record}", "unknown placeholder {$record}"},
		{"{$nope}", "the record's own here: {$id}"},
	} {
		_, err := placeholder.Parse(tc.s, placeholder.ID)
		require.ErrorContains(t, err, tc.want, tc.s)
	}
	_, err = placeholder.Parse("{$id}")
	require.ErrorContains(t, err, "field names only here")
}

func TestValuesStandInText(t *testing.T) {
	t.Parallel()
	rec := ingest.Record{ID: "nc1", Value: []byte(`{"s":"a/b","n":2.50,"b":true,"z":null,"o":{"x":1},"e":""}`)}
	v := placeholder.Of(rec)
	for name, want := range map[string]string{"s": "a/b", "n": "2.50", "b": "true", "e": "", "$id": "nc1", "$key": "nc1"} {
		got, err := v.Text(name)
		require.NoError(t, err, name)
		require.Equal(t, want, got, name)
	}
	for name, want := range map[string]string{"z": `field "z" is null`, "o": `field "o" is an object or array, not a value to put in text`, "gone": `field "gone" is missing`} {
		_, err := v.Text(name)
		var fe *placeholder.FieldError
		require.ErrorAs(t, err, &fe, name)
		require.EqualError(t, err, want)
	}
	raw, err := v.JSON("o")
	require.NoError(t, err)
	require.JSONEq(t, `{"x":1}`, string(raw))
	out, err := placeholder.Render([]string{"", "s", "/", "$id", ""}, v, nil)
	require.NoError(t, err)
	require.Equal(t, "a/b/nc1", out)
	_, err = placeholder.Of(ingest.Record{Value: []byte(`[1]`)}).Text("s")
	require.EqualError(t, err, "value is not a JSON object")
}
