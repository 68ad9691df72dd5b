package bulkload

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// marshalRow is how rows were encoded before: json.Marshal of a map of the
// header to strings, nil for empty fields.
func marshalRow(t *testing.T, header, fields []string) []byte {
	t.Helper()
	obj := map[string]any{}
	for i, v := range fields {
		if v == "" {
			obj[header[i]] = nil
		} else {
			obj[header[i]] = v
		}
	}
	b, err := json.Marshal(obj)
	require.NoError(t, err)
	return b
}

// With every column a string, a row's JSON is byte for byte json.Marshal's,
// so content-hash IDs do not change: the USGS file, and random strings with
// every character class encoding/json escapes.
func TestRowEncodingMatchesJSONMarshal(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	header := rows[0]
	enc := newRowEncoder(header, CSVTypes{}, "id")
	for _, row := range rows[1:] {
		got, id, err := enc.encode(nil, row, "id")
		require.NoError(t, err)
		want := marshalRow(t, header, row)
		require.Equal(t, string(want), string(got))
		wantID, err := ingest.RecordID(want, "id")
		require.NoError(t, err)
		require.Equal(t, wantID, id)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", " ", `"`, `\`, "/", "<", ">", "&", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f",
		"é", "ā", "😀", "\u2028", "\u2029", "\xff", "\xc3", "\xe2\x80", "{", "}", ",", ":"}
	randString := func() string {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 2000 {
		header := []string{randString(), randString(), randString()}
		row := []string{randString(), randString(), randString()}
		got, _, err := newRowEncoder(header, CSVTypes{}, "").encode(nil, row, "")
		require.NoError(t, err)
		require.Equal(t, string(marshalRow(t, header, row)), string(got), "header %q row %q", header, row)
	}
}

func TestFieldConversion(t *testing.T) {
	t.Parallel()
	types := func(ts ...string) jsonKinds { return kindsOf(ts) }
	for _, tc := range []struct {
		kinds jsonKinds
		in    string
		want  string // "" with wantErr
		err   string
	}{
		{kindString, "4.2", `"4.2"`, ""},
		{kindString, "", "null", ""},
		{types("number"), "", "null", ""},
		{types("number", "null"), "4.2", "4.2", ""},
		{types("number"), "4.20", "4.20", ""}, // a JSON literal as written
		{types("number"), "-0.5e-3", "-0.5e-3", ""},
		{types("number"), " 7 ", "7", ""},
		{types("number"), "+5", "5", ""},
		{types("number"), ".5", "0.5", ""},
		{types("number"), "1e400", "1e400", ""}, // JSON numbers have no range
		{types("number"), "Infinity", "", `"Infinity" is not a number`},
		{types("number"), "NaN", "", `"NaN" is not a number`},
		{types("number"), "0x10", "", `"0x10" is not a number`},
		{types("number"), "abc", "", `"abc" is not a number`},
		{types("integer"), "10", "10", ""},
		{types("integer"), "007", "7", ""},
		{types("integer"), "+5", "5", ""},
		{types("integer"), "1.0", "1.0", ""}, // an integer to JSON Schema
		{types("integer"), "12345678901234567890123", "12345678901234567890123", ""},
		{types("integer"), "1.5", "", `"1.5" is not an integer`},
		{types("boolean"), "TRUE", "true", ""},
		{types("boolean"), "0", "false", ""},
		{types("boolean"), "yes", "", `"yes" is not a boolean`},
		{types("integer", "boolean"), "t", "true", ""},
		{types("integer", "boolean"), "x", "", `"x" is not an integer or a boolean`},
		{types("number", "string"), "abc", `"abc"`, ""}, // may be a string: stays one
		{types("object"), `{"a":1}`, `{"a":1}`, ""},
		{types("array"), `{"a":1}`, "", `is not a JSON array`},
		{kindAuto, "4.2", "4.2", ""},
		{kindAuto, "007", `"007"`, ""},
		{kindAuto, "+5", `"+5"`, ""},
		{kindAuto, "False", "false", ""},
		{kindAuto, "nc75191211", `"nc75191211"`, ""},
	} {
		got, err := appendField(nil, tc.in, tc.kinds)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%q as %v", tc.in, tc.kinds)
			var ce *ConversionError
			require.True(t, errors.As(err, &ce))
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.want, string(got), "%q as %v", tc.in, tc.kinds)
		require.True(t, json.Valid(got), "%s", got)
	}
}

// A declared column is converted; the ID comes out as RecordID would read
// it; a field that does not convert names its column.
func TestTypedRows(t *testing.T) {
	t.Parallel()
	header := []string{"id", "mag", "nst", "ok", "place"}
	enc := newRowEncoder(header, CSVTypes{Columns: map[string][]string{"mag": {"number", "null"}, "nst": {"integer", "null"}, "ok": {"boolean"}, "id": {"integer"}}}, "id")
	got, id, err := enc.encode(nil, []string{"42", "4.2", "", "true", "Pāhala"}, "id")
	require.NoError(t, err)
	require.Equal(t, `{"id":42,"mag":4.2,"nst":null,"ok":true,"place":"Pāhala"}`, string(got))
	require.Equal(t, "42", id)
	wantID, err := ingest.RecordID(got, "id")
	require.NoError(t, err)
	require.Equal(t, wantID, id)

	_, _, err = enc.encode(nil, []string{"43", "big", "1", "false", "x"}, "id")
	require.EqualError(t, err, `schema: column "mag": "big" is not a number`)
	_, _, err = enc.encode(nil, []string{"", "1", "1", "false", "x"}, "id")
	require.ErrorIs(t, err, ingest.ErrNoID)

	// Auto for the columns no schema declares.
	auto := newRowEncoder([]string{"a", "b", "c"}, CSVTypes{Auto: true}, "")
	got, _, err = auto.encode(nil, []string{"1", "true", "x"}, "")
	require.NoError(t, err)
	require.Equal(t, `{"a":1,"b":true,"c":"x"}`, string(got))
}

func TestParseCSVTypes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{"": false, "string": false, "auto": true} {
		got, err := ParseCSVTypes(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := ParseCSVTypes("typed")
	require.ErrorContains(t, err, "want auto or string")
}
