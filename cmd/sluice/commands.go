package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"
	"golang.org/x/term"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
)

func onUsageError(_ *cli.Context, err error, _ bool) error {
	return cli.Exit(err.Error()+" (see --help)", exitUsage)
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
		Flags: concat(connectionFlags(), poolFlags(), pipelineFlags(), sinkFlags(), typeFlags(), logFlags(), []cli.Flag{
			stringFlag("worker-id", "", "this worker's ID in the pool (default host-pid-random)"),
			topicPartitionsFlag(),
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
	clients := redisClients(all[0].redisAddrs)
	defer closeAll(clients)
	dlq, err := queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: all[0].brokers})
	if err != nil {
		return err
	}
	defer dlq.Close()
	reg, col, err := newMetrics(c)
	if err != nil {
		return err
	}
	sinks := map[string]ingest.Sink{}
	var stacks []ingest.Runner
	for _, s := range all {
		if err := ensurePool(c.Context, s, clients); err != nil {
			return err
		}
		if err := ensureTopics(c.Context, s.brokers, s.topic, c.Int("topic-partitions")); err != nil {
			return err
		}
		if sinks[s.sinkURL] == nil {
			opened, err := sink.Open(c.Context, s.sinkURL, sinkOptions(c, s.log, s.requestTimeout))
			if err != nil {
				return err
			}
			defer opened.Close()
			sinks[s.sinkURL] = opened
		}
		id := c.String("worker-id")
		if id != "" && len(all) > 1 {
			id += "-" + s.typeName
		}
		stack, _, err := workerStack(s, clients, shared{sink: sinks[s.sinkURL], dlq: dlq, counters: new(ingest.Counters), metrics: col}, id, nil)
		if err != nil {
			return err
		}
		stacks = append(stacks, stack)
		s.log.Info("worker started", "type", s.typeName, "topic", s.topic, "group", s.group, "pool", s.pool.Name)
	}
	return withMetrics(c.Context, c.String("metrics-addr"), reg, all[0].brokers, func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		for _, stack := range stacks {
			g.Go(func() error { return stack.Run(ctx) })
		}
		return g.Wait()
	})
}

func bulkLoadCommand() *cli.Command {
	return &cli.Command{
		Name:      "bulk-load",
		Usage:     "load a CSV or NDJSON file through Kafka into the sink, at the pool's rate, and report",
		ArgsUsage: "FILE",
		Description: "Produces every record of FILE to the topic (malformed rows go to <topic>.dlq with\n" +
			"file:line), drains it with --workers in-process workers in the topic's consumer\n" +
			"group (running worker pods help), and finishes when the group has committed every\n" +
			"produced offset. With --embedded, Kafka, Redis and the sink emulator run in-process\n" +
			"unless --brokers, --redis-addr or --sink are given.",
		Flags: concat(connectionFlags(), poolFlags(), pipelineFlags(), sinkFlags(), typeFlags(), []cli.Flag{
			intFlag("workers", 1, "in-process workers, each with its own consumer and lease manager (as separate pods); 0: only produce, and wait for worker pods of the group to drain"),
			boolFlag("embedded", "run in-process Kafka, Redis and sink emulator for what no flag gives, a record type's sink included (nothing to install)"),
			stringFlag("format", "", "input format: csv or ndjson (default: from the extension)"),
			stringFlag("order", "file", "produce order: file, or interleave (consecutive records from different key ranges of the sink key, so a range-partitioned sink is not written at one end)"),
			topicPartitionsFlag(),
			stringFlag("summary-json", "", "write the summary as JSON to this `FILE`"),
			metricsFlag(),
		}, simFlags("sim-"), logFlags()),
		OnUsageError: onUsageError,
		Action:       bulkLoad,
	}
}

func bulkLoad(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageError(errors.New("bulk-load needs exactly one FILE argument"))
	}
	s, err := readSettings(c)
	if err != nil {
		return usageError(err)
	}
	workers := c.Int("workers")
	if workers < 0 {
		return usageError(fmt.Errorf("--workers: must be ≥ 0 (got %d)", workers))
	}
	file, err := bulkload.OpenFile(c.Args().First(), c.String("format"), s.idField)
	if err != nil {
		return usageError(err)
	}
	var rows bulkload.Rows = file
	switch order := c.String("order"); order {
	case "file":
	case "interleave":
		if rows, err = bulkload.Interleave(file, s.sinkKeyOf, 0); err != nil {
			return usageError(err)
		}
	default:
		return usageError(fmt.Errorf("--order: want file or interleave, got %q", order))
	}
	ctx := c.Context
	if c.Bool("embedded") {
		emb, err := startEmbedded(ctx, c, &s)
		if err != nil {
			return err
		}
		defer emb.close()
	}
	clients := redisClients(s.redisAddrs)
	defer closeAll(clients)
	if err := ensurePool(ctx, s, clients); err != nil {
		return err
	}
	// At least one partition per worker, or a worker would hold leases
	// with nothing to consume.
	if err := ensureTopics(ctx, s.brokers, s.topic, max(c.Int("topic-partitions"), workers)); err != nil {
		return err
	}
	httpSink, err := sink.Open(ctx, s.sinkURL, sinkOptions(c, s.log, s.requestTimeout))
	if err != nil {
		return err
	}
	defer httpSink.Close()
	statsSink, _ := httpSink.(ingest.StatsSink)
	producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: s.brokers, RoundRobin: true})
	if err != nil {
		return err
	}
	defer producer.Close()
	dlq, err := queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: s.brokers})
	if err != nil {
		return err
	}
	defer dlq.Close()

	reg, col, err := newMetrics(c)
	if err != nil {
		return err
	}
	sh := shared{sink: httpSink, dlq: dlq, counters: new(ingest.Counters), metrics: col}
	start := make(chan struct{})
	var stacks []ingest.Runner
	var managers []*lease.Manager
	for i := range workers {
		stack, mgr, err := workerStack(s, clients, sh, fmt.Sprintf("bulk-%d-%d", os.Getpid(), i), start)
		if err != nil {
			return err
		}
		stacks, managers = append(stacks, stack), append(managers, mgr)
	}
	cfg := bulkload.Config{Topic: s.topic, Group: s.group, Capacity: s.pool.Capacity, Unit: s.pool.Unit, Logger: s.log}
	if f, ok := c.App.ErrWriter.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		cfg.Bar = f
	}
	load, err := bulkload.New(cfg, bulkload.Ports{
		File:        rows,
		Producer:    producer,
		DeadLetters: dlq,
		Offsets:     queue.Admin{Brokers: s.brokers},
		Workers:     stacks,
		Counters:    sh.counters,
		Rate: func(now time.Time) float64 {
			var sum float64
			for _, m := range managers {
				sum += m.Rate(now)
			}
			return sum
		},
		Sink:  statsSink,
		Start: start,
	})
	if err != nil {
		return err
	}
	var summary bulkload.Summary
	err = withMetrics(ctx, c.String("metrics-addr"), reg, s.brokers, func(ctx context.Context) (err error) {
		summary, err = load.Run(ctx)
		return err
	})
	summary.WriteText(c.App.Writer)
	if path := c.String("summary-json"); path != "" {
		data, jerr := json.MarshalIndent(summary, "", "  ")
		if jerr == nil {
			jerr = os.WriteFile(path, append(data, '\n'), 0o644)
		}
		if jerr != nil {
			return fmt.Errorf("--summary-json: %w", jerr)
		}
	}
	if err != nil {
		return err
	}
	if summary.RecordsDeadLettered > 0 {
		return cli.Exit(fmt.Sprintf("%d records were dead-lettered to %s.dlq", summary.RecordsDeadLettered, s.topic), exitDeadLetters)
	}
	return nil
}

func produceCommand() *cli.Command {
	return &cli.Command{
		Name:         "produce",
		Usage:        "produce a CSV or NDJSON file's records to a topic (no draining)",
		ArgsUsage:    "FILE",
		Flags:        concat(inCategory(catConnect, stringFlag("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers, `host:port[,host:port...]`")), []cli.Flag{stringFlag("topic", "records", "Kafka `topic`"), stringFlag("id-field", "", "JSON field or CSV column holding the record ID"), stringFlag("format", "", "csv or ndjson (default: from the extension)"), topicPartitionsFlag()}, typeFlags(), logFlags()),
		OnUsageError: onUsageError,
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError(errors.New("produce needs exactly one FILE argument"))
			}
			t, err := oneType(c)
			if err != nil {
				return usageError(err)
			}
			f := typedFlags(c, t)
			log, err := newLogger(c)
			if err != nil {
				return usageError(err)
			}
			file, err := bulkload.OpenFile(c.Args().First(), c.String("format"), f.String("id-field"))
			if err != nil {
				return usageError(err)
			}
			if t != nil {
				file.Validate = t.Validate // a row its type refuses goes to the DLQ with file:line
			}
			brokers, topic := splitList(c.String("brokers")), f.String("topic")
			if err := ensureTopics(c.Context, brokers, topic, c.Int("topic-partitions")); err != nil {
				return err
			}
			producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: brokers})
			if err != nil {
				return err
			}
			defer producer.Close()
			dlq, err := queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: brokers})
			if err != nil {
				return err
			}
			defer dlq.Close()
			n, bad, err := bulkload.Produce(c.Context, file, topic, 0, producer, dlq, log)
			fmt.Fprintf(c.App.Writer, "produced %d records to %s, %d malformed rows to %s.dlq\n", n, topic, bad, topic)
			return err
		},
	}
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
		Flags:        concat([]cli.Flag{stringFlag("listen", "127.0.0.1:8088", "`address` to serve on"), stringFlag("unit", "records", "records, bytes or cost")}, simFlags(""), logFlags()),
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
			return sim.Serve(c.Context, ln)
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
		Subcommands: []*cli.Command{poolSetCommand(), {
			Name:         "status",
			Usage:        "show a pool's definition, its members' demand, and who holds which partition",
			Flags:        concat(inCategory(catConnect, stringFlag("redis-addr", "127.0.0.1:6379", "Redis `host:port`")), []cli.Flag{stringFlag("pool", "default", "pool `name`"), boolFlag("json", "print JSON")}),
			OnUsageError: onUsageError,
			Action: func(c *cli.Context) error {
				clients := redisClients(splitList(c.String("redis-addr"))[:1])
				defer closeAll(clients)
				ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
				defer cancel()
				st, err := lease.Status(ctx, clients[0], "", c.String("pool"))
				if err != nil {
					return err
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
