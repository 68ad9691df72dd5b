//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
)

// usgsRepeated writes rows rows of the USGS file to a temporary CSV,
// repeating the file with fresh IDs: the k-th repetition of id X is
// "X-k" (the first keeps X).
func usgsRepeated(t *testing.T, rows int) string {
	t.Helper()
	in, err := os.Open(usgs)
	require.NoError(t, err)
	defer in.Close()
	all, err := csv.NewReader(in).ReadAll()
	require.NoError(t, err)
	header, recs := all[0], all[1:]
	idCol := slices.Index(header, "id")
	require.GreaterOrEqual(t, idCol, 0, "the USGS file has an id column")
	path := filepath.Join(t.TempDir(), "usgs-repeated.csv")
	f, err := os.Create(path)
	require.NoError(t, err)
	bw := bufio.NewWriterSize(f, 1<<20)
	w := csv.NewWriter(bw)
	require.NoError(t, w.Write(header))
	row := make([]string, len(header))
	for i := range rows {
		copy(row, recs[i%len(recs)])
		if k := i / len(recs); k > 0 {
			row[idCol] += "-" + strconv.Itoa(k)
		}
		require.NoError(t, w.Write(row))
	}
	w.Flush()
	require.NoError(t, w.Error())
	require.NoError(t, bw.Flush())
	require.NoError(t, f.Close())
	return path
}

// endOffsetsSum is how many records the topic has had produced to it:
// the sum of its partitions' end offsets.
func endOffsetsSum(ctx context.Context, topic string) (int64, error) {
	ends, err := queue.EndOffsets(ctx, []string{brokers}, topic)
	var n int64
	for _, end := range ends {
		n += end
	}
	return n, err
}

// kill -9 of a bulk load while it is still producing, then the same
// command again: the rerun produces only the rows the first run had not
// had acknowledged (all the records the topic received from both runs,
// counted by its end offsets, are at most 1.1 × the file's rows), the
// sink stores every record once, and the rerun exits 0.
//
// The input is 300,000 USGS rows (the file repeated with fresh IDs), which
// a bulk load produces in 2 s (at 160,000 rows/s, bench scenario 9) to
// 10 s (a loaded 2-core machine). The test watches the topic's end
// offsets and kills the load once a quarter of the rows are in, then
// checks that the kill landed mid-production: fewer records in the topic
// than rows, no "file produced" in the first run's log, a rerun that
// skips some rows and produces the others. What a rerun may produce again
// is what the first run had sent but not yet saved as done (progress is
// saved every 100 ms; up to 10,000 records await the broker's answer):
// about 26,000 rows at 160,000 rows/s, under the 30,000 the bound
// allows. A rerun that started over would produce 1.25 × the rows. The
// sink drains 25,000 records/s.
func TestBulkLoadResumesAfterKillDuringProduction(t *testing.T) {
	t.Parallel()
	const rows = 300_000
	path := usgsRepeated(t, rows)
	e := newEnv(t, 25_000, 20, 5*time.Second)
	args, summary, _ := e.bulkLoadArgs(e.sim, path)
	p := e.start("bulk-load", args...)

	// Kill it once a quarter of the rows are in the topic.
	var atKill int64
	require.Eventually(t, func() bool {
		n, err := endOffsetsSum(t.Context(), e.name)
		if err != nil || n < rows/4 {
			return false
		}
		p.signal(t, syscall.SIGKILL)
		atKill = n
		return true
	}, 2*time.Minute, 5*time.Millisecond, "the load did not produce a quarter of its rows")
	_, ok := p.wait(10 * time.Second)
	require.True(t, ok)
	// What the broker had read before the kill is appended all the same:
	// the count once it stops growing.
	var first int64
	require.Eventually(t, func() bool {
		before := first
		n, err := endOffsetsSum(t.Context(), e.name)
		first = n
		return err == nil && n == before
	}, 10*time.Second, 100*time.Millisecond)
	log, err := os.ReadFile(p.log)
	require.NoError(t, err)
	t.Logf("killed with %d records in the topic (%d once it died), %d stored", atKill, first, e.stats().Accepted)
	require.Less(t, first, int64(rows), "the kill landed while the load was producing")
	require.NotContains(t, string(log), "file produced", "the kill landed while the load was producing")

	began := time.Now()
	code, out := e.run(3*time.Minute, args...)
	require.Equal(t, 0, code, out)
	s := readSummaryFile(t, summary)
	total, err := endOffsetsSum(t.Context(), e.name)
	require.NoError(t, err)
	st := e.stats()
	t.Logf("the rerun took %s: skipped %d rows, produced %d; the topic received %d records for %d rows (%.3f×); %+v",
		time.Since(began).Round(time.Millisecond), s.RecordsSkipped, s.RecordsProduced, total, rows, float64(total)/rows, s)
	require.LessOrEqual(t, float64(total), 1.1*rows, "records produced by both runs")
	require.EqualValues(t, rows, st.Accepted, "every record stored once")
	require.Contains(t, out, "resuming a load an earlier run left unfinished")
	require.Positive(t, s.RecordsSkipped, "the rerun skipped what the first run produced")
	require.Positive(t, s.RecordsProduced, "the rerun produced the rest")
	require.EqualValues(t, rows, s.RecordsSkipped+s.RecordsProduced)
	require.Zero(t, s.RecordsDeadLettered)
	require.Zero(t, e.dlqCount())
	e.report(st)
}
