package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"
)

// usgsLines returns the USGS file's header and its first n rows.
func usgsLines(t *testing.T, n int) (header string, rows []string) {
	t.Helper()
	data, err := os.ReadFile("../../testdata/usgs-earthquakes-2025-05.csv")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return lines[0], lines[1 : n+1]
}

// ndjsonOf returns the USGS rows from..to as NDJSON lines, one object of
// strings per row.
func ndjsonOf(t *testing.T, from, to int) []string {
	t.Helper()
	header, rows := usgsLines(t, to)
	cols := strings.Split(header, ",")
	var out []string
	for _, row := range rows[from:to] {
		obj := map[string]string{}
		for i, v := range splitCSV(row) {
			obj[cols[i]] = v
		}
		b, err := json.Marshal(obj)
		require.NoError(t, err)
		out = append(out, string(b))
	}
	return out
}

// splitCSV splits a USGS row (quotes only around the place).
func splitCSV(row string) []string {
	var out []string
	for len(row) > 0 {
		if row[0] == '"' {
			end := strings.Index(row[1:], `"`) + 1
			out = append(out, row[1:end])
			row = strings.TrimPrefix(row[end+1:], ",")
			continue
		}
		field, rest, found := strings.Cut(row, ",")
		out = append(out, field)
		row = rest
		if !found {
			break
		}
	}
	return out
}

func writeCompressed(t *testing.T, path, content string) {
	t.Helper()
	var b bytes.Buffer
	var w io.WriteCloser
	switch filepath.Ext(path) {
	case ".gz":
		w = gzip.NewWriter(&b)
	case ".zst":
		zw, err := zstd.NewWriter(&b)
		require.NoError(t, err)
		w = zw
	default:
		t.Fatalf("no compression for %s", path)
	}
	_, err := io.WriteString(w, content)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o600))
}

// deadLetters reads a --dead-letter-file.
func deadLetters(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		out = append(out, m)
	}
	return out
}

// Each way of giving a bulk load its input — several files by a glob,
// standard input, a gzipped CSV, a zstd-compressed NDJSON file — loads
// every good record once with exact counts, and dead-letters the bad row
// with its file:line.
func TestBulkLoadInputs(t *testing.T) {
	header, rows := usgsLines(t, 300)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) (args []string, stdin string)
		total int64
		where string // the dead letter's file:line, relative to dir
		files int
	}{
		{
			name: "glob of three CSV files",
			setup: func(t *testing.T, dir string) ([]string, string) {
				for i, part := range [][]string{rows[:100], rows[100:200], rows[200:300]} {
					body := header + "\n" + strings.Join(part, "\n") + "\n"
					if i == 1 {
						body += "broken,row\n" // line 102 of part-1.csv
					}
					require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("part-%d.csv", i)), []byte(body), 0o600))
				}
				require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not an input\n"), 0o600))
				return []string{filepath.Join(dir, "part-*.csv")}, ""
			},
			total: 301, where: "part-1.csv:102", files: 3,
		},
		{
			name: "standard input",
			setup: func(t *testing.T, dir string) ([]string, string) {
				lines := ndjsonOf(t, 0, 250)
				lines = append(lines[:120], append([]string{`{"id": "unclosed`}, lines[120:]...)...) // line 121
				return []string{"--format", "ndjson", "-"}, strings.Join(lines, "\n") + "\n"
			},
			total: 251, where: "stdin:121", files: 1,
		},
		{
			name: "gzipped CSV",
			setup: func(t *testing.T, dir string) ([]string, string) {
				body := header + "\n" + strings.Join(rows[:150], "\n") + "\nbroken,row\n" + strings.Join(rows[150:], "\n") + "\n"
				path := filepath.Join(dir, "quakes.csv.gz")
				writeCompressed(t, path, body)
				return []string{path}, ""
			},
			total: 301, where: "quakes.csv.gz:152", files: 1,
		},
		{
			name: "zstd NDJSON",
			setup: func(t *testing.T, dir string) ([]string, string) {
				lines := ndjsonOf(t, 0, 200)
				lines = append(lines[:40], append([]string{`[1, 2, 3]`}, lines[40:]...)...) // line 41
				path := filepath.Join(dir, "quakes.ndjson.zst")
				writeCompressed(t, path, strings.Join(lines, "\n")+"\n")
				return []string{path}, ""
			},
			total: 201, where: "quakes.ndjson.zst:41", files: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args, stdin := tc.setup(t, dir)
			summary := filepath.Join(dir, "summary.json")
			dlq := filepath.Join(dir, "dlq.ndjson")
			code, stdout, stderr := runCLIWithStdin(t, strings.NewReader(stdin), append([]string{"bulk-load", "--embedded", "--capacity", "20000",
				"--id-field", "id", "--dead-letter-file", dlq, "--summary-json", summary}, args...)...)
			require.Equal(t, exitDeadLetters, code, "stderr:\n%s", stderr)
			s := readSummary(t, summary)
			require.Equal(t, tc.total, s.RecordsTotal)
			require.Equal(t, tc.total-1, s.RecordsProduced)
			require.Equal(t, tc.total-1, s.RecordsDelivered)
			require.Equal(t, int64(1), s.RecordsDeadLettered)
			require.Zero(t, s.DuplicatesAtSink)
			require.Equal(t, tc.total-1, s.SinkStats.Accepted, "every good record stored once")
			require.Len(t, s.Files, tc.files)
			var rowsRead int64
			for _, f := range s.Files {
				rowsRead += f.Rows
			}
			require.Equal(t, tc.total, rowsRead, "per-file counts add up")
			letters := deadLetters(t, dlq)
			require.Len(t, letters, 1)
			reason := letters[0]["reason"].(string)
			want := tc.where
			if !strings.HasPrefix(want, "stdin") {
				want = filepath.Join(dir, tc.where)
			}
			require.True(t, strings.HasPrefix(reason, want+": "), "reason %q names %s", reason, want)
			if tc.files > 1 {
				require.Contains(t, stdout, "part-1.csv: 101 rows, 100 produced, 0 skipped, 1 dead-lettered")
			}
		})
	}
}
