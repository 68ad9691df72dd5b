// Package ingesttest holds fixtures for the tests of packages built on
// ingest: the repository's real USGS sample as the JSON values bulk-load
// produces.
package ingesttest

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// USGSValues returns the rows of the USGS sample as JSON objects (a column
// that parses as a number is a number, an empty one null), the way
// bulk-load produces them.
func USGSValues(tb testing.TB) [][]byte {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(root(), "testdata", "usgs-earthquakes-2025-05.csv"))
	require.NoError(tb, err)
	all, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	require.NoError(tb, err)
	header := all[0]
	out := make([][]byte, 0, len(all)-1)
	for _, row := range all[1:] {
		var b bytes.Buffer
		b.WriteByte('{')
		for i, v := range row {
			if i > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(header[i])
			b.Write(k)
			b.WriteByte(':')
			if v == "" {
				b.WriteString("null")
			} else if _, err := strconv.ParseFloat(v, 64); err == nil {
				b.WriteString(v)
			} else {
				s, _ := json.Marshal(v)
				b.Write(s)
			}
		}
		b.WriteByte('}')
		out = append(out, b.Bytes())
	}
	return out
}

// USGSRecords returns n records made of the USGS rows, repeated with fresh
// IDs ("<id>-<k>" for the k-th repetition), each padded with a "pad" field
// to about size bytes when size > 0.
func USGSRecords(tb testing.TB, n, size int) [][]byte {
	tb.Helper()
	rows := USGSValues(tb)
	out := make([][]byte, n)
	for i := range out {
		row := rows[i%len(rows)]
		v := bytes.Clone(row[:len(row)-1])
		if k := i / len(rows); k > 0 {
			// A fresh ID: the id field comes before any other "id".
			at := bytes.Index(v, []byte(`"id":"`)) + len(`"id":"`)
			end := at + bytes.IndexByte(v[at:], '"')
			v = append(v[:end:end], append([]byte("-"+strconv.Itoa(k)), v[end:]...)...)
		}
		if pad := size - len(v) - len(`,"pad":""}`); size > 0 && pad > 0 {
			v = append(v, `,"pad":"`...)
			v = append(v, strings.Repeat("x", pad)...)
			v = append(v, '"')
		}
		out[i] = append(v, '}')
	}
	return out
}

// root is the repository's root folder.
func root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
