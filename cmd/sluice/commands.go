package main

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/worker"
)

// onUsageError makes a flag or argument error a usage error (exit 2) and,
// for an unknown flag, names the command's closest flag.
func onUsageError(c *cli.Context, err error, _ bool) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok && cli.SuggestFlag != nil {
		flags := c.App.Flags
		if c.Command != nil && c.Command.Name != "" {
			flags = c.Command.Flags
		}
		if suggestion := cli.SuggestFlag(flags, strings.TrimLeft(name, "-"), true); suggestion != "" {
			msg += fmt.Sprintf(". Did you mean %q?", suggestion)
		}
	}
	return cli.Exit(msg+" (see --help)", exitUsage)
}

func workerCommand() *cli.Command {
	return &cli.Command{
		Name:  "worker",
		Usage: "drain a topic into the sink at the leased rate until SIGTERM",
		Description: "Joins the topic's consumer group and the capacity pool, leases a fair share of the\n" +
			"pool's partitions while it has a backlog, and writes at exactly the leased rate.\n" +
			"On SIGTERM it stops fetching, lets in-flight writes finish within --grace, commits\n" +
			"what the sink acknowledged, releases its leases and exits 0.\n" +
			"With --type A,B it serves several record types of --types, each from its own topic\n" +
			"and consumer group into its own pool (the file's \"pools\" section), independently.",
		Flags: slices.Concat(connectionFlags(), poolFlags(lease.PriorityNormal), pipelineFlags(), sinkFlags(), typeFlags(), logFlags(), []cli.Flag{
			stringFlag("worker-id", "", "this worker's ID in the pool (default host-pid-random)"),
			topicPartitionsFlag(),
			dryRunFlag(),
			metricsFlag(),
		}),
		OnUsageError: onUsageError,
		Action:       runWorker,
	}
}

// runWorker drains each record type's topic (one without --type) with its
// own consumer group, lease manager and pacer, sharing the Redis clients,
// the dead-letter writer and a sink per sink URL.
func runWorker(c *cli.Context) error {
	all, err := workerSettings(c)
	if err != nil {
		return usageError(err)
	}
	for _, s := range all {
		if err := cmp.Or(requireTopic(s), requireSink(s)); err != nil {
			return usageError(err)
		}
	}
	reg, col, err := newMetrics(c)
	if err != nil {
		return err
	}
	jobs := make([]worker.Job, len(all))
	for i, s := range all {
		jobs[i] = worker.Job{Config: s.worker, SinkURL: s.sinkURL, Sink: s.sinkOpts, Workers: 1, TopicPartitions: c.Int("topic-partitions")}
		if id := c.String("worker-id"); id != "" && len(all) > 1 {
			jobs[i].Config.WorkerID = id + "-" + s.typeName
		} else {
			jobs[i].Config.WorkerID = id
		}
	}
	if c.Bool("dry-run") {
		proc, err := worker.Start(c.Context, worker.Setup{Redis: all[0].redis, Jobs: jobs, DryRun: true, Logger: all[0].log})
		if err != nil {
			return dryRunError(startError(err))
		}
		defer proc.Close()
		printPlan(c.App.Writer, proc, all)
		return nil
	}
	proc, err := worker.Start(c.Context, worker.Setup{Redis: all[0].redis, Jobs: jobs, Definition: all[0].define, Metrics: col, Logger: all[0].log})
	if err != nil {
		return startError(err)
	}
	defer proc.Close()
	for i, job := range proc.Jobs {
		all[i].log.Info("worker started", "type", all[i].typeName, "topic", job.Config.Topic, "group", job.Config.Group, "pool", job.Config.Pool.Name)
	}
	err = withMetrics(c.Context, c.String("metrics-addr"), reg, proc.Ready, proc.Run)
	for i, ws := range proc.Workers {
		for _, w := range ws {
			logStopped(all[i].log, w)
		}
	}
	return err
}

// logStopped logs what a worker did before it stopped: its records, and
// how its pacer released the leased capacity (budget granted and spent,
// sends the account held, the send-to-accept allowance planned with), so
// that a pod's last lines say why a run fell short of the capacity.
func logStopped(log *slog.Logger, w *worker.Worker) {
	t, st := w.Counters().Totals(), w.Pacer().Stats()
	var mean time.Duration
	if t.Latencies > 0 {
		mean = t.LatencySum / time.Duration(t.Latencies)
	}
	log.Info("worker stopped",
		"delivered", t.Delivered, "duplicates", t.Duplicates, "dead_lettered", t.DeadLettered,
		"requests", t.Requests, "retried", t.Retried, "throttled", t.Throttled,
		"slices", st.Slices, "budget_units", st.Budget, "spent_units", st.Spent,
		"held_sends", st.Held, "held_for", st.HeldFor.Round(time.Millisecond),
		"guard_min", st.GuardMin, "guard_max", st.GuardMax,
		"latency_mean", mean, "latency_p99", t.LatencyP99, "latency_max", t.LatencyMax)
}

func sinkSimCommand() *cli.Command {
	return &cli.Command{
		Name:  "sink-sim",
		Usage: "run the throttled sink emulator (rehearse loads against a provisioned rate)",
		Description: "Serves POST /v1/records (a JSON array of {id, cost, value}), enforces --capacity\n" +
			"units/s, answers 429 with Retry-After when over it, dedupes by record ID, and serves\n" +
			"GET /v1/stats: accepted, throttled, duplicates and the most units accepted in any\n" +
			"sliding 1 s and 200 ms window. With --partition-limit it also keeps keys in\n" +
			"lexicographic ranges with their own ops/s limit that split when hot, like a\n" +
			"range-partitioned store, and reports each range.",
		Flags:        slices.Concat([]cli.Flag{stringFlag("listen", "127.0.0.1:8088", "`address` to serve on"), stringFlag("unit", "records", "records, bytes or cost")}, simFlags(""), logFlags()),
		OnUsageError: onUsageError,
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return usageError(err)
			}
			cfg, err := simConfig(c, "", 0)
			if err != nil {
				return usageError(err)
			}
			sim, err := sinksim.New(cfg)
			if err != nil {
				return usageError(err)
			}
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return usageError(fmt.Errorf("--listen: %w", err))
			}
			log.Info("sink emulator listening", "addr", ln.Addr().String(), "capacity_units_per_s", cfg.Capacity, "mode", cfg.Mode)
			return httpserver.Serve(c.Context, ln, sim.Handler(), httpserver.DefaultDrain)
		},
	}
}

// simConfig reads the emulator flags (prefix "sim-" on bulk-load);
// capacity is the default when --<prefix>capacity is 0.
func simConfig(c *cli.Context, prefix string, capacity float64) (sinksim.Config, error) {
	unit, err := ingest.ParseUnit(c.String("unit"))
	if err != nil {
		return sinksim.Config{}, fmt.Errorf("--unit: %w", err)
	}
	cfg := sinksim.Config{
		Capacity:       int64(c.Float64(prefix + "capacity")),
		Mode:           c.String(prefix + "mode"),
		Unit:           unit,
		Latency:        c.Duration(prefix + "latency"),
		ErrorRate:      c.Float64(prefix + "error-rate"),
		RequiredFields: splitList(c.String(prefix + "required-fields")),
		Seed:           time.Now().UnixNano(),
		PartitionLimit: int64(c.Int(prefix + "partition-limit")),
		SplitAfter:     c.Duration(prefix + "split-after"),
		MaxPartitions:  c.Int(prefix + "max-partitions"),
	}
	if rule := c.String(prefix + "charge"); rule != "" {
		charge, err := ingest.ParseCost(unit, rule)
		if err != nil {
			return cfg, fmt.Errorf("--%scharge: %w", prefix, err)
		}
		cfg.Charge, cfg.ChargeFactor = &charge, c.Float64(prefix+"charge-factor")
		if !(cfg.ChargeFactor > 0) {
			return cfg, fmt.Errorf("--%scharge-factor: must be > 0 (got %v)", prefix, cfg.ChargeFactor)
		}
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = int64(capacity)
	}
	if cfg.Capacity <= 0 {
		return cfg, fmt.Errorf("--%scapacity: the emulator's provisioned rate in %s/s must be > 0", prefix, unit)
	}
	return cfg, nil
}

func poolCommand() *cli.Command {
	return &cli.Command{
		Name:  "pool",
		Usage: "inspect and change capacity pools",
		Subcommands: []*cli.Command{poolSetCommand(), poolListCommand(), {
			Name:         "status",
			Usage:        "show a pool's definition and one line per worker: its partitions, demand and backlog",
			Flags:        slices.Concat(redisFlags(), []cli.Flag{stringFlag("pool", "default", "pool `name`"), boolFlag("json", "print JSON")}, logFlags()),
			OnUsageError: onUsageError,
			Action: func(c *cli.Context) error {
				ctx, clients, done, err := poolRedis(c)
				if err != nil {
					return err
				}
				defer done()
				st, err := lease.Status(ctx, clients[0], "", c.String("pool"))
				if err != nil {
					return poolError(err) // an unknown pool is exit 2
				}
				if c.Bool("json") {
					return printJSON(c, st)
				}
				_, err = fmt.Fprint(c.App.Writer, strings.TrimLeft(st.String(), "\n"))
				return err
			},
		}},
	}
}
