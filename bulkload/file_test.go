package bulkload_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/recordtype"
)

func readAll(t *testing.T, path, idField string) (recs []ingest.Record, bad []*bulkload.RowError) {
	t.Helper()
	f, err := bulkload.OpenFile(path, "", idField)
	require.NoError(t, err)
	defer f.Close()
	recs, bad, err = readRows(f)
	require.NoError(t, err)
	return recs, bad
}

// readRows reads rows to their end: the records, the rows named bad, and
// the error that ended them early (nil at their end). Unlike drain, it
// stops at an error that is not a bad row.
func readRows(rows bulkload.Rows) (recs []ingest.Record, bad []*bulkload.RowError, err error) {
	for {
		rec, err := rows.Next()
		var rowErr *bulkload.RowError
		switch {
		case err == io.EOF:
			return recs, bad, nil
		case errors.As(err, &rowErr):
			bad = append(bad, rowErr)
		case err != nil:
			return recs, bad, err
		default:
			recs = append(recs, rec)
		}
	}
}

func TestOpenFileReadsTheUSGSData(t *testing.T) {
	t.Parallel()
	recs, bad := readAll(t, "../testdata/usgs-earthquakes-2025-05.csv", "id")
	require.Empty(t, bad)
	require.Len(t, recs, 9366)
	ids := map[string]bool{}
	for _, r := range recs {
		ids[r.ID] = true
	}
	require.Len(t, ids, 9366, "ids are unique")
	var first map[string]any
	require.NoError(t, json.Unmarshal(recs[0].Value, &first))
	require.Equal(t, "nn00898537", first["id"])
	require.Equal(t, "45 km ESE of Beatty, Nevada", first["place"])
	require.Nil(t, first["horizontalError"], "empty fields are null")
}

func TestMalformedCSVRowsAreNamedAndSkipped(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bad.csv")
	data := "id,place\n" +
		"a,\"Pāhala, Hawaii\"\n" +
		"b,too,many\n" +
		"c,bad \"quote\n" +
		"d,Mýrina\n"
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
	recs, bad := readAll(t, path, "id")
	require.Len(t, recs, 2)
	require.Equal(t, "a", recs[0].ID)
	require.Equal(t, "d", recs[1].ID, "rows after bad ones still load")
	require.Len(t, bad, 2)
	require.Equal(t, 3, bad[0].Line)
	require.Equal(t, 4, bad[1].Line)
	require.Contains(t, bad[1].Error(), `bad.csv:4: bare " in non-quoted-field`)
	require.Contains(t, bad[0].Error(), "bad.csv:3: wrong number of fields")
	require.Equal(t, "b,too,many", string(bad[0].Raw))
}

func TestOpenFileErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "x.csv")
	require.NoError(t, os.WriteFile(csvPath, []byte("a,b\n1,2\n"), 0o600))
	_, err := bulkload.OpenFile(csvPath, "", "id")
	require.ErrorContains(t, err, `"id" is not a column (columns: a, b)`)
	var se *bulkload.SettingError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "IDField", se.Setting)
	_, err = bulkload.OpenFile(filepath.Join(dir, "x.txt"), "", "")
	require.ErrorContains(t, err, "set it to csv or ndjson")
	require.ErrorAs(t, err, &se)
	require.Equal(t, "Format", se.Setting)
	_, err = bulkload.OpenFile(filepath.Join(dir, "missing.csv"), "", "")
	require.ErrorContains(t, err, "missing.csv")
}

func TestNDJSONBadLinesAreNamed(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "x.ndjson")
	require.NoError(t, os.WriteFile(path, []byte("{\"id\":1}\n[1,2]\n\n{\"id\":\"x\"}\n"), 0o600))
	recs, bad := readAll(t, path, "id")
	require.Len(t, recs, 2)
	require.Equal(t, "1", recs[0].ID)
	require.Len(t, bad, 1)
	require.Equal(t, 2, bad[0].Line)
}

// A line over MaxRowBytes is a bad row named by its line, and the lines
// after it are read; a CSV row that outgrows it (an unclosed quote) ends
// the file with an error naming where it starts.
func TestRowsOverTheLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	read := func(path string) (ids []string, bad []*bulkload.RowError, err error) {
		f, err := bulkload.Open([]string{path}, bulkload.InputConfig{IDField: "id", MaxRowBytes: 1 << 10})
		require.NoError(t, err)
		defer f.Close()
		recs, bad, err := readRows(f)
		for _, r := range recs {
			ids = append(ids, r.ID)
		}
		return ids, bad, err
	}

	long := strings.Repeat("x", 3<<10)
	ndjson := filepath.Join(dir, "long.ndjson")
	require.NoError(t, os.WriteFile(ndjson, []byte(`{"id":"a"}`+"\n"+`{"id":"b","note":"`+long+`"}`+"\n"+`{"id":"c"}`+"\n"), 0o600))
	ids, bad, err := read(ndjson)
	require.NoError(t, err)
	require.Equal(t, []string{"a", "c"}, ids, "the neighbours of the long line are read")
	require.Len(t, bad, 1)
	require.Equal(t, 2, bad[0].Line)
	require.ErrorContains(t, bad[0], "long.ndjson:2: line longer than 1024 bytes")

	csvPath := filepath.Join(dir, "open.csv")
	require.NoError(t, os.WriteFile(csvPath, []byte("id,note\na,ok\nb,\"never closed\n"+long+"\nc,ok\n"), 0o600))
	ids, _, err = read(csvPath)
	require.Equal(t, []string{"a"}, ids)
	require.ErrorContains(t, err, "open.csv: the row starting at line 3 or after is longer than 1024 bytes (an unclosed quote?)")
}

func TestRowsTheValidatorRefusesAreNamed(t *testing.T) {
	t.Parallel()
	types, err := recordtype.Load(filepath.Join("..", "examples", "types.yaml"))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "x.ndjson")
	require.NoError(t, os.WriteFile(path, []byte(`{"id":"a","time":"t"}`+"\n"+`{"id":"b"}`+"\n"+`{"id":"c","time":"t"}`+"\n"), 0o600))
	f, err := bulkload.Open([]string{path}, bulkload.InputConfig{IDField: "id", Validate: types["earthquake"].Validate})
	require.NoError(t, err)
	var ids []string
	for {
		rec, err := f.Next()
		if err == io.EOF {
			break
		}
		var rowErr *bulkload.RowError
		if errors.As(err, &rowErr) {
			require.Equal(t, 2, rowErr.Line)
			require.ErrorContains(t, rowErr, "x.ndjson:2:")
			require.ErrorContains(t, rowErr, "time")
			continue
		}
		require.NoError(t, err)
		ids = append(ids, rec.ID)
	}
	require.Equal(t, []string{"a", "c"}, ids, "the neighbours of the bad row are read")
}

// Open expands directories (their data files, in name order) and globs,
// refuses an input named twice, and tells gzip and zstd by extension, by
// their first bytes, or by the Compression setting.
func TestOpenExpandsAndDecompresses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}
	gz := func(s string) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = w.Write([]byte(s))
		require.NoError(t, w.Close())
		return b.Bytes()
	}
	zst := func(s string) []byte {
		w, err := zstd.NewWriter(nil)
		require.NoError(t, err)
		defer w.Close()
		return w.EncodeAll([]byte(s), nil)
	}
	write("data/b.csv", []byte("id\nb1\nb2\n"))
	write("data/a.ndjson.zst", zst(`{"id":"a1"}`+"\n"))
	write("data/c.jsonl", []byte(`{"id":"c1"}`+"\n"))
	write("data/notes.txt", []byte("skipped\n"))
	write("data/.hidden.csv", []byte("id\nx\n"))
	write("data/sub/d.csv", []byte("id\nd1\n"))
	noExt := write("export-1", gz("id\ne1\ne2\n")) // gzip told by its first bytes
	ids := func(in *bulkload.Input) (out []string) {
		for {
			rec, err := in.Next()
			if err == io.EOF {
				return out
			}
			require.NoError(t, err)
			name, _ := in.Pos()
			out = append(out, filepath.Base(name)+":"+rec.ID)
		}
	}

	in, err := bulkload.Open([]string{filepath.Join(dir, "data")}, bulkload.InputConfig{IDField: "id"})
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(dir, "data", "a.ndjson.zst"), filepath.Join(dir, "data", "b.csv"), filepath.Join(dir, "data", "c.jsonl")}, in.Names())
	require.Equal(t, []string{"a.ndjson.zst:a1", "b.csv:b1", "b.csv:b2", "c.jsonl:c1"}, ids(in))

	in, err = bulkload.Open([]string{filepath.Join(dir, "data", "*.csv"), noExt}, bulkload.InputConfig{Format: "csv", IDField: "id"})
	require.NoError(t, err)
	require.Equal(t, []string{"b.csv:b1", "b.csv:b2", "export-1:e1", "export-1:e2"}, ids(in))

	// Standard input, compressed, told by the setting.
	in, err = bulkload.Open([]string{"-"}, bulkload.InputConfig{Format: "ndjson", Compression: "zstd", IDField: "id",
		Stdin: bytes.NewReader(zst(`{"id":"s1"}` + "\n" + `{"id":"s2"}` + "\n"))})
	require.NoError(t, err)
	require.Equal(t, []string{"stdin:s1", "stdin:s2"}, ids(in))
	_, err = in.Digest()
	require.ErrorIs(t, err, bulkload.ErrNoIdentity)

	for _, tc := range []struct {
		names []string
		cfg   bulkload.InputConfig
		want  string
	}{
		{[]string{filepath.Join(dir, "data", "b.csv"), filepath.Join(dir, "data", "*.csv")}, bulkload.InputConfig{}, "b.csv: named twice in the inputs"},
		{[]string{filepath.Join(dir, "data", "sub", "*.ndjson")}, bulkload.InputConfig{}, "the pattern matches no file"},
		{[]string{filepath.Join(dir, "data", "sub", "none")}, bulkload.InputConfig{}, "cannot tell the format"},
		{[]string{t.TempDir()}, bulkload.InputConfig{}, "a directory with no .csv, .ndjson or .jsonl file"},
		{[]string{noExt}, bulkload.InputConfig{Format: "csv", Compression: "zstd"}, "zstd"},
		{[]string{filepath.Join(dir, "data", "b.csv")}, bulkload.InputConfig{Compression: "gzip"}, "bulkload: Compression: " + filepath.Join(dir, "data", "b.csv") + ": not gzip"},
		{[]string{"-", "-"}, bulkload.InputConfig{Format: "csv"}, "-: named twice"},
		{nil, bulkload.InputConfig{}, "no input given"},
	} {
		_, err := bulkload.Open(tc.names, tc.cfg)
		require.ErrorContains(t, err, tc.want, "%v", tc.names)
	}
}
