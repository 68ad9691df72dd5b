package bulkload

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/sluicehq/sluice/ingest"
)

// Summary is the outcome of a bulk load, as written by --summary-json.
// Counts are records unless named otherwise; units are the pool's unit.
// For a load this run did whole, RecordsDelivered + DuplicatesAtSink +
// RecordsDeadLettered = RecordsTotal: a row whose ID an earlier row had
// reaches the sink as a redelivery and counts among DuplicatesAtSink, and
// DuplicateIDs says how many of those the input itself repeated.
type Summary struct {
	LoadID              string   `json:"load_id,omitempty"`      // the load's identity (topic and input content)
	RecordsTotal        int64    `json:"records_total"`          // rows or lines read from the inputs
	RecordsProduced     int64    `json:"records_produced"`       // records this run produced (acknowledged by the broker)
	RecordsSkipped      int64    `json:"records_skipped"`        // rows an earlier run of the same load produced
	RecordsDelivered    int64    `json:"records_delivered"`      // stored by the sink for the first time (by this process's workers; without workers, offsets the group committed)
	DuplicatesAtSink    int64    `json:"duplicates_at_sink"`     // records the sink already had (redeliveries)
	RecordsDeadLettered int64    `json:"records_dead_lettered"`  // rows refused before producing and records refused by the sink or the record type
	DuplicateIDs        int64    `json:"duplicate_ids_in_input"` // rows whose ID an earlier row had: the sink stores one record per ID
	DuplicateIDExamples []string `json:"duplicate_id_examples,omitempty"`
	// Files counts per input, in the order read.
	Files           []FileCounts `json:"files,omitempty"`
	ProduceS        float64      `json:"produce_s"`          // first row read to the last acknowledgement by the broker, seconds
	ProduceRowsPerS float64      `json:"produce_rows_per_s"` // records_total / produce_s
	// DrainStartS is when the workers fetched their first record, and
	// LoadS when the last record was done (produced and delivered or
	// dead-lettered), both in seconds from the first row read: the
	// workers drain while the rest is produced, so LoadS is about the
	// longer of producing and draining, plus a slice.
	DrainStartS        float64 `json:"drain_start_s"`
	LoadS              float64 `json:"load_s"`
	SinkRequests       int64   `json:"sink_requests"`        // write requests sent
	SinkRecordAttempts int64   `json:"sink_record_attempts"` // records sent, retries included
	SinkThrottled      int64   `json:"sink_throttled"`       // record attempts answered "throttled" (429)
	SinkFailedWrites   int64   `json:"sink_failed_writes"`   // requests that failed as a whole (the sink was paused)
	Unit               string  `json:"unit"`                 // records, bytes or cost
	CapacityUnitsPerS  float64 `json:"capacity_units_per_s"` // the pool's capacity
	CostTotal          int64   `json:"cost_total"`           // units of the delivered records
	ElapsedS           float64 `json:"elapsed_s"`            // first fetch to last acknowledgement, seconds
	WallS              float64 `json:"wall_s"`               // the whole load, from its start to the summary, seconds
	IdealS             float64 `json:"ideal_s"`              // cost_total / capacity, seconds
	Utilization        float64 `json:"utilization"`          // ideal_s / elapsed_s
	// The rate promise from both sides: the most units sent in any
	// sliding second at send time (the pacers of this process), and the
	// most the sink accepted (all its clients, when it reports it); the
	// send→answer latency bounds the gap between the two.
	SendMaxUnits1s      int64   `json:"send_max_units_1s"`
	MaxUnits1sWindow    int64   `json:"max_units_1s_window"`
	MaxUnits200msWindow int64   `json:"max_units_200ms_window"`
	LatencyP99MS        float64 `json:"send_latency_p99_ms"`
	LatencyMaxMS        float64 `json:"send_latency_max_ms"`
	// The guard in effect: the send-to-accept allowance the pacers planned
	// their slices with (the 90th percentile of the last second's
	// send→answer latencies, at least --send-guard), least and at the end.
	GuardMinMS   float64 `json:"send_guard_min_ms"`
	GuardFinalMS float64 `json:"send_guard_final_ms"`
	// SinkStats is the sink's own report, when it keeps one.
	SinkStats *ingest.SinkStats `json:"sink_stats,omitempty"`
}

// summary completes s from the counters and the sink.
func (l *Load) summary(ctx context.Context, s Summary, p Produced, start map[int]int64, began time.Time) Summary {
	t := l.p.Counters.Totals()
	s.RecordsTotal, s.RecordsProduced, s.RecordsSkipped = p.Read, p.Produced, p.Skipped
	s.DuplicateIDs, s.DuplicateIDExamples = p.DuplicateIDs, p.DuplicateIDExamples
	s.Files, s.ProduceS = p.Files, p.Elapsed.Seconds()
	if !p.Started.IsZero() {
		end := p.Started.Add(p.Elapsed)
		if t.LastDone.After(end) {
			end = t.LastDone
		}
		s.LoadS = end.Sub(p.Started).Seconds()
		if !t.FirstFetch.IsZero() {
			s.DrainStartS = t.FirstFetch.Sub(p.Started).Seconds()
		}
	}
	if s.ProduceS > 0 {
		s.ProduceRowsPerS = math.Round(float64(p.Read) / s.ProduceS)
	}
	s.RecordsDelivered, s.DuplicatesAtSink = t.Delivered, t.Duplicates
	s.RecordsDeadLettered = t.DeadLettered + p.DeadLettered
	s.SinkRequests, s.SinkRecordAttempts, s.SinkThrottled, s.SinkFailedWrites = t.Requests, t.Attempts, t.Throttled, t.FailedWrites
	s.Unit, s.CapacityUnitsPerS, s.CostTotal = string(l.cfg.Unit), l.cfg.Capacity, t.UnitsDelivered
	if l.cfg.CapacityNow != nil {
		s.CapacityUnitsPerS = l.cfg.CapacityNow()
	}
	s.ElapsedS = t.Elapsed().Seconds()
	s.SendMaxUnits1s = t.MaxSent1s
	s.LatencyP99MS, s.LatencyMaxMS = ms(t.LatencyP99), ms(t.LatencyMax)
	s.GuardMinMS, s.GuardFinalMS = ms(t.GuardMin), ms(t.GuardFinal)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if len(l.p.Workers) == 0 {
		// The pods' work, as the group committed it.
		if committed, err := l.p.Offsets.CommittedOffsets(sctx, l.cfg.Group, l.cfg.Topic); err == nil {
			s.RecordsDelivered = advanced(committed, start)
		}
		s.ElapsedS = time.Since(began).Seconds()
		s.CostTotal = int64(float64(s.RecordsDelivered) * t.UnitsPerRecord())
	}
	if l.p.Sink != nil {
		if st, err := l.p.Sink.Stats(sctx); err != nil {
			l.cfg.Logger.Warn("reading sink statistics failed", "err", err)
		} else {
			s.MaxUnits1sWindow = st.MaxUnits1s
			s.MaxUnits200msWindow = st.MaxUnits200ms
			s.SinkStats = &st
		}
	}
	s.IdealS = float64(s.CostTotal) / s.CapacityUnitsPerS
	if s.ElapsedS > 0 {
		s.Utilization = s.IdealS / s.ElapsedS
	}
	return s
}

func ms(d time.Duration) float64 { return math.Round(d.Seconds()*1e4) / 10 }

// WriteText prints the summary for a person.
func (s Summary) WriteText(w io.Writer) {
	fmt.Fprintf(w, "records      %d read, %d delivered, %d already at the sink, %d dead-lettered\n",
		s.RecordsTotal, s.RecordsDelivered, s.DuplicatesAtSink, s.RecordsDeadLettered)
	if s.RecordsSkipped > 0 {
		fmt.Fprintf(w, "resumed      %d rows produced by an earlier run of this load, %d produced now\n", s.RecordsSkipped, s.RecordsProduced)
	}
	fmt.Fprintf(w, "produced     %d records in %.2f s (%.0f rows/s read and produced); draining began %.2f s after the first row, the last record was done at %.2f s\n",
		s.RecordsProduced, s.ProduceS, s.ProduceRowsPerS, s.DrainStartS, s.LoadS)
	if len(s.Files) > 1 {
		for _, f := range s.Files {
			fmt.Fprintf(w, "  %s: %d rows, %d produced, %d skipped, %d dead-lettered\n", f.Name, f.Rows, f.Produced, f.Skipped, f.DeadLettered)
		}
	}
	if s.DuplicateIDs > 0 {
		fmt.Fprintf(w, "input        %d rows repeat an earlier row's ID (e.g. %v): the sink keeps one record per ID\n", s.DuplicateIDs, s.DuplicateIDExamples)
	}
	fmt.Fprintf(w, "sink         %d requests (%d failed as a whole), %d record attempts, %d throttled\n",
		s.SinkRequests, s.SinkFailedWrites, s.SinkRecordAttempts, s.SinkThrottled)
	fmt.Fprintf(w, "time         %.2f s elapsed, %.2f s ideal (%d %s at %.0f %s/s): utilization %.3f\n",
		s.ElapsedS, s.IdealS, s.CostTotal, s.Unit, s.CapacityUnitsPerS, s.Unit, s.Utilization)
	fmt.Fprintf(w, "sent         at most %d %s in a 1 s window (%.3f of capacity); answers within %.1f ms (p99), %.1f ms (max)\n",
		s.SendMaxUnits1s, s.Unit, float64(s.SendMaxUnits1s)/s.CapacityUnitsPerS, s.LatencyP99MS, s.LatencyMaxMS)
	fmt.Fprintf(w, "guard        each send counted until 1 s after its answer; slices planned for %.1f ms at the end (%.1f ms at least)\n",
		s.GuardFinalMS, s.GuardMinMS)
	if s.SinkStats != nil {
		fmt.Fprintf(w, "peak at sink %d %s in a 1 s window (%.3f of capacity), %d in a 200 ms window\n",
			s.MaxUnits1sWindow, s.Unit, float64(s.MaxUnits1sWindow)/s.CapacityUnitsPerS, s.MaxUnits200msWindow)
		if float64(s.MaxUnits1sWindow) > 1.01*s.CapacityUnitsPerS {
			fmt.Fprintf(w, "             over capacity at the sink although at most %d were sent in any second (%.3f of capacity).\n"+
				"             Each send was counted until 1 s after its answer (answers within %.1f ms), so this process's\n"+
				"             requests cannot fill a sink-side second beyond what was sent: another client of the sink, a sink\n"+
				"             that counts a request after answering it, or a fault of the pool (Redis data lost, a paused\n"+
				"             process) made up the rest.\n",
				s.SendMaxUnits1s, float64(s.SendMaxUnits1s)/s.CapacityUnitsPerS, s.LatencyMaxMS)
		}
	}
}

// progress reports a bulk load's advance: a bar on a terminal, log lines
// every few seconds otherwise, both with an ETA from the leased rate.
type progress struct {
	cfg     Config
	pods    bool // no in-process workers: delivered comes from committed offsets
	bar     *progressbar.ProgressBar
	lastLog time.Time
}

func newProgress(cfg Config, pods bool) *progress {
	p := &progress{cfg: cfg, pods: pods}
	if cfg.Bar != nil {
		p.bar = progressbar.NewOptions64(-1,
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

// update shows t and what was produced; rate is the leased rate in units/s
// now.
func (p *progress) update(t ingest.Totals, prod Produced, rate float64) {
	done := t.Finished() + prod.DeadLettered
	if p.pods {
		done = t.Delivered
	}
	total := prod.Read
	eta := p.eta(t, total-done-prod.Skipped, rate)
	if p.bar != nil {
		p.bar.ChangeMax64(max(total-prod.Skipped, 1))
		p.bar.Describe(fmt.Sprintf("loading (%d read, %d produced, %d delivered; %.0f %s/s leased, ETA %s)", prod.Read, prod.Produced, t.Delivered, rate, p.cfg.Unit, eta))
		_ = p.bar.Set64(done)
		return
	}
	if time.Since(p.lastLog) >= 2*time.Second {
		p.lastLog = time.Now()
		p.cfg.Logger.Info("progress", "read", total, "produced", prod.Produced, "done", done,
			"delivered", t.Delivered, "duplicates", t.Duplicates, "dead_lettered", t.DeadLettered+prod.DeadLettered,
			"throttled", t.Throttled, "leased_units_per_s", math.Round(rate), "eta", eta.String())
	}
}

// eta is the time left for left records at the leased rate (or the pool's
// capacity while nothing is leased yet), assuming they cost as much on
// average as the delivered ones.
func (p *progress) eta(t ingest.Totals, left int64, rate float64) time.Duration {
	if left <= 0 {
		return 0
	}
	if rate <= 0 {
		rate = p.cfg.Capacity
	}
	return time.Duration(float64(left) * t.UnitsPerRecord() / rate * float64(time.Second)).Round(100 * time.Millisecond)
}

func (p *progress) close() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
