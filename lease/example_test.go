package lease_test

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lease"
)

// A pool of 500 requests/s in 20 partitions: each lease is worth 25/s.
func ExamplePool_PartitionRate() {
	p := lease.Pool{Name: "orders-db", Capacity: 500, Unit: "records", Partitions: 20}
	fmt.Println(p.PartitionRate())
	fmt.Println(p)
	// Output:
	// 25
	// capacity 500 records/s, 20 partitions, ttl 15s
}

// A worker started with another definition than the one in Redis refuses
// to start.
func ExampleEnsurePool() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	ctx := context.Background()
	_, err := lease.EnsurePool(ctx, client, "", lease.Pool{Name: "demo", Capacity: 2000, Partitions: 20})
	fmt.Println(err)
	_, err = lease.EnsurePool(ctx, client, "", lease.Pool{Name: "demo", Capacity: 1000, Partitions: 20})
	fmt.Println(err)
	// Output:
	// <nil>
	// lease: pool definition mismatch: pool "demo" is defined in Redis (sluice:demo:def) with capacity 2000 records/s, 20 partitions, ttl 15s; this worker was started with capacity 1000 records/s, 20 partitions, ttl 15s (apply it as a live change, or start the worker with the stored values)
}

// Two workers share a pool of 1,000 records/s in 10 partitions. Alone, the
// first leases every partition; when the second announces a backlog too,
// each settles on a max-min fair share of 5; when the second stops, it
// unlocks its leases and the first takes them back at once instead of
// waiting out their TTL.
func Example_twoWorkersSharingAPool() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	ctx := context.Background()
	pool, err := lease.EnsurePool(ctx, client, "", lease.Pool{Name: "quakes", Capacity: 1000, Partitions: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	start := func(id string) (*lease.Manager, context.CancelFunc, <-chan error) {
		m, err := lease.New(lease.Config{Pool: pool, WorkerID: id}, client)
		if err != nil {
			panic(err)
		}
		m.SetDemand(math.Inf(1)) // a backlog it cannot drain at any rate it holds
		ctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		return m, stop, done
	}
	// settle waits until m holds n partitions, and prints what it holds.
	settle := func(m *lease.Manager, n int) {
		for deadline := time.Now().Add(10 * time.Second); len(m.Held()) != n && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		fmt.Printf("%s: %d partitions, %.0f records/s\n", m.WorkerID(), len(m.Held()), float64(len(m.Held()))*pool.PartitionRate())
	}

	a, stopA, doneA := start("worker-a")
	settle(a, 10)
	b, stopB, doneB := start("worker-b")
	settle(a, 5)
	settle(b, 5)
	stopB()
	fmt.Println("worker-b stopped:", <-doneB)
	settle(a, 10)
	stopA()
	fmt.Println("worker-a stopped:", <-doneA)
	// Output:
	// worker-a: 10 partitions, 1000 records/s
	// worker-a: 5 partitions, 500 records/s
	// worker-b: 5 partitions, 500 records/s
	// worker-b stopped: <nil>
	// worker-a: 10 partitions, 1000 records/s
	// worker-a stopped: <nil>
}
