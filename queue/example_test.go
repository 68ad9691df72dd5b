package queue_test

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/queue"
)

// Produce to an embedded broker, consume in a group, mark records Done out
// of order, and read what the group committed.
func Example() {
	ctx := context.Background()
	kafka, err := queue.StartEmbedded(ctx)
	if err != nil {
		panic(err)
	}
	defer kafka.Close()
	brokers := kafka.Addrs()

	if err := queue.EnsureTopic(ctx, brokers, "quakes", 1); err != nil {
		panic(err)
	}
	producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: brokers})
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	var recs []ingest.Record
	for _, id := range []string{"nc1", "nc2", "nc3"} {
		recs = append(recs, ingest.Record{ID: id, Value: []byte(`{"id":"` + id + `"}`)})
	}
	if err := producer.Produce(ctx, "quakes", recs); err != nil {
		panic(err)
	}

	src, err := queue.NewSource(queue.SourceConfig{Brokers: brokers, Topic: "quakes", Group: "sluice-quakes"})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- src.Run(runCtx) }()
	var got []ingest.Record
	for range 3 {
		rec, err := src.Fetch(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Println("fetched", rec.ID, "at", rec.Pos)
		got = append(got, rec)
	}
	src.Done(got[2]) // out of order: nothing committable yet
	src.Done(got[0]) // offset 0 done: the group may resume at 1
	stop()
	if err := <-done; err != nil {
		panic(err)
	}

	committed, err := queue.CommittedOffsets(ctx, brokers, "sluice-quakes", "quakes")
	if err != nil {
		panic(err)
	}
	fmt.Println("committed", committed)
	// Output:
	// fetched nc1 at quakes/0@0
	// fetched nc2 at quakes/0@1
	// fetched nc3 at quakes/0@2
	// committed map[0:1]
}
