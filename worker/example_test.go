package worker_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest/ingesttest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/worker"
)

// A whole worker: its lease manager on a Redis (miniredis here), its pacer
// and pipeline, draining a queue (in memory here, instead of a Kafka
// consumer) into the sink emulator provisioned at 1,000 records/s, which
// counts what it accepted.
func ExampleNew() {
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true) // leases expire on the real clock, as in Redis
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	sim, _ := sinksim.New(sinksim.Config{Capacity: 1000, Mode: sinksim.ModeWindow})
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()
	target, _ := sink.NewHTTP(sink.HTTPConfig{URL: srv.URL})

	var values [][]byte
	for i := range 500 {
		values = append(values, fmt.Appendf(nil, `{"id":"nc%d","mag":%.1f}`, i, float64(i%50)/10))
	}
	queue := ingesttest.NewQueue("quakes", values...)
	w, err := worker.New(worker.Config{
		Source:      queue,
		Redis:       []redis.UniversalClient{rdb},
		Pool:        lease.Pool{Name: "example", Capacity: 1000, Partitions: 10},
		IDField:     "id",
		Sink:        target,
		DeadLetters: ingesttest.Discard{},
	})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	<-queue.Finished()
	stop()
	if err := <-done; err != nil {
		panic(err)
	}

	t := w.Counters().Totals()
	st := sim.Snapshot(false)
	fmt.Printf("delivered %d of 500, %d duplicates, %d dead-lettered\n", t.Delivered, t.Duplicates, t.DeadLettered)
	fmt.Printf("the sink accepted %d, throttled %d; busiest second within 1,000: %v\n", st.Accepted, st.Throttled, st.MaxUnits1s <= 1000)
	// Output:
	// delivered 500 of 500, 0 duplicates, 0 dead-lettered
	// the sink accepted 500, throttled 0; busiest second within 1,000: true
}
