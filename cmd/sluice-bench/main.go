// Command sluice-bench runs sluice's benchmark scenarios (see package
// bench) against embedded Kafka and Redis, or real ones with --real, and
// writes bench/results.json and a PNG chart per scenario. Scenarios 5
// (overhead) and 9 (bulk loads) need a real Kafka: without --real they
// start one with scripts/kafka.sh on --kafka-port (or use the one running
// there). Scenario 10 (the leases' Redis cost) needs a real redis-server
// too: without --real it starts one with scripts/redis.sh on --redis-port
// (or uses the one running there).
//
//	go run ./cmd/sluice-bench [--real --brokers host:port --redis-addr host:port]
//	    [--scenarios 1,2,3] [--reps 3] [--out bench] [--kafka-port 19092]
//	    [--redis-port 16379] [--scale 1] [--cpu-profile cpu.prof]
//
// It exits 0 whatever the numbers are, 1 when a scenario could not run,
// 2 on bad flags.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/bench"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app := &cli.App{
		Name:  "sluice-bench",
		Usage: "run sluice's benchmark scenarios beside the alternatives and report",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "real", Usage: "use the real Kafka and Redis of --brokers and --redis-addr instead of embedded ones"},
			&cli.StringFlag{Name: "brokers", Value: "127.0.0.1:19092", Usage: "Kafka `host:port[,...]` (with --real)", EnvVars: []string{"SLUICE_BENCH_BROKERS"}},
			&cli.StringFlag{Name: "redis-addr", Value: "127.0.0.1:16379", Usage: "Redis `host:port` (with --real)", EnvVars: []string{"SLUICE_BENCH_REDIS_ADDR"}},
			&cli.StringFlag{Name: "scenarios", Value: "1,2,3,4,5,6,7,8,9,10,11,12", Usage: "comma-separated scenario `numbers` to run"},
			&cli.IntFlag{Name: "kafka-port", Value: 19092, Usage: "scenarios 5 and 9 without --real: the `port` of the Kafka broker they start with scripts/kafka.sh (or use, when one runs there)", EnvVars: []string{"SLUICE_BENCH_KAFKA_PORT"}},
			&cli.IntFlag{Name: "redis-port", Value: 16379, Usage: "scenario 10 without --real: the `port` of the redis-server it starts with scripts/redis.sh (or uses, when one runs there)", EnvVars: []string{"SLUICE_BENCH_REDIS_PORT"}},
			&cli.IntFlag{Name: "reps", Value: 3, Usage: "repetitions of every run shorter than 30 s (the tables show the median)"},
			&cli.StringFlag{Name: "out", Value: "bench", Usage: "`directory` for results.json and the charts"},
			&cli.StringFlag{Name: "cpu-profile", Usage: "write a CPU profile of the whole run to `file` (go tool pprof)"},
			&cli.StringFlag{Name: "trace", Usage: "write an execution trace of the whole run to `file` (go tool trace)"},
			&cli.Float64Flag{Name: "scale", Value: 1, Usage: "multiplies the sizes of scenarios 5, 6 and 9 (1: the defaults stated in their notes, 1,000,000 records of 1 KiB for 5)"},
		},
		Action: func(c *cli.Context) error {
			cfg := bench.Config{Real: c.Bool("real"), RedisAddr: c.String("redis-addr"), Reps: c.Int("reps"), Out: c.String("out"), Scale: c.Float64("scale"), KafkaPort: c.Int("kafka-port"), RedisPort: c.Int("redis-port")}
			for _, b := range strings.Split(c.String("brokers"), ",") {
				if b = strings.TrimSpace(b); b != "" {
					cfg.Brokers = append(cfg.Brokers, b)
				}
			}
			for _, s := range strings.Split(c.String("scenarios"), ",") {
				n, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil || n < 1 || n > 12 {
					return cli.Exit(fmt.Sprintf("--scenarios: want numbers 1..12, got %q", s), 2)
				}
				cfg.Scenarios = append(cfg.Scenarios, n)
			}
			if cfg.Reps < 1 {
				return cli.Exit("--reps: must be ≥ 1", 2)
			}
			if path := c.String("cpu-profile"); path != "" {
				f, err := os.Create(path)
				if err != nil {
					return cli.Exit("--cpu-profile: "+err.Error(), 2)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return cli.Exit("--cpu-profile: "+err.Error(), 2)
				}
				defer pprof.StopCPUProfile()
			}
			if path := c.String("trace"); path != "" {
				f, err := os.Create(path)
				if err != nil {
					return cli.Exit("--trace: "+err.Error(), 2)
				}
				defer f.Close()
				if err := trace.Start(f); err != nil {
					return cli.Exit("--trace: "+err.Error(), 2)
				}
				defer trace.Stop()
			}
			if _, err := bench.Run(c.Context, cfg); err != nil {
				return cli.Exit("sluice-bench: "+err.Error(), 1)
			}
			return nil
		},
	}
	if err := app.RunContext(ctx, os.Args); err != nil {
		if ec, ok := err.(cli.ExitCoder); ok {
			fmt.Fprintln(os.Stderr, ec.Error())
			return ec.ExitCode()
		}
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}
