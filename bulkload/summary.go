package bulkload

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// The outcomes of a load, as Summary.Outcome says them.
const (
	OutcomeFinished    = "finished"      // every record done
	OutcomeNothingToDo = "nothing to do" // an earlier run finished the same load
	OutcomeInterrupted = "interrupted"   // a signal stopped the load; a rerun resumes
	OutcomeStopped     = "stopped"       // the load stopped itself (too many dead letters, the sink unavailable)
	OutcomeFailed      = "failed"        // a service failed
)

// Summary is the outcome of a bulk load, as written by --summary-json.
// Counts are records unless named otherwise; units are the pool's unit.
// For a load this run did whole, RecordsDelivered + DuplicatesAtSink +
// RecordsDeadLettered = RecordsTotal: a row whose ID an earlier row had
// reaches the sink as a redelivery and counts among DuplicatesAtSink, and
// DuplicateIDs says how many of those the input itself repeated.
type Summary struct {
	// Outcome says how the load ended (Outcome* constants), ExitCode the
	// command's exit code and Message why it stopped, when it did; the
	// command fills them in.
	Outcome  string `json:"outcome,omitempty"`
	ExitCode int    `json:"exit_code"`
	Message  string `json:"message,omitempty"`
	// FinishedAt is, with OutcomeNothingToDo, when the earlier run
	// finished the load.
	FinishedAt time.Time `json:"finished_at,omitzero"`

	LoadID              string   `json:"load_id,omitempty"`      // the load's identity (topic and input content)
	Pool                string   `json:"pool,omitempty"`         // the capacity pool
	Workers             int      `json:"workers"`                // in-process workers; 0: worker pods drained the topic, and the send side was not measured here
	RecordsTotal        int64    `json:"records_total"`          // rows or lines read from the inputs
	RecordsProduced     int64    `json:"records_produced"`       // records this run produced (acknowledged by the broker)
	RecordsSkipped      int64    `json:"records_skipped"`        // rows an earlier run of the same load produced
	RecordsDelivered    int64    `json:"records_delivered"`      // stored by the sink for the first time (by this process's workers; without workers, offsets the group committed)
	DuplicatesAtSink    int64    `json:"duplicates_at_sink"`     // records the sink already had (redeliveries)
	RecordsDeadLettered int64    `json:"records_dead_lettered"`  // rows refused before producing and records refused by the sink or the record type
	DuplicateIDs        int64    `json:"duplicate_ids_in_input"` // rows whose ID an earlier row had: the sink stores one record per ID
	DuplicateIDExamples []string `json:"duplicate_id_examples,omitempty"`
	// DuplicatesUnknown is true when the sink cannot say that it had a
	// record already (a REST API without --sink-duplicate-on): such a
	// record counts as delivered.
	DuplicatesUnknown bool `json:"duplicates_unknown,omitempty"`
	// Files counts per input, in the order read.
	Files           []FileCounts `json:"files,omitempty"`
	ProduceS        float64      `json:"produce_s"`          // first row read to the last acknowledgement by the broker, seconds
	ProduceRowsPerS float64      `json:"produce_rows_per_s"` // records_total / produce_s
	// DrainStartS is when the workers fetched their first record, and
	// LoadS when the last record was done (produced and delivered or
	// dead-lettered; without in-process workers, when the group had
	// committed the last offset), both in seconds from the first row
	// read: the workers drain while the rest is produced, so LoadS is
	// about the longer of producing and draining, plus a slice.
	DrainStartS        float64 `json:"drain_start_s"`
	LoadS              float64 `json:"load_s"`
	SinkRequests       int64   `json:"sink_requests"`        // write requests sent
	SinkRecordAttempts int64   `json:"sink_record_attempts"` // records sent, retries included
	SinkThrottled      int64   `json:"sink_throttled"`       // record attempts answered "throttled" (429)
	SinkFailedWrites   int64   `json:"sink_failed_writes"`   // requests that failed as a whole (the sink was paused)
	Unit               string  `json:"unit"`                 // records, bytes or cost
	CapacityUnitsPerS  float64 `json:"capacity_units_per_s"` // the pool's capacity
	CostTotal          int64   `json:"cost_total"`           // units of the delivered records
	// UnitsSent is the units the pacers charged: every attempt at its
	// cost, re-sent records and records the sink already had included.
	UnitsSent int64   `json:"units_sent"`
	ElapsedS  float64 `json:"elapsed_s"` // first send to last acknowledgement (without workers: the whole load), seconds
	// HeadS and TailS are a load's edges, outside ElapsedS: from the first
	// record fetched to the first send (leases, the first slice), and from
	// the last send to the last acknowledgement (the last answers).
	HeadS float64 `json:"head_s"`
	TailS float64 `json:"tail_s"`
	WallS float64 `json:"wall_s"` // the whole load, from its start to the summary, seconds
	// IdealS is UnitsSent / capacity (without in-process workers,
	// CostTotal / capacity): the least time the sink needed for what it
	// was sent. Utilization is IdealS / ElapsedS.
	IdealS      float64 `json:"ideal_s"`
	Utilization float64 `json:"utilization"`
	// SuggestedCapacity is, when the sink throttled persistently, the
	// rate in units/s it accepted: the --capacity it can take.
	SuggestedCapacity float64 `json:"suggested_capacity_units_per_s,omitempty"`
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
	// SinkStats is the sink's own report of this run, when it keeps one:
	// its counts since the load began (a delta, so an emulator shared
	// with earlier runs reports this run alone), and its peaks as
	// SinkStatsScope says.
	SinkStats      *ingest.SinkStats `json:"sink_stats,omitempty"`
	SinkStatsScope string            `json:"sink_stats_scope,omitempty"`
}

// Scopes of the sink's peaks (Summary.SinkStatsScope).
const (
	// ScopeRun: the sink had seen nothing before the load, so its peaks
	// are the load's.
	ScopeRun = "this run"
	// ScopeRunSeries: the sink had served others before; its peaks are
	// computed from its 200 ms series over the load's time (1 s windows
	// aligned to 200 ms, so at most one bucket short of the sliding peak).
	ScopeRunSeries = "this run, from the sink's 200 ms series"
	// ScopeCountsOnly: the sink had served others before and has no
	// series; its counts are this run's, its peaks are not shown.
	ScopeCountsOnly = "this run's counts; the sink's peaks span earlier traffic and are not shown"
)

// SeriesSink is a sink that reports what it charged in consecutive
// 200 ms buckets since start (the emulator's /v1/stats?series=1).
type SeriesSink interface {
	Series(ctx context.Context) (start time.Time, per200ms []int64, err error)
}

// summary completes s from the counters and the sink.
func (l *Load) summary(ctx context.Context, s Summary, p Produced, start map[int]int64, began, doneAt time.Time) Summary {
	t := l.p.Counters.Totals()
	s.Pool, s.Workers, s.DuplicatesUnknown = l.cfg.Pool, len(l.p.Workers), l.cfg.DuplicatesUnknown
	s.RecordsTotal, s.RecordsProduced, s.RecordsSkipped = p.Read, p.Produced, p.Skipped
	s.DuplicateIDs, s.DuplicateIDExamples = p.DuplicateIDs, p.DuplicateIDExamples
	s.Files, s.ProduceS = p.Files, p.Elapsed.Seconds()
	if !p.Started.IsZero() {
		end := p.Started.Add(p.Elapsed)
		if t.LastDone.After(end) {
			end = t.LastDone
		}
		if s.Workers == 0 && !doneAt.IsZero() {
			end = doneAt // the pods' last record, as the group committed it
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
	s.Unit, s.CapacityUnitsPerS, s.CostTotal, s.UnitsSent = string(l.cfg.Unit), l.cfg.Capacity, t.UnitsDelivered, t.UnitsSent
	if l.cfg.CapacityNow != nil {
		s.CapacityUnitsPerS = l.cfg.CapacityNow()
	}
	s.ElapsedS = t.Elapsed().Seconds()
	if !t.FirstSent.IsZero() && t.LastDone.After(t.FirstSent) {
		s.ElapsedS = t.LastDone.Sub(t.FirstSent).Seconds()
		s.HeadS = max(t.FirstSent.Sub(t.FirstFetch), 0).Seconds()
		s.TailS = max(t.LastDone.Sub(t.LastSent), 0).Seconds()
	}
	s.SendMaxUnits1s = t.MaxSent1s
	s.LatencyP99MS, s.LatencyMaxMS = ms(t.LatencyP99), ms(t.LatencyMax)
	s.GuardMinMS, s.GuardFinalMS = ms(t.GuardMin), ms(t.GuardFinal)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s.IdealS = float64(s.UnitsSent) / s.CapacityUnitsPerS
	if s.Workers == 0 {
		// The pods' work, as the group committed it; the send side is
		// theirs.
		if committed, err := l.p.Offsets.CommittedOffsets(sctx, l.cfg.Group, l.cfg.Topic); err == nil {
			s.RecordsDelivered = advanced(committed, start)
		}
		s.ElapsedS = time.Since(began).Seconds()
		if !doneAt.IsZero() {
			s.ElapsedS = doneAt.Sub(began).Seconds()
		}
		s.CostTotal = int64(float64(s.RecordsDelivered) * t.UnitsPerRecord())
		s.IdealS = float64(s.CostTotal) / s.CapacityUnitsPerS
	}
	if s.ElapsedS > 0 {
		s.Utilization = s.IdealS / s.ElapsedS
	}
	s.SuggestedCapacity = suggestCapacity(s, t)
	l.sinkStats(sctx, &s, began)
	return s
}

// suggestCapacity is the rate the sink accepted when it throttled
// persistently (at least 5 % of the attempts, over a run of at least 2
// s), rounded down to two significant digits; 0 otherwise.
func suggestCapacity(s Summary, t ingest.Totals) float64 {
	if s.Workers == 0 || s.ElapsedS < 2 || s.SinkRecordAttempts == 0 || float64(s.SinkThrottled) < 0.05*float64(s.SinkRecordAttempts) {
		return 0
	}
	accepted := float64(t.UnitsDelivered) + float64(t.Duplicates)*t.UnitsPerRecord()
	rate := accepted / s.ElapsedS
	if rate <= 0 || rate >= s.CapacityUnitsPerS {
		return 0
	}
	scale := math.Pow(10, math.Floor(math.Log10(rate))-1)
	return math.Floor(rate/scale) * scale
}

// sinkStats fills in the sink's own report of this run: its counts
// since the load began and its peaks as Summary.SinkStatsScope says.
func (l *Load) sinkStats(ctx context.Context, s *Summary, began time.Time) {
	if l.p.Sink == nil {
		return
	}
	st, err := l.p.Sink.Stats(ctx)
	if err != nil {
		l.cfg.Logger.Warn("reading sink statistics failed", "err", err)
		return
	}
	before := l.sinkBefore
	if before == nil {
		s.SinkStats, s.SinkStatsScope = &st, ScopeCountsOnly
		s.MaxUnits1sWindow, s.MaxUnits200msWindow = 0, 0
		return
	}
	run := st
	run.Requests -= before.Requests
	run.Records -= before.Records
	run.Accepted -= before.Accepted
	run.Duplicates -= before.Duplicates
	run.Throttled -= before.Throttled
	run.Rejected -= before.Rejected
	run.Failed -= before.Failed
	run.UnitsAccepted -= before.UnitsAccepted
	s.SinkStats = &run
	switch {
	case before.Records == 0 && before.Requests == 0:
		s.SinkStatsScope = ScopeRun
	default:
		run.MaxUnits1s, run.MaxUnits200ms = 0, 0
		s.SinkStatsScope = ScopeCountsOnly
		if series, ok := l.p.Sink.(SeriesSink); ok {
			if from, buckets, err := series.Series(ctx); err == nil {
				run.MaxUnits1s, run.MaxUnits200ms = seriesPeaks(from, buckets, began)
				s.SinkStatsScope = ScopeRunSeries
			}
		}
	}
	s.MaxUnits1sWindow, s.MaxUnits200msWindow = run.MaxUnits1s, run.MaxUnits200ms
}

// seriesPeaks returns the most units in any 5 consecutive 200 ms buckets
// (1 s) and in any one bucket, of the buckets from the one holding since
// on.
func seriesPeaks(start time.Time, buckets []int64, since time.Time) (max1s, max200ms int64) {
	first := 0
	if since.After(start) {
		first = min(int(since.Sub(start)/(200*time.Millisecond)), len(buckets))
	}
	var window int64
	for i := first; i < len(buckets); i++ {
		window += buckets[i]
		if i-first >= 5 {
			window -= buckets[i-5]
		}
		max1s, max200ms = max(max1s, window), max(max200ms, buckets[i])
	}
	return max1s, max200ms
}

func ms(d time.Duration) float64 { return math.Round(d.Seconds()*1e4) / 10 }

// WriteText prints the summary for a person.
func (s Summary) WriteText(w io.Writer) {
	if s.Outcome != "" {
		line := s.Outcome
		if s.Message != "" {
			line += ": " + s.Message
		}
		fmt.Fprintf(w, "outcome      %s (exit %d)\n", line, s.ExitCode)
	}
	if s.Outcome == OutcomeNothingToDo {
		return
	}
	if s.DuplicatesUnknown {
		fmt.Fprintf(w, "records      %d read, %d written (the API does not report duplicates: a record it had already counts as written), %d dead-lettered\n",
			s.RecordsTotal, s.RecordsDelivered+s.DuplicatesAtSink, s.RecordsDeadLettered)
	} else {
		fmt.Fprintf(w, "records      %d read, %d delivered, %d already at the sink, %d dead-lettered\n",
			s.RecordsTotal, s.RecordsDelivered, s.DuplicatesAtSink, s.RecordsDeadLettered)
	}
	if s.RecordsSkipped > 0 {
		fmt.Fprintf(w, "resumed      %d rows produced by an earlier run of this load, %d produced now\n", s.RecordsSkipped, s.RecordsProduced)
	}
	fmt.Fprintf(w, "produced     %d records in %.2f s (%.0f rows/s read and produced)", s.RecordsProduced, s.ProduceS, s.ProduceRowsPerS)
	switch {
	case s.Workers == 0 && s.committedAll():
		fmt.Fprintf(w, ", the group committed the last record at %.2f s\n", s.LoadS)
	case s.Workers == 0:
		fmt.Fprintf(w, "; the group committed %d records\n", s.RecordsDelivered)
	case s.SinkRecordAttempts == 0:
		fmt.Fprintf(w, "; nothing was sent to the sink\n")
	default:
		fmt.Fprintf(w, "; draining began %.2f s after the first row, the last record was done at %.2f s\n", s.DrainStartS, s.LoadS)
	}
	if len(s.Files) > 1 {
		for _, f := range s.Files {
			fmt.Fprintf(w, "  %s: %d rows, %d produced, %d skipped, %d dead-lettered\n", f.Name, f.Rows, f.Produced, f.Skipped, f.DeadLettered)
		}
	}
	if s.DuplicateIDs > 0 {
		fmt.Fprintf(w, "input        %d rows repeat an earlier row's ID (e.g. %v): the sink keeps one record per ID\n", s.DuplicateIDs, s.DuplicateIDExamples)
	}
	switch {
	case s.Workers == 0:
		fmt.Fprintf(w, "sink         not measured here: worker pods of the consumer group sent the records (--workers 0)\n")
		if s.committedAll() {
			fmt.Fprintf(w, "time         %.2f s from the start to the group's last commit; %.2f s ideal for %d %s at %.0f %s/s\n",
				s.ElapsedS, s.IdealS, s.CostTotal, s.Unit, s.CapacityUnitsPerS, s.Unit)
		}
	case s.SinkRecordAttempts == 0 && s.UnitsSent == 0:
		fmt.Fprintf(w, "sink         nothing sent\n")
	default:
		fmt.Fprintf(w, "sink         %d requests (%d failed as a whole), %d record attempts, %d throttled\n",
			s.SinkRequests, s.SinkFailedWrites, s.SinkRecordAttempts, s.SinkThrottled)
		fmt.Fprintf(w, "time         %.2f s from the first send to the last answer, %.2f s ideal (%d %s sent at %.0f %s/s, re-sends and records the sink had included): utilization %.3f\n",
			s.ElapsedS, s.IdealS, s.UnitsSent, s.Unit, s.CapacityUnitsPerS, s.Unit, s.Utilization)
		fmt.Fprintf(w, "edges        %.3f s from the first record fetched to the first send, %.3f s from the last send to the last answer\n", s.HeadS, s.TailS)
		fmt.Fprintf(w, "sent         at most %d %s in a 1 s window (%.3f of capacity); answers within %.1f ms (p99), %.1f ms (max)\n",
			s.SendMaxUnits1s, s.Unit, float64(s.SendMaxUnits1s)/s.CapacityUnitsPerS, s.LatencyP99MS, s.LatencyMaxMS)
		fmt.Fprintf(w, "guard        each send counted until 1 s after its answer; slices planned for %.1f ms at the end (%.1f ms at least)\n",
			s.GuardFinalMS, s.GuardMinMS)
	}
	if s.SuggestedCapacity > 0 {
		pool := s.Pool
		if pool == "" {
			pool = "NAME"
		}
		fmt.Fprintf(w, "throttled    the sink throttled %d of %d attempts and accepted about %s %s/s of the %.0f the pool gives:\n"+
			"             if that is what the service is provisioned for, run with --capacity %s (a pool in use:\n"+
			"             sluice pool set --pool %s --capacity %s); a --capacity over the service's buys throttles, not speed\n",
			s.SinkThrottled, s.SinkRecordAttempts, num(s.SuggestedCapacity), s.Unit, s.CapacityUnitsPerS,
			num(s.SuggestedCapacity), pool, num(s.SuggestedCapacity))
	}
	if s.SinkStats != nil && s.SinkStatsScope != ScopeCountsOnly {
		fmt.Fprintf(w, "peak at sink %d %s in a 1 s window (%.3f of capacity), %d in a 200 ms window (%s)\n",
			s.MaxUnits1sWindow, s.Unit, float64(s.MaxUnits1sWindow)/s.CapacityUnitsPerS, s.MaxUnits200msWindow, s.SinkStatsScope)
		if s.Workers > 0 && float64(s.MaxUnits1sWindow) > 1.01*s.CapacityUnitsPerS {
			fmt.Fprintf(w, "             over capacity at the sink although at most %d were sent in any second (%.3f of capacity).\n"+
				"             Each send was counted until 1 s after its answer (answers within %.1f ms), so this process's\n"+
				"             requests cannot fill a sink-side second beyond what was sent: another client of the sink, a sink\n"+
				"             that counts a request after answering it, or a fault of the pool (Redis data lost, a paused\n"+
				"             process) made up the rest.\n",
				s.SendMaxUnits1s, float64(s.SendMaxUnits1s)/s.CapacityUnitsPerS, s.LatencyMaxMS)
		}
	} else if s.SinkStats != nil {
		fmt.Fprintf(w, "at sink      %d accepted, %d already there, %d throttled (%s)\n",
			s.SinkStats.Accepted, s.SinkStats.Duplicates, s.SinkStats.Throttled, s.SinkStatsScope)
	}
}

// committedAll reports whether, without in-process workers, the group
// committed every record produced.
func (s Summary) committedAll() bool {
	return s.Outcome == OutcomeFinished || (s.Outcome == "" && s.RecordsDelivered >= s.RecordsProduced)
}

// num formats a rate without needless decimals.
func num(v float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}
