package bench

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/klauspost/compress/gzip"
)

// GenerateUSGS writes rows rows of the USGS file, repeated with fresh IDs
// (the k-th repetition of id X is X-k; the first keeps X), as a
// gzip-compressed CSV with the USGS header, to path. It writes to a
// temporary file and renames it, so an interrupted run leaves no partial
// file behind. It reads the USGS file relative to the working directory
// (the repository root).
func GenerateUSGS(path string, rows int) error {
	data, err := os.ReadFile(usgsPath)
	if err != nil {
		return err
	}
	all, err := csv.NewReader(bytes.NewReader(data)).ReadAll()
	if err != nil {
		return fmt.Errorf("%s: %w", usgsPath, err)
	}
	header, recs := all[0], all[1:]
	idCol := slices.Index(header, "id")
	if idCol < 0 {
		return fmt.Errorf("%s: no id column", usgsPath)
	}
	// Each row as the CSV text before and after its ID, so a repetition
	// only writes a new ID between them.
	type split struct {
		before, after []byte
		id            string
	}
	rowsText := make([]split, len(recs))
	for i, rec := range recs {
		var b bytes.Buffer
		w := csv.NewWriter(&b)
		marked := slices.Clone(rec)
		marked[idCol] = "\x00"
		if err := w.Write(marked); err != nil {
			return err
		}
		w.Flush()
		before, after, _ := bytes.Cut(b.Bytes(), []byte{0})
		rowsText[i] = split{before: before, after: after, id: rec[idCol]}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	zw := gzip.NewWriter(tmp)
	bw := bufio.NewWriterSize(zw, 1<<20)
	var hb bytes.Buffer
	hw := csv.NewWriter(&hb)
	_ = hw.Write(header)
	hw.Flush()
	bw.Write(hb.Bytes())
	var id []byte
	for i := range rows {
		r := rowsText[i%len(rowsText)]
		bw.Write(r.before)
		id = append(id[:0], r.id...)
		if k := i / len(rowsText); k > 0 {
			id = append(id, '-')
			id = strconv.AppendInt(id, int64(k), 10)
		}
		bw.Write(id)
		bw.Write(r.after)
	}
	if err := bw.Flush(); err != nil {
		tmp.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
