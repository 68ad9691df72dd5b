// Package metrics exposes a sluice process to Prometheus: what its workers
// lease, release and write, read from the components at scrape time, and a
// server for /metrics, /healthz and /readyz.
//
// Every metric carries the label pool; per-worker metrics also carry
// worker (the lease worker ID), and sluice_leased_units_per_second the
// worker's priority class (priority: high, normal or low), so that a
// pool's leased rate sums by class. Metrics, with their units:
//
//	sluice_pool_capacity_units_per_second        gauge    the pool's capacity in force (units/s)
//	sluice_pool_effective_units_per_second       gauge    the pool's effective rate: the capacity, or less while ramping up (units/s)
//	sluice_leased_units_per_second{priority}     gauge    the rate the worker's valid leases allow (units/s)
//	sluice_demand_units_per_second               gauge    the demand the worker announces to its pool, capped at the pool's effective rate (units/s)
//	sluice_leases_held                           gauge    partitions the worker holds
//	sluice_reserved_partitions_missing           gauge    reserved partitions the worker could not take yet
//	sluice_lease_events_total{event}             counter  acquired, renewed, lost, released, failed (lock calls that failed, locks that did not become leases)
//	sluice_slices_total                          counter  slices opened by the pacer
//	sluice_slice_budget_units_total              counter  units granted by the pacer's slices
//	sluice_slice_used_units_total                counter  units sent (retries and charge corrections included)
//	sluice_throttle_cuts_total                   counter  slices whose rate was cut because the sink throttled
//	sluice_throttle_recoveries_total             counter  times the throttle ceiling climbed back to the leased rate
//	sluice_throttle_ceiling_units_per_second     gauge    the current throttle ceiling, 0 when none (units/s)
//	sluice_records_total{outcome}                counter  delivered (stored for the first time), duplicate (the sink already had it), dead_lettered
//	sluice_sink_state                            gauge    0 writing, 1 paused after a write failed as a whole (per worker)
//	sluice_sink_paused_seconds_total             counter  time the sink was paused, the current pause included (seconds)
//	sluice_ready                                 gauge    1 while the worker can make progress, 0 once a failure has lasted its ready threshold
//	sluice_redis_unreachable_seconds             gauge    how long the worker's Redis calls have been failing without a success, 0 while Redis answers (seconds)
//	sluice_send_max_units_1s                     gauge    the most units sent in any sliding second so far (send side of the rate promise)
//	sluice_send_latency_p99_seconds              gauge    99th percentile of the latest send→answer latencies (seconds)
//	sluice_sink_requests_total{result}           counter  write requests sent to the sink: ok (answered), failed (unreachable, timeout)
//	sluice_sink_record_results_total{outcome}    counter  record attempts by answer: delivered, duplicate, throttled (429), retryable (408, 5xx), permanent (other 4xx)
//	sluice_retries_total                         counter  record attempts scheduled again after a backoff
//	sluice_hot_key_ranges_total                  counter  key ranges the sink's answers showed full (throttle feedback per key range)
//	sluice_hot_key_range_cuts_total              counter  times a hot key range was throttled again at its own rate and slowed
//	sluice_consumer_lag_records                  gauge    records waiting in the queue beyond those fetched (-1 unknown)
//	sluice_eta_seconds                           gauge    lag ÷ the leased rate in records/s (-1 when unknown or no rate)
//	sluice_batch_duration_seconds                histogram sink write attempts, by duration (seconds)
//	sluice_capacity_read_failures_total          counter  times the sink did not answer the capacity query of a pool with --capacity sink (the pool keeps its last value)
//
// Units are the pool's unit (records, bytes or cost units such as RU).
package metrics

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/pacing"
)

// Worker is what the collector reads about one worker stack. Pool and
// Lease are required; the rest may be nil.
type Worker struct {
	Pool  string
	Lease *lease.Manager
	Pacer *pacing.Pacer
	// Lag returns the consumer lag in records (-1 unknown).
	Lag func() int64
	// Sink, when set, reports whether the sink is paused and whether the
	// worker can make progress.
	Sink SinkState
}

// SinkState is what the collector reads of a worker's sink and readiness;
// *worker.Worker implements it.
type SinkState interface {
	SinkPaused() (paused bool, since time.Time)
	SinkPausedTotal() time.Duration
	Ready() error
}

// Collector is a prometheus.Collector over a process's workers. Counters
// shared by the workers of one pool (bulk-load runs several) are reported
// once per pool.
type Collector struct {
	workers  []Worker
	counters map[string]*ingest.Counters // pool → totals
	batch    *prometheus.HistogramVec
	readers  map[string]func() int64 // pool → capacity read failures
}

// New returns a Collector and registers it, with its batch histogram, on
// reg. It returns the registration error (e.g. a duplicate registration).
func New(reg prometheus.Registerer) (*Collector, error) {
	c := &Collector{
		counters: map[string]*ingest.Counters{},
		batch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_batch_duration_seconds",
			Help:    "Sink write attempts by duration, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1 ms .. 8 s
		}, []string{"pool"}),
	}
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("metrics: register: %w", err)
	}
	if err := reg.Register(c.batch); err != nil {
		return nil, fmt.Errorf("metrics: register: %w", err)
	}
	return c, nil
}

// Add starts reporting w, and counters as its pool's totals. Call it before
// the first scrape (it is not synchronized with Collect).
func (c *Collector) Add(w Worker, counters *ingest.Counters) {
	c.workers = append(c.workers, w)
	if counters != nil {
		c.counters[w.Pool] = counters
	}
}

// AddCapacityReads reports the capacity read failures of pool's
// controller (lease.Controller.ReadFailures). Call it before the first
// scrape.
func (c *Collector) AddCapacityReads(pool string, failures func() int64) {
	if c.readers == nil {
		c.readers = map[string]func() int64{}
	}
	c.readers[pool] = failures
}

// ObserveWrite returns a hook for pipeline.Config.ObserveWrite that
// feeds the batch histogram of pool.
func (c *Collector) ObserveWrite(pool string) func(records int, took time.Duration) {
	h := c.batch.WithLabelValues(pool)
	return func(_ int, took time.Duration) { h.Observe(took.Seconds()) }
}

var (
	poolLabels   = []string{"pool"}
	workerLabels = []string{"pool", "worker"}

	descCapacity   = prometheus.NewDesc("sluice_pool_capacity_units_per_second", "The pool's capacity in force, in units/s.", poolLabels, nil)
	descEffective  = prometheus.NewDesc("sluice_pool_effective_units_per_second", "The pool's effective rate (capacity, or less while ramping up), in units/s.", poolLabels, nil)
	descLeased     = prometheus.NewDesc("sluice_leased_units_per_second", "The rate the worker's valid leases allow, in units/s, by the worker's priority class.", append(workerLabels, "priority"), nil)
	descDemand     = prometheus.NewDesc("sluice_demand_units_per_second", "The demand the worker announces to its pool, capped at the pool's effective rate, in units/s.", workerLabels, nil)
	descHeld       = prometheus.NewDesc("sluice_leases_held", "Capacity partitions the worker holds.", workerLabels, nil)
	descMissing    = prometheus.NewDesc("sluice_reserved_partitions_missing", "Reserved partitions the worker could not take yet.", workerLabels, nil)
	descEvents     = prometheus.NewDesc("sluice_lease_events_total", "Lease events by kind.", append(workerLabels, "event"), nil)
	descSlices     = prometheus.NewDesc("sluice_slices_total", "Slices opened by the pacer.", workerLabels, nil)
	descBudget     = prometheus.NewDesc("sluice_slice_budget_units_total", "Units granted by the pacer's slices.", workerLabels, nil)
	descUsed       = prometheus.NewDesc("sluice_slice_used_units_total", "Units sent, retries and charge corrections included.", workerLabels, nil)
	descCuts       = prometheus.NewDesc("sluice_throttle_cuts_total", "Slices whose rate was cut because the sink throttled.", workerLabels, nil)
	descRecoveries = prometheus.NewDesc("sluice_throttle_recoveries_total", "Times the throttle ceiling climbed back to the leased rate.", workerLabels, nil)
	descCeiling    = prometheus.NewDesc("sluice_throttle_ceiling_units_per_second", "The current throttle ceiling in units/s, 0 when none.", workerLabels, nil)
	descLag        = prometheus.NewDesc("sluice_consumer_lag_records", "Records waiting in the queue beyond those fetched (-1 unknown).", workerLabels, nil)
	descETA        = prometheus.NewDesc("sluice_eta_seconds", "Seconds to drain the lag at the leased rate (-1 unknown).", workerLabels, nil)
	descRecords    = prometheus.NewDesc("sluice_records_total", "Finished records by outcome.", append(poolLabels, "outcome"), nil)
	descRequests   = prometheus.NewDesc("sluice_sink_requests_total", "Write requests sent to the sink, by result: ok (answered) or failed (unreachable, timeout).", append(poolLabels, "result"), nil)
	descResults    = prometheus.NewDesc("sluice_sink_record_results_total", "Record attempts by the sink's answer.", append(poolLabels, "outcome"), nil)
	descRetries    = prometheus.NewDesc("sluice_retries_total", "Record attempts scheduled again after a backoff.", poolLabels, nil)
	descHotRanges  = prometheus.NewDesc("sluice_hot_key_ranges_total", "Key ranges the sink's answers showed full.", poolLabels, nil)
	descRangeCuts  = prometheus.NewDesc("sluice_hot_key_range_cuts_total", "Times a hot key range was throttled again at its own rate and slowed.", poolLabels, nil)
	descSinkState  = prometheus.NewDesc("sluice_sink_state", "0 while writing, 1 while the sink is paused after a write failed as a whole.", workerLabels, nil)
	descPaused     = prometheus.NewDesc("sluice_sink_paused_seconds_total", "Seconds the sink was paused, the current pause included.", workerLabels, nil)
	descReady      = prometheus.NewDesc("sluice_ready", "1 while the worker can make progress, 0 once a failure has lasted its ready threshold.", workerLabels, nil)
	descRedisDown  = prometheus.NewDesc("sluice_redis_unreachable_seconds", "Seconds the worker's Redis calls have been failing without a success, 0 while Redis answers.", workerLabels, nil)
	descSendMax    = prometheus.NewDesc("sluice_send_max_units_1s", "The most units sent in any sliding second so far, at send time.", poolLabels, nil)
	descLatency    = prometheus.NewDesc("sluice_send_latency_p99_seconds", "99th percentile of the latest send-to-answer latencies, in seconds.", poolLabels, nil)
	descReadFails  = prometheus.NewDesc("sluice_capacity_read_failures_total", "Times the sink did not answer the pool's capacity query (the pool keeps its last value).", poolLabels, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCapacity, descEffective, descLeased, descDemand, descHeld, descMissing, descEvents, descRedisDown,
		descSlices, descBudget, descUsed, descCuts, descRecoveries, descCeiling, descLag, descETA, descRecords, descRequests, descResults, descRetries, descHotRanges, descRangeCuts,
		descSinkState, descPaused, descReady, descSendMax, descLatency, descReadFails} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	pools := map[string]bool{}
	for _, w := range c.workers {
		id := w.Lease.WorkerID()
		if !pools[w.Pool] {
			pools[w.Pool] = true
			gauge(descCapacity, w.Lease.Pool().Capacity, w.Pool)
			gauge(descEffective, w.Lease.Effective(now), w.Pool)
		}
		rate := w.Lease.Rate(now)
		gauge(descLeased, rate, w.Pool, id, w.Lease.Priority().String())
		gauge(descDemand, w.Lease.Demand(now), w.Pool, id)
		gauge(descRedisDown, w.Lease.RedisUnreachable(now).Seconds(), w.Pool, id)
		gauge(descHeld, float64(len(w.Lease.Held())), w.Pool, id)
		gauge(descMissing, float64(w.Lease.ReservedShort()), w.Pool, id)
		ev := w.Lease.Events()
		for event, n := range map[string]int64{"acquired": ev.Acquired, "renewed": ev.Renewed, "lost": ev.Lost, "released": ev.Released, "failed": ev.Failed} {
			counter(descEvents, n, w.Pool, id, event)
		}
		if w.Pacer != nil {
			st := w.Pacer.Stats()
			counter(descSlices, st.Slices, w.Pool, id)
			counter(descBudget, st.Budget, w.Pool, id)
			counter(descUsed, st.Spent, w.Pool, id)
			counter(descCuts, st.Cuts, w.Pool, id)
			counter(descRecoveries, st.Recoveries, w.Pool, id)
			gauge(descCeiling, st.Ceiling, w.Pool, id)
		}
		lag := int64(-1)
		if w.Lag != nil {
			lag = w.Lag()
		}
		gauge(descLag, float64(lag), w.Pool, id)
		gauge(descETA, eta(lag, rate, c.counters[w.Pool]), w.Pool, id)
		if w.Sink != nil {
			paused, _ := w.Sink.SinkPaused()
			gauge(descSinkState, b2f(paused), w.Pool, id)
			ch <- prometheus.MustNewConstMetric(descPaused, prometheus.CounterValue, w.Sink.SinkPausedTotal().Seconds(), w.Pool, id)
			gauge(descReady, b2f(w.Sink.Ready() == nil), w.Pool, id)
		}
	}
	for pool, ctr := range c.counters {
		t := ctr.Totals()
		counter(descRecords, t.Delivered, pool, "delivered")
		counter(descRecords, t.Duplicates, pool, "duplicate")
		counter(descRecords, t.DeadLettered, pool, "dead_lettered")
		counter(descRequests, t.Requests-t.FailedWrites, pool, "ok")
		counter(descRequests, t.FailedWrites, pool, "failed")
		gauge(descSendMax, float64(t.MaxSent1s), pool)
		gauge(descLatency, t.LatencyP99.Seconds(), pool)
		for outcome, n := range map[string]int64{"delivered": t.Delivered, "duplicate": t.Duplicates,
			"throttled": t.Throttled, "retryable": t.Retryable, "permanent": t.Permanent} {
			counter(descResults, n, pool, outcome)
		}
		counter(descRetries, t.Retried, pool)
		counter(descHotRanges, t.HotRanges, pool)
		counter(descRangeCuts, t.RangeCuts, pool)
	}
	for pool, failures := range c.readers {
		counter(descReadFails, failures(), pool)
	}
}

// eta is the seconds to drain lag records at rate units/s, converting with
// the average units per delivered record so far (1 before any); -1 when the
// lag is unknown or there is no rate.
func eta(lag int64, rate float64, ctr *ingest.Counters) float64 {
	if lag < 0 || rate <= 0 {
		return -1
	}
	perRecord := 1.0
	if ctr != nil {
		perRecord = ctr.Totals().UnitsPerRecord()
	}
	return float64(lag) * perRecord / rate
}

// Handler serves a process's operational endpoints, all answering JSON
// but /metrics:
//
//   - GET /metrics: gather in the Prometheus text format (when gather is
//     not nil);
//   - GET /healthz: 200 {"status":"ok"} while the process runs;
//   - GET /readyz: 200 {"status":"ready"} while ready returns nil (nil
//     ready: always), else 503 {"code":"not_ready","message":<the error>}.
//     ready is called with a 2 s deadline.
func Handler(gather prometheus.Gatherer, ready func(context.Context) error) *http.ServeMux {
	mux := http.NewServeMux()
	if gather != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(gather, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		httpserver.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			rctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			if err := ready(rctx); err != nil {
				httpserver.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"code": "not_ready", "message": err.Error()})
				return
			}
		}
		httpserver.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return mux
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
