package stress

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Defaults of Config, which the CLI's flags show.
const (
	DefaultStart     = 100              // records/s
	DefaultMax       = 100_000          // records/s
	DefaultStepEvery = 10 * time.Second // per step
	DefaultThreshold = 0.05             // share of a step's records
)

// Config configures Stress. Rates are in records/s.
type Config struct {
	// Start is the first step's rate; default DefaultStart (100).
	Start float64
	// Step is added to the rate at every step; default Start.
	Step float64
	// Max is the last step's rate at most; default DefaultMax (100,000).
	Max float64
	// StepEvery is how long each step lasts; default DefaultStepEvery
	// (10 s).
	StepEvery time.Duration
	// Prefix is the partition key every record shares, and its sink keys'
	// prefix (keys are Prefix/000000000001, …: sequential, so they stay in
	// one key range); default "stress-" and the start time in Unix ms.
	Prefix string
	// Target is the rate the partition is expected to sustain (e.g. 2,000
	// entities/s for an Azure Tables partition); 0: no verdict.
	Target float64
	// BatchSize is the most records per write; default
	// ingest.DefaultMaxBatch (100).
	BatchSize int
	// Concurrency is the most writes in flight; default
	// ingest.DefaultConcurrency (16).
	Concurrency int
	// Threshold is the share of a step's records that may be throttled
	// or fail for the step to hold; default DefaultThreshold (0.05: a
	// client paced in 100 ms slices puts up to one slice more than its
	// rate in some sliding second, so a partition at its limit throttles
	// a few percent).
	Threshold float64
	// Logger receives a line per step; default none.
	Logger *slog.Logger
}

// Step is one step of a stress run.
type Step struct {
	Rate      float64 `json:"rate"`      // offered, records/s
	Sent      int64   `json:"sent"`      // records written
	Accepted  int64   `json:"accepted"`  // stored (or duplicates)
	Throttled int64   `json:"throttled"` // answered 429
	Failed    int64   `json:"failed"`    // other failures
	// AcceptedPerSec is Accepted over the step's duration.
	AcceptedPerSec float64 `json:"accepted_per_s"`
	// Held: at most Threshold of the records were throttled or failed,
	// and at least 90 % of the offered rate was accepted.
	Held bool `json:"held"`
}

// Report is the outcome of a stress run.
type Report struct {
	Prefix string `json:"prefix"`
	Steps  []Step `json:"steps"`
	// Highest is the most records/s the partition accepted over a whole
	// step. Once the offered rate passes the partition's limit, the
	// partition accepts at its limit and throttles the rest, so at a
	// "throttled" stop this is its ceiling.
	Highest float64 `json:"highest_sustained_per_s"`
	// Target is the configured target (0: none).
	Target float64 `json:"target_per_s,omitempty"`
	// Verdict is "meets target", "below target" or "" without a target.
	Verdict string `json:"verdict,omitempty"`
	// StoppedBy says why the run ended: "throttled" (the first step
	// throttled above Threshold), "not keeping up" (a step the sink or
	// client could not carry without throttling: the ceiling is elsewhere),
	// "max" (every step up to Max held) or "canceled".
	StoppedBy string `json:"stopped_by"`
}

// Stress runs the partition stress test Azure Table Storage recommends
// before production: it writes to one partition key (one key range) of s
// at a rising rate — Start, then + Step every StepEvery, up to Max — paced
// evenly in 100 ms slices, and stops at the first step that does not hold
// (throttling above Threshold, or the sink not keeping up). The most
// records/s the partition accepted over a step is its real ceiling.
//
// Records are not retried: each is counted once as accepted, throttled or
// failed. It returns the report so far with ctx's cause when ctx is done,
// and an error when the configuration is invalid.
func Stress(ctx context.Context, s ingest.Sink, cfg Config) (Report, error) {
	cfg.Start = cmp.Or(cfg.Start, DefaultStart)
	cfg.Step = cmp.Or(cfg.Step, cfg.Start)
	cfg.Max = cmp.Or(cfg.Max, DefaultMax)
	cfg.StepEvery = cmp.Or(cfg.StepEvery, DefaultStepEvery)
	cfg.Prefix = cmp.Or(cfg.Prefix, "stress-"+strconv.FormatInt(time.Now().UnixMilli(), 10))
	cfg.BatchSize = cmp.Or(cfg.BatchSize, ingest.DefaultMaxBatch)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, ingest.DefaultConcurrency)
	cfg.Threshold = cmp.Or(cfg.Threshold, DefaultThreshold)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	switch {
	case !(cfg.Start > 0) || !(cfg.Step > 0) || !(cfg.Max >= cfg.Start):
		return Report{}, fmt.Errorf("stress: want start > 0, step > 0 and max ≥ start (got %v, %v, %v)", cfg.Start, cfg.Step, cfg.Max)
	case cfg.StepEvery < time.Second:
		return Report{}, fmt.Errorf("stress: step-every %v is under 1 s", cfg.StepEvery)
	case cfg.BatchSize < 1 || cfg.Concurrency < 1 || cfg.Threshold < 0 || cfg.Threshold >= 1 || cfg.Target < 0:
		return Report{}, errors.New("stress: batch size and concurrency must be ≥ 1, threshold in [0, 1), target ≥ 0")
	}
	d := &stressDriver{sink: s, cfg: cfg, inflight: make(chan struct{}, cfg.Concurrency)}
	rep := Report{Prefix: cfg.Prefix, Target: cfg.Target, StoppedBy: "max"}
	for rate := cfg.Start; rate <= cfg.Max+1e-9; rate += cfg.Step {
		step, err := d.step(ctx, rate)
		rep.Steps = append(rep.Steps, step)
		cfg.Logger.Info("stress step", "rate_per_s", rate, "accepted_per_s", step.AcceptedPerSec,
			"throttled", step.Throttled, "failed", step.Failed, "held", step.Held)
		if err != nil {
			rep.StoppedBy = "canceled"
			rep.finish()
			return rep, err
		}
		if !step.Held {
			rep.StoppedBy = "not keeping up"
			if float64(step.Throttled) > cfg.Threshold*float64(step.Sent) {
				rep.StoppedBy = "throttled"
			}
			break
		}
	}
	rep.finish()
	return rep, nil
}

func (r *Report) finish() {
	for _, st := range r.Steps {
		r.Highest = max(r.Highest, st.AcceptedPerSec)
	}
	switch {
	case r.Target == 0:
	case r.Highest >= r.Target:
		r.Verdict = "meets target"
	default:
		r.Verdict = "below target"
	}
}

// stressSlice is how often a stress step releases records.
const stressSlice = 100 * time.Millisecond

type stressDriver struct {
	sink     ingest.Sink
	cfg      Config
	seq      int64
	inflight chan struct{}
}

// step offers rate records/s for StepEvery and counts the outcomes, after
// the step's last write has returned.
func (d *stressDriver) step(ctx context.Context, rate float64) (Step, error) {
	st := Step{Rate: rate}
	var accepted, throttled, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	tick := time.NewTicker(stressSlice)
	defer tick.Stop()
	var owed float64
	for elapsed := time.Duration(0); elapsed < d.cfg.StepEvery; elapsed = time.Since(start) {
		owed += rate * stressSlice.Seconds()
		n := int64(owed)
		owed -= float64(n)
		for n > 0 {
			batch := d.records(min(n, int64(d.cfg.BatchSize)))
			n -= int64(len(batch))
			st.Sent += int64(len(batch))
			select {
			case d.inflight <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return st, context.Cause(ctx)
			}
			wg.Go(func() {
				defer func() { <-d.inflight }()
				results, err := d.sink.Write(ctx, batch)
				if err != nil {
					failed.Add(int64(len(batch)))
					return
				}
				for _, r := range results {
					switch {
					case r.Outcome == ingest.Delivered || r.Outcome == ingest.Duplicate:
						accepted.Add(1)
					case r.Throttled:
						throttled.Add(1)
					default:
						failed.Add(1)
					}
				}
			})
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			wg.Wait()
			return st, context.Cause(ctx)
		}
	}
	wg.Wait()
	st.Accepted, st.Throttled, st.Failed = accepted.Load(), throttled.Load(), failed.Load()
	st.AcceptedPerSec = float64(st.Accepted) / time.Since(start).Seconds()
	bad := float64(st.Throttled + st.Failed)
	st.Held = st.Sent > 0 && bad <= d.cfg.Threshold*float64(st.Sent) && st.AcceptedPerSec >= 0.9*rate
	return st, nil
}

// records returns n new records on the stress partition.
func (d *stressDriver) records(n int64) []ingest.Record {
	out := make([]ingest.Record, n)
	for i := range out {
		d.seq++
		key := fmt.Sprintf("%s/%012d", d.cfg.Prefix, d.seq)
		out[i] = ingest.Record{
			ID: key, SinkKey: key, PartitionKey: d.cfg.Prefix, Cost: 1,
			Value: fmt.Appendf(nil, `{"id":%q,"stress":true,"seq":%d}`, key, d.seq),
		}
	}
	return out
}
