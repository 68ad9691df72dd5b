package lease_test

import (
	"fmt"

	"github.com/sluicehq/sluice/lease"
)

// Clients for a managed Redis reached over TLS as an ACL user, the
// password kept apart from the URL (read from the environment or a file
// by the caller). lease.PingRedis(ctx, clients...) checks them at start-up.
func ExampleOpenRedis() {
	cfg := lease.RedisConfig{
		Addrs:    []string{"rediss://sluice@cache.example.com:6380/0"},
		Password: "from-SLUICE_REDIS_PASSWORD",
	}
	clients, err := lease.OpenRedis(cfg)
	if err != nil {
		panic(err)
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	fmt.Println(len(clients), cfg)

	_, err = lease.OpenRedis(lease.RedisConfig{Addrs: []string{"redis://sluice:s3cret@cache:6379"}, TLS: true})
	fmt.Println(err)
	// Output:
	// 1 redis rediss://sluice@cache.example.com:6380/0, password set
	// lease: invalid config: redis address 1 of 1 (redis://sluice:xxxxx@cache:6379): TLS settings for a redis:// URL: use rediss://
}
