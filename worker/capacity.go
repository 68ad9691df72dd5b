package worker

import (
	"errors"
	"log/slog"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
)

// NewController builds the capacity controller of a pool whose capacity
// comes from a source (lease.Controller) over the workers of one process
// that drain it: it observes what they send, how much of it the sink
// throttled, their answers' latency and whether they have a backlog
// (counters shared by several workers count once), and reads the sink's
// capacity through reader when the source is the sink (nil otherwise).
// Run it beside the workers, e.g. workers[0].Attach(ctrl).
func NewController(pool lease.Pool, clients []redis.UniversalClient, reader lease.CapacityReader, log *slog.Logger, workers ...*Worker) (*lease.Controller, error) {
	if len(workers) == 0 {
		return nil, &ConfigError{Field: "Workers", Err: errors.New("a capacity controller needs the workers it observes")}
	}
	var counters []*ingest.Counters
	for _, w := range workers {
		if !slices.Contains(counters, w.cfg.Counters) {
			counters = append(counters, w.cfg.Counters)
		}
	}
	observe := func() lease.Observation {
		var o lease.Observation
		for _, c := range counters {
			t := c.Totals()
			o.Units += float64(t.UnitsSent)
			o.Attempts += t.Attempts
			o.Throttled += t.Throttled
			o.Latency += t.LatencySum
			o.Answers += t.Latencies
		}
		for _, w := range workers {
			if w.Lag() > 0 || w.lease.Backlogged() {
				o.Backlog = true
			}
		}
		return o
	}
	return lease.NewController(lease.ControllerConfig{
		Pool: pool, WorkerID: workers[0].lease.WorkerID(), Reader: reader, Observe: observe, Logger: log,
	}, clients...)
}
