package main

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/alicebob/miniredis/v2"
	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sinksim"
)

// embedded holds the in-process services of --embedded.
type embedded struct {
	closers []func()
}

func (e *embedded) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// startEmbedded starts an in-process Kafka broker, Redis and sink emulator
// for each of --brokers, --redis-addr (or --redis-sentinel-master) and
// --sink that was not given, all on
// 127.0.0.1, and points s at them. The emulator is provisioned at the pool
// capacity unless --sim-capacity says otherwise.
func startEmbedded(ctx context.Context, c *cli.Context, s *settings) (_ *embedded, err error) {
	e := &embedded{}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if !c.IsSet("brokers") {
		kafka, err := queue.StartEmbedded(ctx)
		if err != nil {
			return nil, fmt.Errorf("start embedded Kafka: %w", err)
		}
		e.closers = append(e.closers, kafka.Close)
		s.worker.Brokers, s.worker.Kafka = kafka.Addrs(), queue.Conn{}
	}
	if !c.IsSet("redis-addr") && !c.IsSet("redis-sentinel-master") {
		redis := miniredis.NewMiniRedis()
		redis.ClockTTL(true) // TTLs follow the real clock, so leases expire as in Redis
		if err := redis.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("start embedded Redis: %w", err)
		}
		e.closers = append(e.closers, redis.Close)
		s.redis = lease.RedisConfig{Addrs: []string{redis.Addr()}}
	}
	if !c.IsSet("sink") {
		cfg, err := simConfig(c, "sim-", s.worker.Pool.Capacity)
		if err != nil {
			return nil, usageError(err)
		}
		sim, err := sinksim.New(cfg)
		if err != nil {
			return nil, usageError(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("start embedded sink emulator: %w", err)
		}
		stop := httpserver.Background(ctx, ln, sim.Handler(), httpserver.DefaultDrain)
		e.closers = append(e.closers, func() {
			if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
				s.log.Warn("embedded sink emulator stopped with an error", "err", err)
			}
		})
		s.sinkURL = "http://" + ln.Addr().String()
	}
	s.log.Info("embedded services started", "brokers", s.worker.Brokers, "redis", s.redis, "sink", s.sinkURL)
	return e, nil
}
