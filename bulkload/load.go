// Package bulkload loads files through Kafka into a sink: it streams CSV
// and NDJSON inputs — files, globs, directories, standard input, plain,
// gzip or zstd — counting lines as it goes (input.go, file.go), turns CSV
// rows into JSON records typed by a record type's schema or --csv-types
// (csvjson.go), orders them for range-partitioned stores (order.go),
// produces their records with many chunks on their way at once
// (produce.go), drains the topic with worker stacks of the topic's
// consumer group from the first record acknowledged on, resumes a load a
// crash interrupted (progress.go), and reports what happened (summary.go).
//
// Memory holds a few chunks of records whatever the inputs' size: a row
// being parsed and a few hundred read ahead, the records the producer has
// not had acknowledged (queue.Producer: 10,000 at most), the IDs
// remembered to find repeated ones (DefaultIDMemory, 8 MiB), and the
// workers' in-flight records. Only Interleave holds the whole input.
//
// A load finishes when the group has committed every offset it produced,
// so workers of other processes in the group help, and nothing is reported
// done before it is committed.
package bulkload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/pipeline"
)

// ErrTooManyDeadLetters is returned by Load.Run when more records than
// Config.MaxDeadLetters allows were dead-lettered: the load stopped
// producing, so a bad configuration cannot empty a file into the
// dead-letter topic.
var ErrTooManyDeadLetters = errors.New("bulkload: too many dead letters")

// ErrNoWorkers is returned by Load.Run without in-process workers when the
// consumer group had no live member for Config.SinkTimeout.
var ErrNoWorkers = errors.New("bulkload: no worker drains the topic")

// Config configures a Load.
type Config struct {
	// Topic receives the file's records; Group is the consumer group the
	// workers drain it with. Both required.
	Topic, Group string
	// Capacity is the pool's capacity in units/s; Unit its unit. Used for
	// the ideal time, utilization and the ETA. Required.
	Capacity float64
	// CapacityNow, when set, returns the pool's capacity in force, in
	// units/s, for a pool whose capacity comes from a source and changes
	// during the load: the summary is judged against the one in force at
	// its end. Default: Capacity.
	CapacityNow func() float64
	Unit        ingest.Unit
	// IDField names the field the IDs come from, for the report.
	IDField string
	// Pool names the capacity pool, for the report.
	Pool string
	// DuplicatesUnknown says the sink cannot tell a record it had
	// already (a REST API without duplicate statuses), for the report.
	DuplicatesUnknown bool
	// LoadID names the load for Progress (see LoadID); "" without resume.
	LoadID string
	// Chunk is the number of records per produce call. Defaults to
	// DefaultChunk (500).
	Chunk int
	// MaxDeadLetters stops the load once more records are dead-lettered.
	// The zero value tolerates none; see DefaultDeadLetterLimit.
	MaxDeadLetters DeadLetterLimit
	// SinkTimeout is how long a load without in-process workers waits for
	// a live member of the group before it gives up (ErrNoWorkers).
	// Default 5 min. (In-process workers give up on a sink that long
	// unavailable themselves: worker.Config.StallTimeout.)
	SinkTimeout time.Duration
	// Poll is how often progress and the group's offsets are checked.
	// Default 200 ms.
	Poll time.Duration
	// StallWarn is how long a load may finish no record and commit no
	// offset, while no sink is paused, before it warns: which partitions
	// the group's committed offsets wait on, and where each in-process
	// worker's records wait. Again every StallWarn while it lasts.
	// Default 30 s.
	StallWarn time.Duration
	// JoinTimeout bounds the wait, before producing, for the workers to
	// join the consumer group. Default 30 s; past it the load goes on.
	JoinTimeout time.Duration
	// Logger receives progress lines. Default: slog.Default().
	Logger *slog.Logger
	// Screen, when set, shows a progress bar on a terminal instead of
	// periodic log lines.
	Screen *Screen
}

// Ports are what a Load drives.
type Ports struct {
	// File is the input (an *Input, or its rows reordered).
	File        Rows
	Producer    ingest.Producer
	DeadLetters ingest.DeadLetters // receives the rows that cannot be produced
	Offsets     ingest.Offsets
	// Workers drain the topic (each a full worker stack in the group).
	// None: worker pods of the group drain it, and progress comes from the
	// group's committed offsets.
	Workers []Worker
	// Counters are the workers' shared totals.
	Counters *ingest.Counters
	// Sink, when it keeps statistics, completes the summary.
	Sink ingest.StatsSink
	// Start, when not nil, is closed once the first records are
	// acknowledged by the broker; the in-process workers wait for it, and
	// drain while the rest is produced.
	Start chan struct{}
	// Progress, with Config.LoadID, makes a rerun resume; nil: none.
	Progress Progress
	// SinkError, when set, returns the latest error of a whole write
	// (for the progress shown while the sink is paused).
	SinkError func() string
}

// Load loads an input (files, standard input) through the queue into the
// sink. Create it with New.
type Load struct {
	cfg        Config
	p          Ports
	sinkBefore *ingest.SinkStats // the sink's counts when the load began
}

// New checks cfg and returns a Load.
func New(cfg Config, p Ports) (*Load, error) {
	switch {
	case cfg.Topic == "" || cfg.Group == "":
		return nil, errors.New("bulkload: a load needs a topic and a group")
	case cfg.Capacity <= 0:
		return nil, fmt.Errorf("bulkload: capacity must be > 0, got %v", cfg.Capacity)
	case p.File == nil || p.Producer == nil || p.DeadLetters == nil || p.Offsets == nil || p.Counters == nil:
		return nil, errors.New("bulkload: a load needs a file, producer, dead letters, offsets and counters")
	}
	cfg.Chunk = cmp.Or(cfg.Chunk, DefaultChunk)
	cfg.Poll = cmp.Or(cfg.Poll, 200*time.Millisecond)
	cfg.JoinTimeout = cmp.Or(cfg.JoinTimeout, 30*time.Second)
	cfg.SinkTimeout = cmp.Or(cfg.SinkTimeout, 5*time.Minute)
	cfg.StallWarn = cmp.Or(cfg.StallWarn, 30*time.Second)
	cfg.Unit = cmp.Or(cfg.Unit, ingest.UnitRecords)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return &Load{cfg: cfg, p: p}, nil
}

// Worker is an in-process worker stack of the topic's consumer group
// (*worker.Worker is one). One that also reports SinkPaused() (bool,
// time.Time) shows a paused sink in the progress.
type Worker interface {
	// Run drains the topic until ctx is done.
	ingest.Runner
	// Rate is the worker's leased rate at now, in units/s.
	Rate(now time.Time) float64
}

// pauser is a Worker that reports a paused sink.
type pauser interface {
	SinkPaused() (bool, time.Time)
}

// waiter is a Worker that reports where its records wait (*worker.Worker).
type waiter interface {
	Waiting() pipeline.Waiting
}

// paused reports whether a worker's sink is paused, and since when (the
// earliest).
func (l *Load) paused() (bool, time.Time) {
	var since time.Time
	for _, w := range l.p.Workers {
		if p, ok := w.(pauser); ok {
			if yes, at := p.SinkPaused(); yes && (since.IsZero() || at.Before(since)) {
				since = at
			}
		}
	}
	return !since.IsZero(), since
}

// rate is the workers' combined leased rate at now, in units/s.
func (l *Load) rate(now time.Time) float64 {
	var sum float64
	for _, w := range l.p.Workers {
		sum += w.Rate(now)
	}
	return sum
}

// Run loads the input and returns the summary. It stops early, with the
// summary of what was done, when ctx ends (its cause), when a worker gives
// up (its *pipeline.StalledError), when the dead letters exceed the limit
// (ErrTooManyDeadLetters), or, without workers, when none drains the topic
// (ErrNoWorkers). Records produced but not delivered then are still in the
// topic, and a rerun of the same load resumes.
func (l *Load) Run(ctx context.Context) (Summary, error) {
	began := time.Now()
	s := Summary{LoadID: l.cfg.LoadID, Pool: l.cfg.Pool, Workers: len(l.p.Workers)}
	var skip int64
	if l.p.Progress != nil && l.cfg.LoadID != "" {
		release, err := l.p.Progress.Claim(ctx, l.cfg.LoadID)
		if err != nil {
			return s, err
		}
		defer release()
		resumed, err := l.p.Progress.Resume(ctx, l.cfg.LoadID)
		if err != nil {
			return s, err
		}
		if !resumed.FinishedAt.IsZero() {
			s.Outcome, s.FinishedAt, s.RecordsSkipped = OutcomeNothingToDo, resumed.FinishedAt, resumed.Rows
			s.Message = fmt.Sprintf("load %s finished at %s (%d rows); --no-resume loads it again",
				l.cfg.LoadID, resumed.FinishedAt.Local().Format(time.DateTime), resumed.Rows)
			return s, nil
		}
		if skip = resumed.Rows; skip > 0 {
			l.cfg.Logger.Info("resuming a load an earlier run left unfinished", "load", l.cfg.LoadID, "rows_done", skip)
		}
	}
	if l.p.Sink != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if st, err := l.p.Sink.Stats(sctx); err == nil {
			l.sinkBefore = &st
		}
		cancel()
	}
	start, err := l.p.Offsets.EndOffsets(ctx, l.cfg.Topic)
	if err != nil {
		return s, fmt.Errorf("read end offsets of %q: %w", l.cfg.Topic, err)
	}

	workCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	g, gctx := errgroup.WithContext(workCtx)
	for _, w := range l.p.Workers {
		g.Go(func() error { return w.Run(gctx) })
	}
	l.awaitGroup(ctx)

	var mu sync.Mutex // guards produced while the producer runs
	var produced Produced
	prog := newDisplay(l.cfg, len(l.p.Workers) == 0, l.paused, l.p.SinkError)
	defer prog.close()
	startOnce := sync.OnceFunc(func() {
		if l.p.Start != nil {
			close(l.p.Start)
		}
	})
	defer startOnce()
	produceErr := make(chan error, 1)
	produceDone := make(chan struct{})
	go func() {
		defer close(produceDone)
		p, err := Produce(gctx, l.p.File, l.p.Producer, l.p.DeadLetters, ProduceConfig{
			Topic: l.cfg.Topic, Chunk: l.cfg.Chunk, IDField: l.cfg.IDField, Skip: skip, Logger: l.cfg.Logger,
			Acked: func(ctx context.Context, p Produced) error {
				mu.Lock()
				produced = p
				mu.Unlock()
				startOnce()
				if l.p.Progress != nil && l.cfg.LoadID != "" {
					if err := l.p.Progress.Save(ctx, l.cfg.LoadID, p.Done); err != nil {
						l.cfg.Logger.Warn("saving the load's progress failed; a rerun would produce more again", "err", err)
					}
				}
				return l.checkDeadLetters(p)
			},
		})
		mu.Lock()
		produced = p
		mu.Unlock()
		produceErr <- err
	}()
	// gctx ends when a worker gives up (its error is the cause) or ctx does.
	doneAt, err := l.await(gctx, start, produceErr, func() Produced { mu.Lock(); defer mu.Unlock(); return produced }, prog)
	if err != nil {
		stop(err)
	} else {
		stop(nil)
	}
	<-produceDone // stopped by the cancelled context when it was not done
	if werr := g.Wait(); err == nil && !errors.Is(werr, context.Canceled) {
		err = werr
	}
	if err == nil {
		err = context.Cause(ctx)
	}
	prog.close() // before the summary is printed
	s = l.summary(ctx, s, produced, start, began, doneAt)
	s.WallS = time.Since(began).Seconds()
	if err == nil && l.p.Progress != nil && l.cfg.LoadID != "" {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if ferr := l.p.Progress.Finish(fctx, l.cfg.LoadID, time.Now()); ferr != nil {
			l.cfg.Logger.Warn("saving that the load finished failed; a rerun would check the input again", "err", ferr)
		}
		cancel()
	}
	return s, err
}

// checkDeadLetters returns ErrTooManyDeadLetters past the limit.
func (l *Load) checkDeadLetters(p Produced) error {
	dead := p.DeadLettered + l.p.Counters.Totals().DeadLettered
	if !l.cfg.MaxDeadLetters.Allows(dead, p.Read) {
		return fmt.Errorf("%w: %d of %d rows read (the limit is %s); stopped producing, see %s.dlq (sluice dlq inspect --topic %s)",
			ErrTooManyDeadLetters, dead, p.Read, l.cfg.MaxDeadLetters.Describe(), l.cfg.Topic, l.cfg.Topic)
	}
	return nil
}

// awaitGroup waits until the in-process workers have joined the group and
// it is stable, so that no rebalance hands records a worker already fetched
// to another.
func (l *Load) awaitGroup(ctx context.Context) {
	if len(l.p.Workers) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.JoinTimeout)
	defer cancel()
	tick := time.NewTicker(l.cfg.Poll / 4)
	defer tick.Stop()
	for {
		members, stable, err := l.p.Offsets.GroupMembers(ctx, l.cfg.Group)
		if err == nil && stable && members >= len(l.p.Workers) {
			return
		}
		select {
		case <-ctx.Done():
			l.cfg.Logger.Warn("workers did not all join the consumer group in time, loading anyway",
				"group", l.cfg.Group, "members", members, "workers", len(l.p.Workers), "err", err)
			return
		case <-tick.C:
		}
	}
}

// await reports progress while the file is produced and drained, and
// returns once the producer is done and the group has committed every
// offset it produced, with when it saw that.
func (l *Load) await(ctx context.Context, start map[int]int64, produceErr <-chan error, produced func() Produced, prog *display) (time.Time, error) {
	tick := time.NewTicker(l.cfg.Poll)
	defer tick.Stop()
	var target map[int]int64 // the end offsets once everything is produced
	lastMember := time.Now()
	var stall stallWatch
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, context.Cause(ctx)
		case err := <-produceErr:
			if err != nil {
				return time.Time{}, err
			}
			end, err := l.p.Offsets.EndOffsets(ctx, l.cfg.Topic)
			if err != nil {
				return time.Time{}, fmt.Errorf("read end offsets of %q: %w", l.cfg.Topic, err)
			}
			target = end
			p := produced()
			l.cfg.Logger.Info("file produced", "topic", l.cfg.Topic, "rows", p.Read, "produced", p.Produced,
				"skipped", p.Skipped, "dead_lettered", p.DeadLettered)
		case <-tick.C:
		}
		p := produced()
		if err := l.checkDeadLetters(p); err != nil {
			return time.Time{}, err
		}
		committed, err := l.p.Offsets.CommittedOffsets(ctx, l.cfg.Group, l.cfg.Topic)
		if err != nil {
			l.cfg.Logger.Warn("reading committed offsets failed", "group", l.cfg.Group, "err", err)
			continue
		}
		t := l.p.Counters.Totals()
		if len(l.p.Workers) == 0 {
			t.Delivered = advanced(committed, start) // the pods' work, as the group committed it
			if members, _, err := l.p.Offsets.GroupMembers(ctx, l.cfg.Group); err == nil && members > 0 {
				lastMember = time.Now()
			} else if time.Since(lastMember) >= l.cfg.SinkTimeout {
				return time.Time{}, fmt.Errorf("%w: consumer group %q has had no live member for %s; start `sluice worker` pods for topic %q (the records produced stay in it)",
					ErrNoWorkers, l.cfg.Group, l.cfg.SinkTimeout, l.cfg.Topic)
			}
		}
		prog.update(t, p, l.rate(time.Now()))
		if target != nil && reached(committed, target) {
			return time.Now(), nil
		}
		if paused, _ := l.paused(); stall.stalled(time.Now(), t.Finished()+advanced(committed, start), paused, l.cfg.StallWarn) {
			l.warnStall(committed, target)
		}
	}
}

// stallWatch tells when a load has made no progress for a while.
type stallWatch struct {
	since    time.Time // when progress last changed, or the last warning
	progress int64
}

// stalled reports, once every after, that progress has not changed for
// after at now while the sink was not paused (a paused sink has its own
// progress line and timeout).
func (s *stallWatch) stalled(now time.Time, progress int64, paused bool, after time.Duration) bool {
	if s.since.IsZero() || progress != s.progress || paused {
		s.since, s.progress = now, progress
		return false
	}
	if now.Sub(s.since) < after {
		return false
	}
	s.since = now
	return true
}

// warnStall logs where a load that stopped advancing waits: the
// partitions whose committed offset is short of the end produced (target,
// once known), and what each in-process worker holds and leases.
func (l *Load) warnStall(committed, target map[int]int64) {
	attrs := []any{"stalled_for", l.cfg.StallWarn.String()}
	if target != nil {
		var behind []string
		for _, p := range slices.Sorted(maps.Keys(target)) {
			if end := target[p]; committed[p] < end {
				behind = append(behind, fmt.Sprintf("%d: committed %d of %d", p, committed[p], end))
			}
		}
		attrs = append(attrs, "partitions_behind", strings.Join(behind, "; "))
	}
	now := time.Now()
	for i, w := range l.p.Workers {
		group := []any{"leased_units_per_s", math.Round(w.Rate(now))}
		if wt, ok := w.(waiter); ok {
			h := wt.Waiting()
			group = append(group, "fetched", h.Fetched, "retrying", h.Retrying, "held_by_hot_ranges", h.Held, "requests_unanswered", h.Requests)
		}
		attrs = append(attrs, slog.Group(fmt.Sprintf("worker%d", i), group...))
	}
	l.cfg.Logger.Warn("no record finished and no offset committed for a while; the load waits", attrs...)
}

// advanced is how many offsets the group committed past start, over all
// partitions.
func advanced(committed, start map[int]int64) int64 {
	var n int64
	for p, c := range committed {
		n += max(c-start[p], 0)
	}
	return n
}

// reached reports whether every partition's committed offset is at or past
// its target.
func reached(committed, target map[int]int64) bool {
	for p, end := range target {
		if end > 0 && committed[p] < end {
			return false
		}
	}
	return true
}

// CheckFields returns an error naming the first of want that fields (a
// file's columns, see FileReader.Fields) lacks, and the fields there are.
// what says which setting wants each, e.g. "--id-field".
func CheckFields(fields []string, want map[string]string) error {
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !slices.Contains(fields, name) {
			return fmt.Errorf("%s: field %q is not in the input (fields: %s)", want[name], name, strings.Join(fields, ", "))
		}
	}
	return nil
}
