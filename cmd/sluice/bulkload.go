package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/recordtype"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/worker"
)

func bulkLoadCommand() *cli.Command {
	return &cli.Command{
		Name:      "bulk-load",
		Usage:     "load CSV or NDJSON files through Kafka into the sink, at the pool's rate, and report",
		ArgsUsage: "FILE|GLOB|DIR|- ...",
		Description: "Reads every input as a stream (files, quoted globs, the .csv/.ndjson/.jsonl files of a\n" +
			"directory, or - for standard input; gzip and zstd by extension or --compression), one load\n" +
			"with one summary. Checks first that the sink answers and that the ID field and the sink\n" +
			"key's fields are in every input. Produces every record to the topic (rows that cannot be\n" +
			"produced go to <topic>.dlq with file:line), drains it with --workers in-process workers\n" +
			"in the topic's consumer group (running worker pods help) from the first record\n" +
			"acknowledged on, and finishes when the group has committed every produced offset.\n" +
			"Memory stays bounded whatever the inputs' size (except --order interleave). A rerun of\n" +
			"the same command after a crash produces only what was not produced before (not for\n" +
			"standard input, which cannot be read again). With a --type whose JSON Schema declares\n" +
			"column types, CSV fields are converted to them. With --embedded, Kafka, Redis and the\n" +
			"sink emulator run in-process unless --brokers, --redis-addr or --sink are given; the\n" +
			"in-process broker keeps every record in memory, so inputs over --embedded-max-input\n" +
			"are refused with the command to run against real services instead.\n\n" +
			"Exit codes: 0 every record delivered; 1 the sink stayed unavailable for --sink-timeout,\n" +
			"or no worker drained the topic, or a service failed (the load resumes on a rerun);\n" +
			"2 bad usage, or a field the file does not have; 3 records were dead-lettered, or more\n" +
			"than --max-dead-letters (the load stopped).",
		Flags: slices.Concat(connectionFlags(), poolFlags(lease.PriorityLow), pipelineFlags(), sinkFlags(), typeFlags(), inputFlags(), []cli.Flag{
			intFlag("workers", 1, "in-process workers, each with its own consumer and lease manager (as separate pods); 0: only produce, and report what worker pods of the group drain"),
			boolFlag("embedded", "run in-process Kafka, Redis and sink emulator for what no flag gives, a record type's sink included (nothing to install; for demos and inputs of a few hundred MiB at most)"),
			intFlag("embedded-max-input", embeddedMaxInputMiB, "with --embedded, refuse inputs over this many `MiB` (compressed files count 4 times their size), since the in-process broker keeps every record in memory (about 10 times the CSV size); warn over a quarter of it; 0: no limit"),
			stringFlag("order", "file", "produce order: file, or interleave (consecutive records from different key ranges of the sink key, so a range-partitioned sink is not written at one end; reads the whole input into memory)"),
			durationFlag("sink-timeout", 5*time.Minute, "give up (exit 1, nothing dead-lettered, the rest left for a rerun) when the sink stays unavailable this long, or, with --workers 0, when no worker drains the topic"),
			stringFlag("max-dead-letters", bulkload.DefaultDeadLetterLimit.String(), "stop producing (exit 3) once more records than this are dead-lettered: a count, a share of the rows read (at least 100), or none"),
			stringFlag("dead-letter-file", "", "also write every dead letter to this NDJSON `FILE`, once each across reruns (default with --embedded, since the in-process broker's dead-letter topic does not outlive it: <topic>.dlq.ndjson beside --summary-json, else under .sluice/)"),
			memoryLimitFlag(),
			boolFlag("no-resume", "produce the whole input again even when an earlier run of the same load got part of the way (and skip reading the files once more for the load's identity)"),
			kafkaCompressionFlag(),
			topicPartitionsFlag(),
			stringFlag("summary-json", "", "write the summary as JSON to this `FILE`"),
			dryRunFlag(),
			metricsFlag(),
		}, simFlags("sim-"), logFlags()),
		OnUsageError: onUsageError,
		Action:       bulkLoad,
	}
}

func bulkLoad(c *cli.Context) error {
	if c.NArg() == 0 {
		return usageError(errors.New("bulk-load needs at least one input: FILE, a quoted GLOB, a DIR, or - for standard input"))
	}
	var screen *bulkload.Screen
	if f, ok := c.App.ErrWriter.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		// The progress bar and the log lines share the terminal: logs
		// go above the bar.
		screen = bulkload.NewScreen(f)
		c.App.ErrWriter = screen
	}
	s, err := readSettings(c)
	if err != nil {
		return usageError(err)
	}
	if !c.Bool("embedded") {
		if err := requireSink(s); err != nil {
			return usageError(fmt.Errorf("%w, or --embedded for an in-process emulator", err))
		}
	}
	workers := c.Int("workers")
	if workers < 0 {
		return usageError(fmt.Errorf("--workers: must be ≥ 0 (got %d)", workers))
	}
	limit, err := bulkload.ParseDeadLetterLimit(c.String("max-dead-letters"))
	if err != nil {
		return usageError(fmt.Errorf("--max-dead-letters: %w", err))
	}
	in, rows, err := loadInput(c, s)
	if err != nil {
		return err
	}
	defer in.Close()
	ctx := c.Context
	deadLetterPath := c.String("dead-letter-file")
	inProcess := false // a service keeps the load's records in this process's memory
	if c.Bool("embedded") {
		emb, err := startEmbedded(ctx, c, &s)
		if err != nil {
			return err
		}
		defer emb.close()
		deadLetterPath = cmp.Or(deadLetterPath, defaultDeadLetterFile(c.String("summary-json"), s.worker.Topic))
		inProcess = !c.IsSet("brokers") || !c.IsSet("sink")
	}
	setMemoryLimit(c, inProcess, workers, cmp.Or(s.worker.MaxInFlightBytes, ingest.DefaultMaxInFlightBytes), s.log)
	loadID, workerPrefix, err := bulkload.Identity(in, s.worker.Topic, !c.Bool("no-resume"), s.log)
	if err != nil {
		return err
	}
	reg, col, err := newMetrics(c)
	if err != nil {
		return err
	}
	counters, start := new(ingest.Counters), make(chan struct{})
	job := worker.Job{Config: s.worker, SinkURL: s.sinkURL, Sink: s.sinkOpts, Workers: workers, TopicPartitions: c.Int("topic-partitions"),
		// The same load's workers keep their IDs across runs, so a rerun
		// after a crash takes over its own leases at once.
		WorkerID: func(i int) string { return fmt.Sprintf("bulk-%s-%d", workerPrefix, i) }}
	job.Config.Counters, job.Config.LeaseAhead, job.Config.Start = counters, true, start
	job.Config.StallTimeout = cmp.Or(job.Config.StallTimeout, c.Duration("sink-timeout"))
	setup := worker.Setup{Redis: s.redis, Jobs: []worker.Job{job}, Preflight: true, Definition: s.define, Metrics: col, Logger: s.log}
	if deadLetterPath != "" {
		f := bulkload.NewDeadLetterFile(deadLetterPath)
		defer f.Close()
		setup.DeadLetterCopy = f
	}
	if c.Bool("dry-run") {
		return dryRunLoad(c, setup, s, in, rows, loadID)
	}
	proc, err := worker.Start(ctx, setup)
	if err != nil {
		return startError(err)
	}
	defer proc.Close()
	// The load polls offsets and the group every 200 ms: one transport
	// for all of it.
	admin := proc.Admin.Shared(s.worker.Topic)
	defer admin.Close()
	producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: s.worker.Brokers, Conn: s.worker.Kafka, Topics: []string{s.worker.Topic}, RoundRobin: true, Compression: c.String("kafka-compression"), Logger: s.log})
	if err != nil {
		return usageError(fmt.Errorf("--kafka-compression: %w", err))
	}
	defer producer.Close()
	pool := proc.Jobs[0].Config.Pool
	cfg := bulkload.Config{
		Topic: s.worker.Topic, Group: s.worker.Group, Capacity: pool.Capacity, Unit: pool.Unit, Pool: pool.Name,
		IDField: s.worker.IDField, LoadID: loadID, MaxDeadLetters: limit, SinkTimeout: c.Duration("sink-timeout"), Logger: s.log,
		DuplicatesUnknown: duplicatesUnknown(s), Screen: screen,
	}
	if pool.Source.On() && len(proc.Workers[0]) > 0 {
		lm := proc.Workers[0][0].Lease()
		cfg.CapacityNow = func() float64 { return lm.Pool().Capacity }
	}
	ports := bulkload.Ports{File: rows, Producer: producer, DeadLetters: proc.DeadLetters, Offsets: admin, Counters: counters, Start: start,
		SinkError: func() string { return proc.SinkError(0) }}
	ports.Sink = sinkStats(proc.Sink(0), proc.Jobs[0].SinkURL)
	if loadID != "" {
		ports.Progress = bulkload.RedisProgress{Client: proc.Redis[0]}
	}
	for _, w := range proc.Workers[0] {
		ports.Workers = append(ports.Workers, w)
	}
	load, err := bulkload.New(cfg, ports)
	if err != nil {
		return err
	}
	var summary bulkload.Summary
	err = withMetrics(ctx, c.String("metrics-addr"), reg, proc.Ready, func(ctx context.Context) (err error) {
		summary, err = load.Run(ctx)
		return err
	})
	return reportLoad(c, summary, err, s.worker.Topic, deadLetterPath)
}

// deadLetterDir is where --embedded keeps its dead letters without
// --summary-json: a folder of the working directory that .gitignore's
// ".sluice/" pattern (docs/bulk-loads.md) covers.
const deadLetterDir = ".sluice"

// defaultDeadLetterFile is --embedded's --dead-letter-file:
// <topic>.dlq.ndjson next to the summary, else under deadLetterDir.
func defaultDeadLetterFile(summary, topic string) string {
	dir := deadLetterDir
	if summary != "" {
		dir = filepath.Dir(summary)
	}
	return filepath.Join(dir, topic+".dlq.ndjson")
}

// loadInput opens the inputs (checking the fields the settings read, and,
// with --embedded, their size), in the --order asked for; in is closed by
// the caller.
func loadInput(c *cli.Context, s settings) (_ *bulkload.Input, rows bulkload.Rows, err error) {
	in, err := openInput(c, s.worker.IDField, s.rtype, wantedFields(s))
	if err != nil {
		return nil, nil, usageError(err)
	}
	defer func() {
		if err != nil {
			_ = in.Close()
		}
	}()
	if c.Bool("embedded") {
		if err := checkEmbeddedSize(c, in, s.log); err != nil {
			return nil, nil, err
		}
	}
	switch order := c.String("order"); order {
	case "file":
		return in, in, nil
	case "interleave":
		keyOf := func(rec ingest.Record) (string, error) { return rec.ID, nil }
		if s.sinkKey != nil {
			keyOf = func(rec ingest.Record) (string, error) { return s.sinkKey.Key(rec.Value) }
		}
		if rows, err = bulkload.Interleave(in, keyOf, 0); err != nil {
			return nil, nil, usageError(err)
		}
		return in, rows, nil
	default:
		return nil, nil, usageError(fmt.Errorf("--order: want file or interleave, got %q", order))
	}
}

// dryRunLoad checks a load as worker.Start would bring it up (storing,
// creating and writing nothing), reads the input through, and prints what
// would run.
func dryRunLoad(c *cli.Context, setup worker.Setup, s settings, in *bulkload.Input, rows bulkload.Rows, loadID string) error {
	setup.DryRun = true
	proc, err := worker.Start(c.Context, setup)
	if err != nil {
		return dryRunError(startError(err))
	}
	defer proc.Close()
	n, err := countRows(rows)
	if err != nil {
		return dryRunError(err)
	}
	printPlan(c.App.Writer, proc, []settings{s})
	return dryRunError(printLoadPlan(c, proc, in, n, loadID))
}

// reportLoad prints the summary (and writes it to --summary-json) with the
// load's outcome and exit code, and returns the outcome as the command's
// exit.
func reportLoad(c *cli.Context, summary bulkload.Summary, err error, topic, deadLetterPath string) error {
	exit := loadExit(c, summary, err, topic, deadLetterPath)
	code, msg := exitOK, ""
	if exit != nil {
		code, msg = exitFailure, exit.Error()
		var ec cli.ExitCoder
		if errors.As(exit, &ec) {
			code = ec.ExitCode()
		}
	}
	if summary.Outcome == "" {
		summary.Outcome = map[int]string{exitOK: bulkload.OutcomeFinished, exitDeadLetters: bulkload.OutcomeStopped,
			exitInterrupted: bulkload.OutcomeInterrupted}[code]
		if summary.Outcome == "" {
			summary.Outcome = bulkload.OutcomeFailed
		}
		if code == exitDeadLetters && !errors.Is(err, bulkload.ErrTooManyDeadLetters) {
			summary.Outcome = bulkload.OutcomeFinished // every record done, some dead-lettered
		}
		summary.Message = msg
	}
	summary.ExitCode = code
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
	return exit
}

// loadExit maps a load's end to the command's exit: 3 for dead letters,
// 130 when a signal interrupted it, 1 for other failures.
func loadExit(c *cli.Context, summary bulkload.Summary, err error, topic, deadLetterPath string) error {
	switch {
	case errors.Is(err, bulkload.ErrTooManyDeadLetters):
		return cli.Exit(strings.TrimPrefix(err.Error(), "bulkload: "), exitDeadLetters)
	case err != nil && c.Context.Err() != nil && errors.Is(err, context.Canceled):
		return cli.Exit(fmt.Sprintf("interrupted (%v) before the load finished; rerun the same command to resume", context.Cause(c.Context)), exitInterrupted)
	case err != nil:
		return err
	case summary.RecordsDeadLettered > 0:
		where := queue.DeadLetterTopic(topic)
		if deadLetterPath != "" {
			where += " and " + deadLetterPath
		}
		return cli.Exit(fmt.Sprintf("%d records were dead-lettered to %s", summary.RecordsDeadLettered, where), exitDeadLetters)
	}
	return nil
}

// duplicatesUnknown reports whether the sink cannot tell a record it had
// already: a REST API with no --sink-duplicate-on statuses.
func duplicatesUnknown(s settings) bool {
	return strings.HasPrefix(s.sinkURL, "rest+") && s.sinkOpts.REST.Status.DuplicateOn.Empty()
}

// sinkStats is the sink's statistics for the summary: the emulator's
// (http:// and https://) with its 200 ms series, so that a load at a
// shared emulator reports its own peaks; another sink's when it keeps
// any; nil otherwise.
func sinkStats(opened ingest.Sink, sinkURL string) ingest.StatsSink {
	st, ok := opened.(ingest.StatsSink)
	if !ok {
		return nil
	}
	if strings.HasPrefix(sinkURL, "http://") || strings.HasPrefix(sinkURL, "https://") {
		return bulkload.EmulatorStats{StatsSink: st, URL: sinkURL}
	}
	return st
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

// embeddedMaxInputMiB is --embedded-max-input's default: kfake holds 1.8
// GiB for 1,000,000 USGS rows (190 MB of CSV), so 256 MiB of input is
// about 2.5 GiB of memory.
const embeddedMaxInputMiB = 256

// checkEmbeddedSize refuses, with --embedded, an input over
// --embedded-max-input (bulkload.Input.CheckEmbedded), naming the command
// that loads it through real services, and warns over a quarter of the
// limit or when the size is unknown (standard input).
func checkEmbeddedSize(c *cli.Context, in *bulkload.Input, log *slog.Logger) error {
	if c.IsSet("brokers") {
		return nil // the broker is not in-process
	}
	mib, warn, err := in.CheckEmbedded(int64(c.Int("embedded-max-input")))
	switch {
	case err != nil:
		return usageError(fmt.Errorf("--embedded: the input is about %.1f MiB (uncompressed estimate), over --embedded-max-input %d MiB: "+
			"the in-process Kafka broker keeps every record in memory (about 10 times the CSV size). Load it through real services instead:\n  %s",
			mib, c.Int("embedded-max-input"), realServicesCommand(c)))
	case warn && mib == 0:
		log.Warn("--embedded: the size of standard input is unknown; the in-process Kafka broker keeps every record in memory (about 10 times the CSV size); for large inputs use real services",
			"instead", realServicesCommand(c))
	case warn:
		log.Warn("--embedded: a large input for the in-process Kafka broker, which keeps every record in memory (about 10 times the CSV size)",
			"input_mib", math.Round(mib*10)/10, "limit_mib", c.Int("embedded-max-input"), "instead", realServicesCommand(c))
	}
	return nil
}

// realServicesCommand is the command line of this bulk-load without
// --embedded, against the Kafka and Redis that scripts/kafka.sh and
// scripts/redis.sh start (and a sink emulator of its own, when the
// embedded one stood in for the sink).
func realServicesCommand(c *cli.Context) string {
	var b strings.Builder
	b.WriteString("scripts/kafka.sh start; scripts/redis.sh start; ")
	if !c.IsSet("sink") {
		fmt.Fprintf(&b, "sluice sink-sim --capacity %s & ", c.String("capacity"))
	}
	b.WriteString("sluice bulk-load")
	names := c.FlagNames()
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if name == "embedded" || name == "embedded-max-input" {
			continue
		}
		switch v := c.Value(name).(type) {
		case bool:
			if v {
				b.WriteString(" --" + name)
			}
		default:
			fmt.Fprintf(&b, " --%s %s", name, shellQuote(fmt.Sprint(v)))
		}
	}
	if !c.IsSet("brokers") {
		b.WriteString(" --brokers 127.0.0.1:19092")
	}
	if !c.IsSet("redis-addr") {
		b.WriteString(" --redis-addr 127.0.0.1:16379")
	}
	if !c.IsSet("sink") {
		b.WriteString(" --sink http://127.0.0.1:8088")
	}
	for _, arg := range c.Args().Slice() {
		b.WriteString(" " + shellQuote(arg))
	}
	return b.String()
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == '/' || r == ':' || r == '=' || r == ',' || r == '@' || r == '%' ||
			(r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// inputFlags are the flags of the commands that read input files.
func inputFlags() []cli.Flag {
	return inCategory(catInput,
		stringFlag("format", "", "input format: csv or ndjson (default: each file's from its extension, .csv, .ndjson or .jsonl; standard input needs it)"),
		stringFlag("compression", bulkload.CompressionAuto, "input compression: auto (by the extension, .gz, .zst or .zstd, else by the first bytes), none, gzip or zstd"),
		stringFlag("csv-types", "string", "what CSV fields become where no --type schema declares their type: string, or auto (JSON number literals become numbers, true and false booleans); empty fields are null"),
	)
}

func kafkaCompressionFlag() cli.Flag {
	return stringFlag("kafka-compression", "lz4", "compression of the record batches sent to Kafka: none, gzip, snappy, lz4 or zstd")
}

// inputSettingFlag names the flag of each bulkload.SettingError's setting.
var inputSettingFlag = map[string]string{"Format": "--format", "Compression": "--compression", "IDField": "--id-field"}

// openInput opens the command's input arguments as its flags say, with
// the record type's column types and schema (t may be nil), and checks
// that every input has the ID field and the fields in want
// (bulkload.Input.CheckFields). Its errors name the flag to change.
func openInput(c *cli.Context, idField string, t *recordtype.Type, want map[string]string) (*bulkload.Input, error) {
	auto, err := bulkload.ParseCSVTypes(c.String("csv-types"))
	if err != nil {
		return nil, fmt.Errorf("--csv-types: %w", err)
	}
	cfg := bulkload.InputConfig{
		Format:      c.String("format"),
		Compression: c.String("compression"),
		IDField:     idField,
		CSV:         bulkload.CSVTypes{Auto: auto},
		Stdin:       c.App.Reader,
	}
	if t != nil {
		cfg.CSV.Columns = t.FieldTypes()
		cfg.Validate = t.Validate // a row its type refuses goes to the DLQ with file:line
	}
	in, err := bulkload.Open(c.Args().Slice(), cfg)
	if err == nil {
		if err = in.CheckFields(want); err == nil {
			return in, nil
		}
		_ = in.Close()
	}
	if se := (*bulkload.SettingError)(nil); errors.As(err, &se) && inputSettingFlag[se.Setting] != "" {
		return nil, fmt.Errorf("%s: %w", inputSettingFlag[se.Setting], se.Err)
	}
	return nil, err
}

func produceCommand() *cli.Command {
	return &cli.Command{
		Name:      "produce",
		Usage:     "produce CSV or NDJSON files' records to a topic (no draining)",
		ArgsUsage: "FILE|GLOB|DIR|- ...",
		Description: "Reads the inputs as streams (as bulk-load does: files, quoted globs, directories, - for\n" +
			"standard input, gzip or zstd), keeps many batches on their way to Kafka at once, and counts\n" +
			"a record produced once every in-sync replica has it. Rows that cannot be produced go to\n" +
			"<topic>.dlq with file:line.",
		Flags: slices.Concat(kafkaFlags(), []cli.Flag{
			stringFlag("topic", "records", "Kafka `topic`"),
			stringFlag("id-field", "", "JSON field or CSV column holding the record ID"),
			topicPartitionsFlag(),
			kafkaCompressionFlag(),
			memoryLimitFlag(),
		}, inputFlags(), typeFlags(), logFlags()),
		OnUsageError: onUsageError,
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return usageError(errors.New("produce needs at least one input: FILE, a quoted GLOB, a DIR, or - for standard input"))
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
			in, err := openInput(c, f.String("id-field"), t, nil)
			if err != nil {
				return usageError(err)
			}
			defer in.Close()
			setMemoryLimit(c, false, 0, 0, log)
			if err := checkKafka(c.Context, brokers, conn); err != nil {
				return err
			}
			topic := f.String("topic")
			if err := (queue.Admin{Brokers: brokers, Conn: conn}).EnsureTopics(c.Context, topic, c.Int("topic-partitions")); err != nil {
				return err
			}
			producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: brokers, Conn: conn, Topics: []string{topic}, Compression: c.String("kafka-compression"), Logger: log})
			if err != nil {
				return usageError(fmt.Errorf("--kafka-compression: %w", err))
			}
			defer producer.Close()
			dlq, err := queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: brokers, Conn: conn, Topics: []string{queue.DeadLetterTopic(topic)}, Logger: log})
			if err != nil {
				return err
			}
			defer dlq.Close()
			p, err := bulkload.Produce(c.Context, in, producer, dlq, bulkload.ProduceConfig{Topic: topic, IDField: f.String("id-field"), Logger: log})
			fmt.Fprintf(c.App.Writer, "read %d rows: produced %d records to %s, %d rows to %s.dlq", p.Read, p.Produced, topic, p.DeadLettered, topic)
			if p.DuplicateIDs > 0 {
				fmt.Fprintf(c.App.Writer, "; %d rows repeat an earlier row's ID (e.g. %v)", p.DuplicateIDs, p.DuplicateIDExamples)
			}
			fmt.Fprintf(c.App.Writer, "; %.2f s, %.0f rows/s\n", p.Elapsed.Seconds(), float64(p.Read)/max(p.Elapsed.Seconds(), 1e-9))
			if len(p.Files) > 1 {
				for _, fc := range p.Files {
					fmt.Fprintf(c.App.Writer, "  %s: %d rows, %d produced, %d dead-lettered\n", fc.Name, fc.Rows, fc.Produced, fc.DeadLettered)
				}
			}
			return err
		},
	}
}
