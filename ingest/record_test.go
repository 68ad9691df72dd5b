package ingest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/ingest/ingesttest"
)

// decodedID is what ScanObject must agree with: the value decoded whole
// with encoding/json (the way record IDs were found before), object and
// all. ok is false when the value is not one JSON object; noID when the
// field is missing, null or empty.
func decodedID(value []byte, field string) (id string, ok, noID bool, err error) {
	trimmed := bytes.Trim(value, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(value) {
		return "", false, false, errors.New("not an object")
	}
	if field == "" {
		return "", true, false, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(value, &obj); err != nil {
		return "", true, false, err
	}
	raw, found := obj[field]
	if !found || string(raw) == "null" {
		return "", true, true, errors.New("missing")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true, s == "", nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String(), true, false, nil
	}
	return "", true, false, errors.New("neither a string nor a number")
}

// checkScan compares ScanObject with decodedID on value for field.
func checkScan(t *testing.T, value []byte, field string) {
	t.Helper()
	want, ok, noID, wantErr := decodedID(value, field)
	got, err := ingest.ScanObject(value, field)
	switch {
	case !ok:
		require.ErrorIs(t, err, ingest.ErrNotObject, "%q", value)
		require.Empty(t, got)
	case noID:
		require.ErrorIs(t, err, ingest.ErrNoID, "%q", value)
		require.ErrorContains(t, err, field)
	case wantErr != nil:
		require.Error(t, err, "%q", value)
		require.NotErrorIs(t, err, ingest.ErrNotObject, "%q", value)
		require.NotErrorIs(t, err, ingest.ErrNoID, "%q", value)
	default:
		require.NoError(t, err, "%q", value)
		require.Equal(t, want, got, "%q", value)
	}
}

// malformed are values that are not records, or are records without a
// usable ID, each a way input goes wrong.
var malformed = []string{
	``, ` `, `null`, `"id"`, `42`, `[{"id":"a"}]`, `true`,
	`{`, `}`, `{"id"`, `{"id":`, `{"id":"a"`, `{"id":"a",}`, `{"id" "a"}`, `{id:"a"}`, `{'id':'a'}`,
	`{"id":"a"} `, "\n{\"id\":\"a\"}\r\n", `{"id":"a"}{"id":"b"}`, `{"id":"a"} x`, `{"id":"a"}}`,
	`{"id":"unterminated}`, `{"id":"bad \x escape"}`, `{"id":"\u12"}`, `{"id":"tab	in string"}`,
	`{"id":tru}`, `{"id":nul}`, `{"id":01}`, `{"id":1.}`, `{"id":-}`, `{"id":1e}`, `{"id":+1}`, `{"id":NaN}`,
	`{"id":null}`, `{"id":""}`, `{"id":true}`, `{"id":{"x":1}}`, `{"id":["a"]}`, `{"x":{"id":"nested"}}`,
	`{"id":1e400}`, `{"id":-0.5e-3}`, `{"id":12345678901234567890123}`,
	`{"id":"a","id":"b"}`, `{"id":"a","id":null}`, `{"id":null,"id":7}`, `{"i\u0064":"escaped name"}`,
	`{"id":"\u00e9\ud83d\ude00"}`, "{\"id\":\"a\xffb\"}", "{\"i\xffd\":\"x\"}", `{"id":"\ud800"}`,
	"\xef\xbb\xbf{\"id\":\"bom\"}", "\v{\"id\":\"a\"}", "{\"id\":\"a\"}\x00",
	strings.Repeat(`{"a":`, 200) + `1` + strings.Repeat(`}`, 200),
	strings.Repeat(`[`, 20000) + strings.Repeat(`]`, 20000),
	`{"a":` + strings.Repeat(`[`, 20000) + strings.Repeat(`]`, 20000) + `,"id":"deep"}`,
}

// The fast path agrees with decoding the whole value on every row of the
// USGS sample and on malformed input, for the ID field, a field absent
// from some rows, and no field (validation only).
func TestScanObjectAgreesWithFullDecoding(t *testing.T) {
	t.Parallel()
	var values [][]byte
	values = append(values, ingesttest.USGSValues(t)...)
	for _, m := range malformed {
		values = append(values, []byte(m))
	}
	for _, v := range values {
		for _, field := range []string{"id", "magError", "net", ""} {
			checkScan(t, v, field)
		}
	}
}

// Errors name what is wrong: the syntax error and where, the kind of a
// value that is not an object, the field.
func TestScanObjectErrorsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ value, want string }{
		{``, "not a JSON object: the value is empty"},
		{`[1]`, "not a JSON object: a JSON array"},
		{`{"id":"a"`, "not a JSON object: jsontext: unexpected EOF after offset 9"},
		{`{"id":"a"} x`, "invalid character 'x' at start of value after offset 11"},
		{`{"id":{"x":1}}`, `id field "id" is neither a string nor a number: {"x":1}`},
		{`{"x":1}`, `ingest: no record ID: field "id" is missing`},
		{`{"id":""}`, `ingest: no record ID: field "id" is empty`},
	} {
		_, err := ingest.ScanObject([]byte(tc.value), "id")
		require.ErrorContains(t, err, tc.want, "%q", tc.value)
	}
}

func FuzzScanObject(f *testing.F) {
	for _, v := range ingesttest.USGSValues(f)[:200] {
		f.Add(v)
	}
	for _, m := range malformed {
		f.Add([]byte(m))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		for _, field := range []string{"id", ""} {
			checkScan(t, value, field)
		}
	})
}

// BenchmarkRecordID reads the ID of 1 KiB USGS records from their raw
// bytes (scan), against decoding each whole (decode, the former way).
func BenchmarkRecordID(b *testing.B) {
	values := ingesttest.USGSRecords(b, 1000, 1024)
	b.Run("scan", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := ingest.RecordID(values[i%len(values)], "id"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, ok, _, err := decodedID(values[i%len(values)], "id"); !ok || err != nil {
				b.Fatal(err)
			}
		}
	})
}
