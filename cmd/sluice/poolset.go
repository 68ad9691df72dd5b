package main

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/lease"
)

// poolSetCommand is `sluice pool set`: a live change of a pool's capacity
// or partitions.
func poolSetCommand() *cli.Command {
	return &cli.Command{
		Name:  "set",
		Usage: "change a pool's capacity or partitions while its workers run",
		Description: "Stores the new definition with a switch instant: a decrease at once (250 ms ahead, before\n" +
			"the next second), a raise --switch-after from now (default: one renewal interval, a third of\n" +
			"the lease TTL). Every worker learns of it at once (or at its next keep-alive) and switches at\n" +
			"that instant, so the workers together never exceed the old capacity before it nor the new one\n" +
			"after it. Start new workers with the new values, or with --pool-definition apply.",
		Flags: slices.Concat(redisFlags(), []cli.Flag{
			stringFlag("pool", "default", "pool `name`"),
			floatFlag("capacity", 0, "new capacity in `units/s` (0: unchanged)"),
			intFlag("partitions", 0, "new number of partitions (0: unchanged)"),
			durationFlag("switch-after", 0, "when a raise takes effect, from now (default: a third of the lease TTL, at least 1s); a decrease takes effect at once"),
		}, logFlags()),
		OnUsageError: onUsageError,
		Action: func(c *cli.Context) error {
			capacity, partitions := c.Float64("capacity"), c.Int("partitions")
			switch {
			case capacity == 0 && partitions == 0:
				return usageError(errors.New("pool set: give --capacity, --partitions or both"))
			case capacity < 0:
				return usageError(fmt.Errorf("--capacity: must be > 0 (got %v)", capacity))
			case partitions < 0:
				return usageError(fmt.Errorf("--partitions: must be ≥ 1 (got %d)", partitions))
			}
			ctx, clients, done, err := poolRedis(c)
			if err != nil {
				return err
			}
			defer done()
			name := c.String("pool")
			lead := c.Duration("switch-after")
			if lead == 0 {
				st, err := lease.Status(ctx, clients[0], "", name)
				if err != nil {
					return poolError(err)
				}
				lead = max(st.Pool.TTL/3, time.Second)
			}
			now := time.Now()
			var next lease.Pool
			for _, rc := range clients {
				var err error
				if next, err = lease.SetPool(ctx, rc, "", name, capacity, partitions, lead, now); err != nil {
					return poolError(err)
				}
			}
			fmt.Fprintf(c.App.Writer, "pool %s: %s from %s (was capacity %v, %d partitions)\n",
				name, next, next.Switch.At.Format(time.RFC3339Nano), next.Switch.Capacity, next.Switch.Partitions)
			return nil
		},
	}
}

// poolError makes a pool's definition errors usage errors (exit 2).
func poolError(err error) error {
	if errors.Is(err, lease.ErrNoPool) || errors.Is(err, lease.ErrInvalidPool) || errors.Is(err, lease.ErrSwitchPending) || errors.Is(err, lease.ErrPoolMismatch) {
		return usageError(err)
	}
	return err
}
