package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
)

// env names the environment variable of a flag: SLUICE_ and the flag's name
// in upper case with dashes as underscores.
func env(name string) []string {
	return []string{"SLUICE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}
}

func stringFlag(name, value, usage string) *cli.StringFlag {
	return &cli.StringFlag{Name: name, Value: value, Usage: usage, EnvVars: env(name)}
}

func intFlag(name string, value int, usage string) *cli.IntFlag {
	return &cli.IntFlag{Name: name, Value: value, Usage: usage, EnvVars: env(name)}
}

func int64Flag(name string, value int64, usage string) *cli.Int64Flag {
	return &cli.Int64Flag{Name: name, Value: value, Usage: usage, EnvVars: env(name)}
}

func floatFlag(name string, value float64, usage string) *cli.Float64Flag {
	return &cli.Float64Flag{Name: name, Value: value, Usage: usage, EnvVars: env(name)}
}

func durationFlag(name string, value time.Duration, usage string) *cli.DurationFlag {
	return &cli.DurationFlag{Name: name, Value: value, Usage: usage, EnvVars: env(name)}
}

func boolFlag(name, usage string) *cli.BoolFlag {
	return &cli.BoolFlag{Name: name, Usage: usage, EnvVars: env(name)}
}

const (
	catConnect  = "Connections:"
	catKafka    = "Kafka:"
	catRedis    = "Redis:"
	catPool     = "Capacity pool:"
	catPipeline = "Pipeline:"
	catLog      = "Logging:"
	catInput    = "Input:"
	catSim      = "Embedded sink emulator (bulk-load --embedded):"
)

func inCategory(cat string, flags ...cli.Flag) []cli.Flag {
	for _, f := range flags {
		switch f := f.(type) {
		case *cli.StringFlag:
			f.Category = cat
		case *cli.IntFlag:
			f.Category = cat
		case *cli.Int64Flag:
			f.Category = cat
		case *cli.Float64Flag:
			f.Category = cat
		case *cli.DurationFlag:
			f.Category = cat
		case *cli.BoolFlag:
			f.Category = cat
		}
	}
	return flags
}

// connectionFlags are the flags of the commands that drain a topic into a
// sink: Kafka, Redis and the sink.
func connectionFlags() []cli.Flag {
	return slices.Concat(kafkaFlags(), redisFlags(), inCategory(catConnect,
		stringFlag("sink", "", "the throttled sink, as a `URL` whose scheme selects it: "+sink.URLForms+"; see --sink-method and --sink-body for REST APIs (required; bulk-load --embedded: an in-process emulator)"),
	))
}

func logFlags() []cli.Flag {
	return inCategory(catLog,
		stringFlag("log-level", "info", "log level: debug, info, warn or error"),
		stringFlag("log-format", "text", "log format: text or json"),
	)
}

// poolFlags are the pool flags of a command whose workers run in priority
// class priority unless --priority says otherwise.
func poolFlags(priority lease.Priority) []cli.Flag {
	return inCategory(catPool,
		stringFlag("pool", "default", "capacity pool `name` (one per throttled resource)"),
		stringFlag("capacity", "", "pool capacity (required): a number of `units/s`; sink (read it from the sink and follow its changes: a DynamoDB table's WCU, a REST API's RateLimit headers); or probe (find it: start at --capacity-floor, raise while the sink does not throttle, settle a margin below the onset)"),
		floatFlag("capacity-floor", 0, "with --capacity sink or probe: the least capacity in `units/s`, where a probe starts (0: 100 for a probe, none for sink)"),
		floatFlag("capacity-ceiling", 0, "with --capacity sink or probe: the most capacity in `units/s` (0: none)"),
		durationFlag("capacity-every", 0, "with --capacity sink or probe: how often the pool's capacity is decided, once for all its workers (0: 30s reading the sink, 2s probing)"),
		floatFlag("probe-margin", 0, "with --capacity probe: how far below the onset of throttling the capacity settles, a `fraction` (0: 0.03)"),
		durationFlag("probe-reprobe", 0, "with --capacity probe: how long the capacity stays settled before the probe raises it again, slowly (0: 10m)"),
		stringFlag("pool-definition", string(lease.DefinitionAdopt), "when the pool is defined differently in Redis: adopt (run with a definition changed live, refuse other differences), apply (change the pool live to this worker's definition: lower at once, raise at a switch instant; for GitOps), or refuse"),
		stringFlag("unit", "records", "what capacity counts: records, bytes (payload bytes) or cost"),
		stringFlag("cost", "1", "cost `rule` of a record when --unit cost: N units per record (e.g. 10 RU per write) or N/KiB (N units per started KiB of payload)"),
		intFlag("partitions", lease.DefaultPartitions, "capacity partitions the pool is split into; each is leased whole"),
		durationFlag("lease-ttl", lease.DefaultTTL, "lease time-to-live; renewed at a third of it"),
		intFlag("reserved-partitions", 0, "partitions this worker holds for its lifetime whatever its demand; the rest are shared on demand"),
		stringFlag("priority", priority.String(), "priority `class` in the pool: high, normal or low; the pool meets a higher class's demand first and lower classes share what is left (worker: normal, bulk-load: low, so a backfill runs below live traffic)"),
		intFlag("weight", lease.DefaultWeight, "weight inside the priority class: members of one class with backlogs split its share in proportion to their weights (a positive integer)"),
		stringFlag("ramp", "", "ramp-up preset for new key ranges: gcs (1,000 units/s doubling every 20 min, Cloud Storage) or firestore (500 ×1.5 every 5 min); the --ramp-* flags override its fields"),
		floatFlag("ramp-start", 0, "ramp-up: effective rate at the start, `units/s` (0: no ramp)"),
		floatFlag("ramp-factor", 0, "ramp-up: the effective rate is multiplied by this every --ramp-period (> 1)"),
		durationFlag("ramp-period", 0, "ramp-up: how often the effective rate grows by --ramp-factor"),
		durationFlag("ramp-idle-reset", lease.DefaultIdleReset, "ramp-up: the ramp starts over after the pool has had no demand this long"),
	)
}

func pipelineFlags() []cli.Flag {
	return inCategory(catPipeline,
		stringFlag("topic", "", "Kafka `topic` of the record type, dead letters going to <topic>.dlq (worker: required, or a --type that names it; bulk-load: default records)"),
		stringFlag("group", "", "Kafka consumer group (default sluice-<topic>)"),
		stringFlag("id-field", "", "JSON field or CSV column holding the record ID (idempotency key); default: a content hash"),
		stringFlag("sink-key", "", "sink key `TEMPLATE` of record fields, e.g. {net}/{time}/{id}: the key the sink stores a record under (default: its ID)"),
		stringFlag("sink-key-strategy", "none", "how --sink-key is spread over a range-partitioned sink's key ranges: none, hash-prefix:N, reverse, bit-reverse, uuid4 or shard:N"),
		durationFlag("slice", ingest.DefaultSlice, "pacing slice: work is released every slice, spread evenly over it"),
		durationFlag("send-guard", pacing.DefaultGuard, "least time a send stays in the pacer's one-second account beyond its answer's arrival, which already bounds when the sink accepted it (the floor of the send-to-accept allowance)"),
		intFlag("batch-size", ingest.DefaultMaxBatch, "most records per sink request"),
		intFlag("concurrency", ingest.DefaultConcurrency, "most sink requests in flight at once"),
		int64Flag("max-in-flight-bytes", ingest.DefaultMaxInFlightBytes, "most `bytes` of records fetched but not finished (key, value and ID, plus 256 per record); fetching pauses at this many, which bounds memory"),
		intFlag("max-in-flight", 0, "most records fetched but not finished, besides --max-in-flight-bytes; 0: no count of its own"),
		durationFlag("request-timeout", ingest.DefaultRequestTimeout, "deadline of every sink write; the lease safety margin covers it and the sink's own timeouts must fit in it"),
		durationFlag("grace", ingest.DefaultGrace, "on SIGTERM, how long in-flight writes may finish"),
		durationFlag("max-retry-after", ingest.DefaultMaxRetryAfter, "cap on how long a sink's Retry-After holds writes back (a paused sink, a throttled key range, a retried record): a sink that asks for an hour is probed again after this"),
		intFlag("max-attempts", sink.DefaultMaxAttempts, "write attempts per record the sink answers retryable before it is dead-lettered (throttling and failures of whole requests never count)"),
		durationFlag("ready-after", ingest.DefaultReadyAfter, "how long a failure (sink paused, dead-letter topic or Kafka unreachable) lasts before /readyz reports not ready"),
		durationFlag("stall-timeout", 0, "give up (exit 1) when such a failure lasts this long; 0: never (bulk-load: --sink-timeout)"),
	)
}

func simFlags(prefix string) []cli.Flag {
	cat := catSim
	if prefix == "" {
		cat = "Emulator:"
	}
	return inCategory(cat,
		floatFlag(prefix+"capacity", 0, "provisioned rate in `units/s` (bulk-load --embedded: default the pool capacity)"),
		stringFlag(prefix+"mode", "bucket", "rate enforcement: bucket (one second of capacity, like a per-second RU budget) or window (strict sliding 1 s)"),
		durationFlag(prefix+"latency", 0, "added latency per request"),
		floatFlag(prefix+"error-rate", 0, "fraction of records answered 503 (0..1)"),
		stringFlag(prefix+"required-fields", "", "comma-separated fields every record must have, else 400"),
		stringFlag(prefix+"charge", "", "charge records by this cost `rule` (N or N/KiB, unit cost) instead of the cost the client sends, and report it"),
		floatFlag(prefix+"charge-factor", 1, "multiply the --"+prefix+"charge rule by this (e.g. 1.2: the service charges 20 % over the estimate)"),
		intFlag(prefix+"partition-limit", 0, "range partitions: keys are cut into lexicographic ranges of this many `ops/s` each, on top of the capacity (2000: Azure Tables' and OSS's figure; 0: off)"),
		durationFlag(prefix+"split-after", sinksim.DefaultSplitAfter, "range partitions: a range hot this long splits at the median of its recent keys (stands in for a store's few minutes)"),
		intFlag(prefix+"max-partitions", sinksim.DefaultMaxPartitions, "range partitions: the most ranges"),
	)
}

// printJSON writes v to the command's output as indented JSON (--json).
func printJSON(c *cli.Context, v any) error {
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		log := slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts))
		// run reports the command's error through it too, so that
		// every line on stderr is JSON.
		if c.App.Metadata == nil {
			c.App.Metadata = map[string]any{}
		}
		c.App.Metadata[metaJSONLog] = log
		return log, nil
	}
	return nil, fmt.Errorf("--log-format: want text or json, got %q", c.String("log-format"))
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func topicPartitionsFlag() cli.Flag {
	return intFlag("topic-partitions", 6, "partitions of the topic when sluice creates it (an existing topic is left as it is)")
}
