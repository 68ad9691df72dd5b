package bulkload

import (
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// The bar's description fits its room, keeps the count first, and shows
// why the sink is paused, and for how long, instead of a frozen ETA.
func TestDescribeFitsAndShowsAPause(t *testing.T) {
	t.Parallel()
	st := status{done: 1200, total: 9366, produced: 9366, rate: 980, eta: 8 * time.Second}
	for _, room := range []int{39, 59, 99} {
		d := describe(st, room)
		require.LessOrEqual(t, utf8.RuneCountInString(d), room, d)
		require.True(t, strings.HasPrefix(d, "1200/9366, ETA 8s"), d)
	}
	require.Equal(t, "1200/9366, ETA 8s, 980 rec/s ", describe(st, 59))

	st.pausedFor, st.pausedBy = 12*time.Second, "sink: HTTP 503: service unavailable\n(retry after 5s)"
	d := describe(st, 59)
	require.LessOrEqual(t, utf8.RuneCountInString(d), 59, d)
	require.Contains(t, d, "paused: sink: HTTP 503")
	require.Contains(t, d, " for 12s")
	require.NotContains(t, d, "ETA")
	require.Contains(t, describe(st, 99), "paused: sink: HTTP 503: service unavailable (retry after 5s) for 12s")
}

// The ETA comes from what was done over the last seconds, not from the
// leased rate: a sink that accepts 500 records/s of a pool of 2,000 gets
// the ETA of 500/s; a paused sink gets the pause, with the last error.
func TestETAFromTheAcceptedRate(t *testing.T) {
	t.Parallel()
	paused := false
	d := newDisplay(Config{Capacity: 2000}, false, func() (bool, time.Time) { return paused, time.Now().Add(-3 * time.Second) },
		func() string { return "HTTP 429: slow down" })
	var logs strings.Builder
	d.cfg.Logger = slogTo(&logs)
	start := time.Now()
	d.samples = []sample{{start.Add(-2 * time.Second), 0}}
	d.update(ingest.Totals{Delivered: 1000}, Produced{Read: 6000, Produced: 6000}, 2000)
	require.Contains(t, logs.String(), "records_per_s=500")
	require.Contains(t, logs.String(), "eta=10s", "5000 left at 500/s")

	paused, d.lastLog = true, time.Time{}
	logs.Reset()
	d.update(ingest.Totals{Delivered: 1000}, Produced{Read: 6000, Produced: 6000}, 2000)
	require.Contains(t, logs.String(), `paused="HTTP 429: slow down" paused_for=3s`)
	require.NotContains(t, logs.String(), "eta=")
}

func slogTo(w *strings.Builder) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// A sink that throttles persistently gets the capacity it accepted
// suggested: --capacity 2000 against a 1,000/s service.
func TestSummarySuggestsTheAcceptedCapacity(t *testing.T) {
	t.Parallel()
	s := Summary{Workers: 2, Pool: "quakes", Unit: "records", CapacityUnitsPerS: 2000, ElapsedS: 9.4, SinkRecordAttempts: 12000, SinkThrottled: 2634}
	s.SuggestedCapacity = suggestCapacity(s, ingest.Totals{Delivered: 9366, UnitsDelivered: 9366})
	require.Equal(t, 990.0, s.SuggestedCapacity, "9366 records in 9.4 s, two significant digits, rounded down")
	var b strings.Builder
	s.WriteText(&b)
	require.Contains(t, b.String(), "the sink throttled 2634 of 12000 attempts and accepted about 990 records/s of the 2000 the pool gives")
	require.Contains(t, b.String(), "run with --capacity 990")
	require.Contains(t, b.String(), "sluice pool set --pool quakes --capacity 990")

	s.SinkThrottled = 100 // under 5 %: no suggestion
	require.Zero(t, suggestCapacity(s, ingest.Totals{Delivered: 9366, UnitsDelivered: 9366}))
}

// An emulator that served others before reports this run's peaks from
// its 200 ms series: sums of five consecutive buckets from the load's
// start on.
func TestSeriesPeaks(t *testing.T) {
	t.Parallel()
	start := time.Now().Add(-10 * time.Second)
	buckets := []int64{900, 900, 900, 900, 900, 100, 200, 300, 400, 500, 50}
	max1s, max200 := seriesPeaks(start, buckets, start.Add(time.Second))
	require.Equal(t, int64(1500), max1s, "the earlier 4,500 are not this run's")
	require.Equal(t, int64(500), max200)
}

// A stall is told once every StallWarn while progress stands still; a
// paused sink, or any progress, starts the count again.
func TestStallWatch(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	var w stallWatch
	const after = 30 * time.Second
	require.False(t, w.stalled(at(0), 5, false, after))
	require.False(t, w.stalled(at(29), 5, false, after))
	require.True(t, w.stalled(at(30), 5, false, after), "30 s without progress")
	require.False(t, w.stalled(at(45), 5, false, after), "once per 30 s")
	require.True(t, w.stalled(at(60), 5, false, after), "again while it lasts")
	require.False(t, w.stalled(at(70), 5, true, after), "a paused sink is told by its own line")
	require.False(t, w.stalled(at(99), 5, false, after))
	require.True(t, w.stalled(at(100), 5, false, after), "counted from the pause's end")
	require.False(t, w.stalled(at(110), 6, false, after), "progress")
	require.False(t, w.stalled(at(139), 6, false, after))
	require.True(t, w.stalled(at(140), 6, false, after))
}
