package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
)

// Scenario 11's settings: live traffic and a backfill writing to one
// service of 2,000 records/s.
const (
	s12Capacity   = 2000
	s12Partitions = 200 // 10 records/s each: a class is served within 10 records/s of its demand
	s12Backfill   = 12_000
	s12Peak       = 1400 // live records/s at its peaks: 70 % of the service
	s12Quiet      = 400  // between them
	s12Phase      = 4 * time.Second
	s12Every      = 20 * time.Millisecond // the producers post a batch this often
)

// s12LiveRate is the live traffic's rate t after it began: peaks and quiet
// spells of s12Phase each, a peak first. The backfill starts one phase
// after the live traffic (which runs alone through its first peak, as
// live pods do before anyone starts a backfill), at a quiet spell.
func s12LiveRate(t time.Duration) int {
	if int(t/s12Phase)%2 == 0 {
		return s12Peak
	}
	return s12Quiet
}

// s12Ideal is how long the backfill takes when it gets left(t) records/s,
// t after the live traffic began, from its start one phase later, to
// 10 ms.
func s12Ideal(left func(time.Duration) float64) time.Duration {
	var done float64
	var t time.Duration
	for ; done < s12Backfill; t += 10 * time.Millisecond {
		done += left(s12Phase+t) * 0.01
	}
	return t
}

// scenario12 is live traffic first: upstream producers write records to
// one topic at 1,400/s (70 % of the service) for 4 s, then 400/s for 4 s,
// and so on, while a backfill of 12,000 records drains another topic into
// the same service of 2,000 records/s. Each is one sluice worker (the
// backfill leasing ahead, as bulk-load's), its own consumer, Redis client
// and lease manager. Three ways to share the service, side by side: one
// pool with priority classes (live high, backfill low), one pool without
// (both normal: max-min fair shares), and a static split (a pool of 1,400
// for live traffic, its peak, and one of 600 for the backfill). Measured:
// the live records' latency from their production to the sink's answer,
// the backfill's finish time, and the sink's busiest second.
func (r *runner) scenario12(ctx context.Context) ([]Scenario, error) {
	classes := s12Ideal(func(t time.Duration) float64 { return float64(s12Capacity - s12LiveRate(t)) })
	static := s12Ideal(func(time.Duration) float64 { return s12Capacity - s12Peak })
	sc := Scenario{ID: "12", Title: fmt.Sprintf("Live traffic first: live records at %d/s and %d/s in turns of %v beside a backfill of %d records, on one service of %d records/s",
		s12Peak, s12Quiet, s12Phase, s12Backfill, s12Capacity),
		Notes: []string{
			"live: one sluice worker (on demand, as a pod) draining a topic that producers write in batches every 20 ms; backfill: one sluice worker leasing ahead (as bulk-load's) draining 12,000 records produced beforehand; the backfill starts after the live traffic's first peak, at a quiet spell, and the live traffic goes on until the backfill is done",
			fmt.Sprintf("classes: one pool of %d partitions, live --priority high, backfill low; no classes: the same pool, both normal (max-min fair); static split: a pool of 1,400 records/s (140 partitions) for the live worker and one of 600 (60) for the backfill", s12Partitions),
			"live_p50_ms, live_p99_ms, live_max_ms: from a record's production to the sink's answer for it, at the worker, over the whole run; live_worst_ms_by_second in results.json: the longest of the records produced in each second",
			fmt.Sprintf("backfill_done_s: from the backfill's start to its last acknowledgement; its ideal takes all the live traffic leaves (%.1f s); a static split's least is %.1f s", classes.Seconds(), static.Seconds()),
		}}
	alts := []struct {
		name       string
		live, bulk lease.Priority
		static     bool
	}{
		{"sluice, classes (live high, backfill low)", lease.PriorityHigh, lease.PriorityLow, false},
		{"sluice, no classes (max-min fair shares)", lease.PriorityNormal, lease.PriorityNormal, false},
		{"sluice, static split (1,400 + 600)", lease.PriorityNormal, lease.PriorityNormal, true},
	}
	for _, alt := range alts {
		var reps []Entry
		for i := range r.repsFor(classes) {
			e, err := r.liveBeside(ctx, alt.live, alt.bulk, alt.static, classes)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", alt.name, err)
			}
			e.Alternative = alt.name
			reps = append(reps, e)
			r.log.Info("run done", "scenario", 11, "alternative", alt.name, "rep", i+1)
		}
		sc.Entries = append(sc.Entries, median(reps))
	}
	return []Scenario{sc}, nil
}

// liveBeside runs one trial of scenario 12.
func (r *runner) liveBeside(ctx context.Context, livePriority, bulkPriority lease.Priority, static bool, ideal time.Duration) (Entry, error) {
	liveTopic, bulkTopic := r.env.name("s12-live"), r.env.name("s12-bulk")
	if err := r.env.produce(ctx, bulkTopic, 4, s12Backfill, smallRecord(bulkTopic)); err != nil {
		return Entry{}, err
	}
	for t, n := range map[string]int{liveTopic: 4, liveTopic + ".dlq": 1} {
		if err := queue.EnsureTopic(ctx, r.env.brokers, t, n); err != nil {
			return Entry{}, err
		}
	}
	sim, err := startSim(ctx, sinksim.Config{Capacity: s12Capacity, Unit: ingest.UnitRecords})
	if err != nil {
		return Entry{}, err
	}
	defer sim.stop()
	epoch := sim.sim.Snapshot(true).SeriesStart
	pricing := ingest.Pricing{Unit: ingest.UnitRecords}
	shared := lease.Pool{Name: r.env.name("pool"), Capacity: s12Capacity, Partitions: s12Partitions}
	livePool, bulkPool := shared, shared
	if static {
		livePool = lease.Pool{Name: r.env.name("pool-live"), Capacity: s12Peak, Partitions: s12Peak / 10}
		bulkPool = lease.Pool{Name: r.env.name("pool-bulk"), Capacity: s12Capacity - s12Peak, Partitions: (s12Capacity - s12Peak) / 10}
	}
	httpSink, err := sink.NewHTTP(sink.HTTPConfig{URL: sim.url, Timeout: requestTimeout})
	if err != nil {
		return Entry{}, err
	}
	clock := &latencies{next: httpSink}
	live, err := r.env.newSluiceWorker(ctx, workerSpec{topic: liveTopic, group: r.env.name("g"), sink: clock, priority: livePriority}, livePool, pricing, sim.url, epoch, nil)
	if err != nil {
		return Entry{}, err
	}
	start := make(chan struct{})
	bulkGroup := r.env.name("g")
	bulk, err := r.env.newSluiceWorker(ctx, workerSpec{topic: bulkTopic, group: bulkGroup, records: s12Backfill, priority: bulkPriority}, bulkPool, pricing, sim.url, epoch, start)
	if err != nil {
		_ = live.client.Close()
		return Entry{}, err
	}
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	for _, w := range []*sluiceWorker{live, bulk} {
		go func() { errs <- w.run(jctx) }()
	}
	stop := func() error {
		cancel()
		var all []error
		for range 2 {
			if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
				all = append(all, err)
			}
		}
		return errors.Join(all...)
	}
	r.env.awaitGroups(jctx, []string{bulkGroup, live.group})

	producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: r.env.brokers, RoundRobin: true, Logger: r.env.log})
	if err != nil {
		_ = stop()
		return Entry{}, err
	}
	defer producer.Close()
	fed := make(chan int64, 1)
	feedCtx, stopFeed := context.WithCancel(jctx)
	liveBegan := time.Now()
	go func() { fed <- feedLive(feedCtx, producer, liveTopic, liveBegan) }()
	select { // the live traffic's first peak, alone
	case <-time.After(time.Until(liveBegan.Add(s12Phase))):
	case <-ctx.Done():
		stopFeed()
		<-fed
		_ = stop()
		return Entry{}, context.Cause(ctx)
	}
	began := time.Now()
	close(start)

	deadline := began.Add(10 * ideal)
	for bulk.progress().finished < s12Backfill {
		if time.Now().After(deadline) || ctx.Err() != nil {
			stopFeed()
			<-fed
			_ = stop()
			return Entry{}, fmt.Errorf("the backfill did not finish within %v", 10*ideal)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopFeed()
	produced := <-fed
	for live.progress().finished < produced {
		if time.Since(began) > 20*ideal {
			_ = stop()
			return Entry{}, fmt.Errorf("the live worker finished %d of %d records", live.progress().finished, produced)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop(); err != nil {
		return Entry{}, err
	}
	snap := sim.sim.Snapshot(true)
	lat := clock.sorted()
	if len(lat) == 0 {
		return Entry{}, errors.New("no live record was answered")
	}
	pct := func(q float64) float64 { return lat[int(q*float64(len(lat)-1))].Seconds() * 1000 }
	done := bulk.progress().last.Sub(began)
	return Entry{Reps: 1, Cols: []Col{
		{Name: "live_records", Value: float64(produced)},
		{Name: "live_p50_ms", Value: pct(0.5), Digits: 0},
		{Name: "live_p99_ms", Ideal: "≤ 2000", Value: pct(0.99), Digits: 0},
		{Name: "live_max_ms", Value: lat[len(lat)-1].Seconds() * 1000, Digits: 0},
		{Name: "backfill_done_s", Ideal: fmt.Sprintf("%.1f", ideal.Seconds()), Value: done.Seconds(), Digits: 1},
		{Name: "max_1s_window", Ideal: "≤ 1.000", Value: float64(snap.MaxUnits1s) / s12Capacity, Digits: 3},
		{Name: "throttled_429", Ideal: "0", Value: float64(snap.Throttled)},
	}, Extra: map[string]any{"per_200ms": trimZeros(snap.UnitsPer200ms), "live_worst_ms_by_second": clock.worstBySecond(liveBegan)}}, nil
}

// feedLive produces live records to topic at s12LiveRate until ctx is
// done, a batch every s12Every (catching up on the clock), and returns how
// many it produced. Each record's ID carries its production time (Unix
// ns), for latencies.
func feedLive(ctx context.Context, p *queue.Producer, topic string, began time.Time) int64 {
	var n int64
	var owed float64
	batch := make([]ingest.Record, 0, 64)
	for tick := 0; ctx.Err() == nil; tick++ {
		at := began.Add(time.Duration(tick) * s12Every)
		select {
		case <-ctx.Done():
			return n
		case <-time.After(time.Until(at)):
		}
		owed += float64(s12LiveRate(at.Sub(began))) * s12Every.Seconds()
		batch = batch[:0]
		now := time.Now().UnixNano()
		for ; owed >= 1; owed-- {
			id := fmt.Sprintf("live-%d-%d", n+int64(len(batch)), now)
			batch = append(batch, ingest.Record{ID: id, Value: fmt.Appendf(nil, `{"id":%q,"mag":%d.%d}`, id, tick%7, tick%10)})
		}
		if len(batch) == 0 {
			continue
		}
		if err := p.Produce(ctx, topic, batch); err != nil {
			return n
		}
		n += int64(len(batch))
	}
	return n
}

// latencies wraps the live worker's sink and notes, for every record the
// sink stored, how long after its production the answer arrived.
type latencies struct {
	next ingest.Sink
	mu   sync.Mutex
	all  []time.Duration
	at   []time.Time // when each was produced
}

// worstBySecond returns the longest latency of the records produced in
// each second from began, in ms.
func (l *latencies) worstBySecond(began time.Time) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int64
	for i, d := range l.all {
		s := int(l.at[i].Sub(began) / time.Second)
		if s < 0 {
			continue
		}
		for len(out) <= s {
			out = append(out, 0)
		}
		out[s] = max(out[s], d.Milliseconds())
	}
	return out
}

var _ ingest.Sink = (*latencies)(nil)

// Write implements ingest.Sink.
func (l *latencies) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	res, err := l.next.Write(ctx, batch)
	if err != nil {
		return res, err
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range res {
		if i >= len(batch) || (r.Outcome != ingest.Delivered && r.Outcome != ingest.Duplicate) {
			continue
		}
		id := batch[i].ID
		if ns, err := strconv.ParseInt(id[strings.LastIndexByte(id, '-')+1:], 10, 64); err == nil {
			l.all = append(l.all, now.Sub(time.Unix(0, ns)))
			l.at = append(l.at, time.Unix(0, ns))
		}
	}
	return res, nil
}

// Warm passes through to the sink, so the worker opens its connections
// as it would without the wrapper.
func (l *latencies) Warm(ctx context.Context, conns int) error {
	if w, ok := l.next.(ingest.Warmer); ok {
		return w.Warm(ctx, conns)
	}
	return nil
}

// sorted returns the latencies noted, shortest first.
func (l *latencies) sorted() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.all)
	slices.Sort(out)
	return out
}
