package pipeline_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/ingest/ingesttest"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/pipeline"
	"github.com/sluicehq/sluice/sink"
)

// store is a sink that stores every record once, by ID, and notes when.
type store struct {
	mu  sync.Mutex
	ids map[string]bool
	at  []time.Time
}

func (s *store) Write(_ context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := make([]ingest.Result, len(batch))
	for i, r := range batch {
		if s.ids[r.ID] {
			res[i] = ingest.Result{Outcome: ingest.Duplicate}
			continue
		}
		s.ids[r.ID] = true
		s.at = append(s.at, time.Now())
	}
	return res, nil
}

// lease is a capacity of rate records/s held for good; lease.Manager is the
// real one, shared with other workers through Redis.
type lease float64

func (l lease) Rate(time.Time) float64            { return float64(l) }
func (l lease) Credit(from, to time.Time) float64 { return float64(l) * to.Sub(from).Seconds() }
func (lease) SetDemand(float64)                   {}

// A pipeline drains 120 records into a sink at 200 records/s: slices of
// 200 ms carry 40 records each, and no sliding second holds more than 200.
func Example() {
	const n, rate = 120, 200
	var values [][]byte
	for i := range n {
		values = append(values, fmt.Appendf(nil, `{"id":"quake-%03d","mag":%d.%d}`, i, i%7, i%10))
	}
	q := ingesttest.NewQueue("earthquakes", values...) // in memory, instead of Kafka
	capacity := lease(rate)
	pacer, err := pacing.New(pacing.Config{}, capacity)
	if err != nil {
		fmt.Println(err)
		return
	}
	st := &store{ids: map[string]bool{}}
	p, err := pipeline.New(pipeline.Config{IDField: "id"}, pipeline.Ports{
		Source: q, DeadLetters: ingesttest.Discard{}, Sink: st, Retry: sink.Policy{}, Pacer: pacer, Capacity: capacity,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	<-q.Finished()
	cancel()
	fmt.Println("run:", <-done)

	st.mu.Lock()
	defer st.mu.Unlock()
	busiest := 0
	for i, t := range st.at {
		in := 0
		for _, u := range st.at[i:] {
			if u.Sub(t) < time.Second {
				in++
			}
		}
		busiest = max(busiest, in)
	}
	t := p.Counters().Totals()
	fmt.Println("delivered:", t.Delivered, "stored:", len(st.ids))
	fmt.Println("busiest second within 200 records/s:", busiest <= rate)
	// Output:
	// run: <nil>
	// delivered: 120 stored: 120
	// busiest second within 200 records/s: true
}
