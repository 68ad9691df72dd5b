package bulkload

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/sluicehq/sluice/ingest"
)

// Summary is the outcome of a bulk load, as written by --summary-json.
// Counts are records unless named otherwise; units are the pool's unit.
type Summary struct {
	RecordsTotal        int64   `json:"records_total"`         // rows or lines read from the file
	RecordsDelivered    int64   `json:"records_delivered"`     // stored by the sink (by this process's workers)
	RecordsDeadLettered int64   `json:"records_dead_lettered"` // malformed rows and records the sink refused
	DuplicatesAtSink    int64   `json:"duplicates_at_sink"`    // record attempts the sink had already stored
	SinkRequests        int64   `json:"sink_requests"`         // write requests sent
	SinkRecordAttempts  int64   `json:"sink_record_attempts"`  // records sent, retries included
	SinkThrottled       int64   `json:"sink_throttled"`        // record attempts answered "throttled" (429)
	Unit                string  `json:"unit"`                  // records, bytes or cost
	CapacityUnitsPerS   float64 `json:"capacity_units_per_s"`  // the pool's capacity
	CostTotal           int64   `json:"cost_total"`            // units of the delivered records
	ElapsedS            float64 `json:"elapsed_s"`             // first fetch to last acknowledgement, seconds
	IdealS              float64 `json:"ideal_s"`               // cost_total / capacity, seconds
	Utilization         float64 `json:"utilization"`           // ideal_s / elapsed_s
	MaxUnits1sWindow    int64   `json:"max_units_1s_window"`   // most units the sink accepted in any sliding 1 s
	MaxUnits200msWindow int64   `json:"max_units_200ms_window"`
	// SinkStats is the sink's own report, when it keeps one.
	SinkStats *ingest.SinkStats `json:"sink_stats,omitempty"`
}

// WriteText prints the summary for a person.
func (s Summary) WriteText(w io.Writer) {
	fmt.Fprintf(w, "records      %d read, %d delivered, %d dead-lettered\n", s.RecordsTotal, s.RecordsDelivered, s.RecordsDeadLettered)
	fmt.Fprintf(w, "sink         %d requests, %d record attempts, %d throttled, %d duplicates\n", s.SinkRequests, s.SinkRecordAttempts, s.SinkThrottled, s.DuplicatesAtSink)
	fmt.Fprintf(w, "time         %.2f s elapsed, %.2f s ideal (%d %s at %.0f %s/s): utilization %.3f\n",
		s.ElapsedS, s.IdealS, s.CostTotal, s.Unit, s.CapacityUnitsPerS, s.Unit, s.Utilization)
	if s.SinkStats != nil {
		fmt.Fprintf(w, "peak at sink %d %s in a 1 s window (%.3f of capacity), %d in a 200 ms window\n",
			s.MaxUnits1sWindow, s.Unit, float64(s.MaxUnits1sWindow)/s.CapacityUnitsPerS, s.MaxUnits200msWindow)
	}
}

// progress reports a bulk load's advance: a bar on a terminal, log lines
// every few seconds otherwise, both with an ETA from the leased rate.
type progress struct {
	cfg     Config
	total   int64
	bar     *progressbar.ProgressBar
	lastLog time.Time
}

func newProgress(cfg Config, total int64) *progress {
	p := &progress{cfg: cfg, total: total}
	if cfg.Bar != nil {
		p.bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(cfg.Bar),
			progressbar.OptionSetDescription("loading"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("rec"),
			progressbar.OptionShowIts(),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	return p
}

// update shows t; rate is the leased rate in units/s now.
func (p *progress) update(t ingest.Totals, rate float64) {
	done := t.Finished()
	eta := p.eta(t, rate)
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("loading (%.0f %s/s leased, ETA %s)", rate, p.cfg.Unit, eta))
		_ = p.bar.Set64(done)
		return
	}
	if time.Since(p.lastLog) >= 2*time.Second {
		p.lastLog = time.Now()
		p.cfg.Logger.Info("progress", "done", done, "total", p.total,
			"delivered", t.Delivered, "dead_lettered", t.DeadLettered, "throttled", t.Throttled,
			"leased_units_per_s", math.Round(rate), "eta", eta.String())
	}
}

// eta is the time left at the leased rate (or the pool's capacity while
// nothing is leased yet), assuming the remaining records cost as much on
// average as the finished ones.
func (p *progress) eta(t ingest.Totals, rate float64) time.Duration {
	left := p.total - t.Finished()
	if left <= 0 {
		return 0
	}
	perRecord := 1.0
	if t.Delivered > 0 {
		perRecord = float64(t.UnitsDelivered) / float64(t.Delivered)
	}
	if rate <= 0 {
		rate = p.cfg.Capacity
	}
	return time.Duration(float64(left) * perRecord / rate * float64(time.Second)).Round(100 * time.Millisecond)
}

func (p *progress) close() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
