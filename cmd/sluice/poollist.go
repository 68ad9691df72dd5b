package main

import (
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/lease"
)

// poolListCommand is `sluice pool list`: the pools Redis holds.
func poolListCommand() *cli.Command {
	return &cli.Command{
		Name:         "list",
		Usage:        "list the capacity pools defined in Redis, with their definitions and how many workers announce demand",
		Flags:        slices.Concat(redisFlags(), []cli.Flag{boolFlag("json", "print JSON")}, logFlags()),
		OnUsageError: onUsageError,
		Action: func(c *cli.Context) error {
			ctx, clients, done, err := poolRedis(c)
			if err != nil {
				return err
			}
			defer done()
			pools, err := lease.ListPools(ctx, clients[0], "")
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return printJSON(c, pools)
			}
			if len(pools) == 0 {
				_, err = fmt.Fprintln(c.App.Writer, "no pools: a worker or bulk-load defines its pool (--pool, default \"default\") when it starts")
				return err
			}
			for _, p := range pools {
				fmt.Fprintf(c.App.Writer, "%s  %s, %d workers\n", p.Pool.Name, p.Pool, p.Members)
			}
			return nil
		},
	}
}
