package main

import (
	"cmp"
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
		Description: "Checks first that the sink answers and that the ID field and the sink key's fields are\n" +
			"in the file. Produces every record of FILE to the topic (rows that cannot be produced go\n" +
			"to <topic>.dlq with file:line), drains it with --workers in-process workers in the\n" +
			"topic's consumer group (running worker pods help) while it is produced, and finishes\n" +
			"when the group has committed every produced offset. A rerun of the same command after\n" +
			"a crash produces only what was not produced before. With --embedded, Kafka, Redis and\n" +
			"the sink emulator run in-process unless --brokers, --redis-addr or --sink are given.\n\n" +
			"Exit codes: 0 every record delivered; 1 the sink stayed unavailable for --sink-timeout,\n" +
			"or no worker drained the topic, or a service failed (the load resumes on a rerun);\n" +
			"2 bad usage, or a field the file does not have; 3 records were dead-lettered, or more\n" +
			"than --max-dead-letters (the load stopped).",
		Flags: slices.Concat(connectionFlags(), poolFlags(), pipelineFlags(), sinkFlags(), typeFlags(), []cli.Flag{
			intFlag("workers", 1, "in-process workers, each with its own consumer and lease manager (as separate pods); 0: only produce, and report what worker pods of the group drain"),
			boolFlag("embedded", "run in-process Kafka, Redis and sink emulator for what no flag gives, a record type's sink included (nothing to install)"),
			stringFlag("format", "", "input format: csv or ndjson (default: from the extension)"),
			stringFlag("order", "file", "produce order: file, or interleave (consecutive records from different key ranges of the sink key, so a range-partitioned sink is not written at one end)"),
			durationFlag("sink-timeout", 5*time.Minute, "give up (exit 1, nothing dead-lettered, the rest left for a rerun) when the sink stays unavailable this long, or, with --workers 0, when no worker drains the topic"),
			stringFlag("max-dead-letters", bulkload.DefaultDeadLetterLimit.String(), "stop producing (exit 3) once more records than this are dead-lettered: a count, a share of the rows read (at least 100), or none"),
			stringFlag("dead-letter-file", "", "also write every dead letter to this NDJSON `FILE` (default with --embedded: <topic>.dlq.ndjson, which outlives the in-process broker)"),
			boolFlag("no-resume", "produce the whole file again even when an earlier run of the same load got part of the way"),
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
	limit, err := bulkload.ParseDeadLetterLimit(c.String("max-dead-letters"))
	if err != nil {
		return usageError(fmt.Errorf("--max-dead-letters: %w", err))
	}
	file, err := bulkload.OpenFile(c.Args().First(), c.String("format"), s.worker.IDField)
	if err != nil {
		return usageError(err)
	}
	if err := bulkload.CheckFields(file.Fields(), wantedFields(s)); err != nil {
		return usageError(err)
	}
	var rows bulkload.Rows = file
	switch order := c.String("order"); order {
	case "file":
	case "interleave":
		keyOf := func(rec ingest.Record) (string, error) { return rec.ID, nil }
		if s.sinkKey != nil {
			keyOf = func(rec ingest.Record) (string, error) { return s.sinkKey.Key(rec.Value) }
		}
		if rows, err = bulkload.Interleave(file, keyOf, 0); err != nil {
			return usageError(err)
		}
	default:
		return usageError(fmt.Errorf("--order: want file or interleave, got %q", order))
	}
	ctx := c.Context
	deadLetterPath := c.String("dead-letter-file")
	if c.Bool("embedded") {
		emb, err := startEmbedded(ctx, c, &s)
		if err != nil {
			return err
		}
		defer emb.close()
		deadLetterPath = cmp.Or(deadLetterPath, s.worker.Topic+".dlq.ndjson")
	}
	brokers, conn := s.worker.Brokers, s.worker.Kafka
	if err := checkKafka(ctx, brokers, conn); err != nil {
		return err
	}
	clients, err := connectRedis(ctx, s.redis, s.log)
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
	if err := preflightSink(ctx, target, s); err != nil {
		return err
	}
	statsSink, _ := target.(ingest.StatsSink)
	producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: brokers, Conn: conn, RoundRobin: true, Logger: s.log})
	if err != nil {
		return err
	}
	defer producer.Close()
	kafkaDLQ, err := queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: brokers, Conn: conn, Logger: s.log})
	if err != nil {
		return err
	}
	defer kafkaDLQ.Close()
	var dlq ingest.DeadLetters = kafkaDLQ
	if deadLetterPath != "" {
		f := bulkload.NewDeadLetterFile(deadLetterPath)
		defer f.Close()
		dlq = bulkload.Tee{f, kafkaDLQ}
	}

	loadID := bulkload.LoadID(s.worker.Topic, file.Digest())
	reg, col, err := newMetrics(c)
	if err != nil {
		return err
	}
	counters := new(ingest.Counters)
	start := make(chan struct{})
	var runners []ingest.Runner // the workers the load runs
	var built []*worker.Worker
	defer func() {
		if len(runners) == 0 { // the load never ran them
			for _, w := range built {
				_ = w.Close()
			}
		}
	}()
	for i := range workers {
		cfg := s.worker
		cfg.Redis, cfg.Sink, cfg.DeadLetters, cfg.Counters, cfg.Metrics = clients, target, dlq, counters, col
		// The same load's workers keep their IDs across runs, so a rerun
		// after a crash takes over its own leases at once.
		cfg.WorkerID = fmt.Sprintf("bulk-%s-%d", loadID[:8], i)
		cfg.LeaseAhead, cfg.Start = true, start
		cfg.StallTimeout = cmp.Or(cfg.StallTimeout, c.Duration("sink-timeout"))
		w, err := worker.New(cfg)
		if err != nil {
			return usageError(err)
		}
		built = append(built, w)
	}
	cfg := bulkload.Config{
		Topic: s.worker.Topic, Group: s.worker.Group, Capacity: s.worker.Pool.Capacity, Unit: s.worker.Pool.Unit,
		IDField: s.worker.IDField, LoadID: loadID, MaxDeadLetters: limit, SinkTimeout: c.Duration("sink-timeout"), Logger: s.log,
	}
	if f, ok := c.App.ErrWriter.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		cfg.Bar = f
	}
	ports := bulkload.Ports{
		File:        rows,
		Producer:    producer,
		DeadLetters: dlq,
		Offsets:     admin,
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
	}
	if !c.Bool("no-resume") {
		ports.Progress = bulkload.RedisProgress{Client: clients[0]}
	}
	for _, w := range built {
		ports.Workers = append(ports.Workers, w)
	}
	load, err := bulkload.New(cfg, ports)
	if err != nil {
		return err
	}
	runners = ports.Workers
	ready := func(ctx context.Context) error {
		for _, w := range built {
			if err := w.Ready(); err != nil {
				return err
			}
		}
		return admin.Ping(ctx)
	}
	var summary bulkload.Summary
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
	switch {
	case errors.Is(err, bulkload.ErrTooManyDeadLetters):
		return cli.Exit(err.Error(), exitDeadLetters)
	case err != nil:
		return err
	case summary.RecordsDeadLettered > 0:
		where := s.worker.Topic + ".dlq"
		if deadLetterPath != "" {
			where += " and " + deadLetterPath
		}
		return cli.Exit(fmt.Sprintf("%d records were dead-lettered to %s", summary.RecordsDeadLettered, where), exitDeadLetters)
	}
	return nil
}

// wantedFields are the input fields the settings read, by the flag that
// names them: the ID field, the sink key template's fields, and those of a
// REST sink's URL and body templates.
func wantedFields(s settings) map[string]string {
	want := map[string]string{}
	urlFields, bodyFields, _ := sink.TemplateFields(s.sinkURL, s.sinkOpts.REST.Body) // checked by readSettings
	for _, f := range bodyFields {
		want[f] = "--sink-body"
	}
	for _, f := range urlFields {
		want[f] = "--sink"
	}
	if s.sinkKey != nil {
		for _, f := range s.sinkKey.Fields() {
			want[f] = "--sink-key"
		}
	}
	if s.worker.IDField != "" {
		want[s.worker.IDField] = "--id-field"
	}
	return want
}

// preflightSink checks, before anything is produced, that the sink answers
// (opening the connections the workers will use); exit 1 otherwise.
func preflightSink(ctx context.Context, target ingest.Sink, s settings) error {
	w, ok := target.(ingest.Warmer)
	if !ok {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, s.worker.RequestTimeout)
	defer cancel()
	if err := w.Warm(wctx, max(s.worker.Concurrency, 1)); err != nil {
		return fmt.Errorf("--sink %s: %w", sink.Redact(s.sinkURL), err)
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
			producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: brokers, Conn: conn, Logger: log})
			if err != nil {
				return err
			}
			defer producer.Close()
			dlq, err := queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: brokers, Conn: conn, Logger: log})
			if err != nil {
				return err
			}
			defer dlq.Close()
			p, err := bulkload.Produce(c.Context, file, producer, dlq, bulkload.ProduceConfig{Topic: topic, IDField: f.String("id-field"), Logger: log})
			fmt.Fprintf(c.App.Writer, "read %d rows: produced %d records to %s, %d rows to %s.dlq", p.Read, p.Produced, topic, p.DeadLettered, topic)
			if p.DuplicateIDs > 0 {
				fmt.Fprintf(c.App.Writer, "; %d rows repeat an earlier row's ID (e.g. %v)", p.DuplicateIDs, p.DuplicateIDExamples)
			}
			fmt.Fprintln(c.App.Writer)
			return err
		},
	}
}
