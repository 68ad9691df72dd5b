package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/worker"
)

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
		Flags: slices.Concat(connectionFlags(), poolFlags(), pipelineFlags(), sinkFlags(), typeFlags(), []cli.Flag{
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
	file, err := bulkload.OpenFile(c.Args().First(), c.String("format"), s.worker.IDField)
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
	brokers, conn := s.worker.Brokers, s.worker.Kafka
	if err := checkKafka(ctx, brokers, conn); err != nil {
		return err
	}
	clients, err := connectRedis(ctx, s.redis)
	if err != nil {
		return err
	}
	defer closeAll(clients)
	if err := ensurePool(ctx, &s, clients); err != nil {
		return err
	}
	admin := queue.Admin{Brokers: brokers, Conn: conn}
	// At least one partition per worker, or a worker would hold leases
	// with nothing to consume.
	if err := ensureTopics(ctx, admin, s.worker.Topic, max(c.Int("topic-partitions"), workers)); err != nil {
		return err
	}
	target, err := sink.Open(ctx, s.sinkURL, s.sinkOpts)
	if err != nil {
		return err
	}
	defer target.Close()
	statsSink, _ := target.(ingest.StatsSink)
	producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: brokers, Conn: conn, RoundRobin: true})
	if err != nil {
		return err
	}
	defer producer.Close()
	dlq, err := queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: brokers, Conn: conn})
	if err != nil {
		return err
	}
	defer dlq.Close()

	reg, col, err := newMetrics(c)
	if err != nil {
		return err
	}
	counters := new(ingest.Counters)
	start := make(chan struct{})
	var runners []ingest.Runner
	var built []*worker.Worker
	for i := range workers {
		cfg := s.worker
		cfg.Redis, cfg.Sink, cfg.DeadLetters, cfg.Counters, cfg.Metrics = clients, target, dlq, counters, col
		cfg.WorkerID = fmt.Sprintf("bulk-%d-%d", os.Getpid(), i)
		cfg.LeaseAhead, cfg.Start = true, start
		w, err := worker.New(cfg)
		if err != nil {
			return usageError(err)
		}
		runners, built = append(runners, w), append(built, w)
	}
	started := false
	defer func() {
		if !started { // the load never ran them
			for _, w := range built {
				_ = w.Close()
			}
		}
	}()
	cfg := bulkload.Config{Topic: s.worker.Topic, Group: s.worker.Group, Capacity: s.worker.Pool.Capacity, Unit: s.worker.Pool.Unit, Logger: s.log}
	if f, ok := c.App.ErrWriter.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		cfg.Bar = f
	}
	load, err := bulkload.New(cfg, bulkload.Ports{
		File:        rows,
		Producer:    producer,
		DeadLetters: dlq,
		Offsets:     admin,
		Workers:     runners,
		Counters:    counters,
		Rate: func(now time.Time) float64 {
			var sum float64
			for _, w := range built {
				sum += w.Lease().Rate(now)
			}
			return sum
		},
		Sink:  statsSink,
		Start: start,
	})
	if err != nil {
		return err
	}
	ready := func(ctx context.Context) error {
		for _, w := range built {
			if err := w.Ready(); err != nil {
				return err
			}
		}
		return admin.Ping(ctx)
	}
	var summary bulkload.Summary
	started = true
	err = withMetrics(ctx, c.String("metrics-addr"), reg, ready, func(ctx context.Context) (err error) {
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
		return cli.Exit(fmt.Sprintf("%d records were dead-lettered to %s.dlq", summary.RecordsDeadLettered, s.worker.Topic), exitDeadLetters)
	}
	return nil
}

func produceCommand() *cli.Command {
	return &cli.Command{
		Name:      "produce",
		Usage:     "produce a CSV or NDJSON file's records to a topic (no draining)",
		ArgsUsage: "FILE",
		Flags: slices.Concat(kafkaFlags(), []cli.Flag{
			stringFlag("topic", "records", "Kafka `topic`"),
			stringFlag("id-field", "", "JSON field or CSV column holding the record ID"),
			stringFlag("format", "", "csv or ndjson (default: from the extension)"),
			topicPartitionsFlag(),
		}, typeFlags(), logFlags()),
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
			brokers, conn, err := kafkaConn(c)
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
			if err := checkKafka(c.Context, brokers, conn); err != nil {
				return err
			}
			topic := f.String("topic")
			if err := ensureTopics(c.Context, queue.Admin{Brokers: brokers, Conn: conn}, topic, c.Int("topic-partitions")); err != nil {
				return err
			}
			producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: brokers, Conn: conn})
			if err != nil {
				return err
			}
			defer producer.Close()
			dlq, err := queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: brokers, Conn: conn})
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
