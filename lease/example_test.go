package lease_test

import (
	"context"
	"fmt"

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
	// lease: pool definition mismatch: pool "demo" is defined in Redis (sluice:demo:def) with capacity 2000 records/s, 20 partitions, ttl 15s; this worker was started with capacity 1000 records/s, 20 partitions, ttl 15s
}
