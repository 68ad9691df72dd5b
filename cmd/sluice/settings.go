package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/recordtype"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/worker"
)

// settings are the validated flags of worker and bulk-load for one record
// type: the connections, the sink, and the worker.Config every worker of
// the command is built from (its shared parts are filled in later).
type settings struct {
	log      *slog.Logger
	redis    lease.RedisConfig
	define   lease.DefinitionMode
	sinkURL  string
	sinkOpts sink.OpenConfig
	worker   worker.Config
	typeName string              // the --type, "" without
	rtype    *recordtype.Type    // the --type; nil without
	sinkKey  *recordtype.SinkKey // the sink key rule; nil without one
}

// readSettings validates the flags and the --type's values; its errors name
// the flag.
func readSettings(c *cli.Context) (settings, error) {
	t, err := oneType(c)
	if err != nil {
		return settings{}, err
	}
	return settingsFor(c, t)
}

// workerSettings reads the settings of each --type a worker serves (one
// settings without --type). With several types each type's pool comes from
// the types file, so the pool and queue flags must not be given; each type
// gets its own consumer group, <group>-<type> when --group is set.
func workerSettings(c *cli.Context) ([]settings, error) {
	types, err := recordTypes(c)
	if err != nil || len(types) < 2 {
		s, err := readSettings(c)
		return []settings{s}, err
	}
	for _, flag := range []string{"topic", "id-field", "pool", "capacity", "capacity-floor", "capacity-ceiling", "capacity-every", "probe-margin", "probe-reprobe", "unit", "cost", "partitions", "lease-ttl", "reserved-partitions"} {
		if c.IsSet(flag) {
			return nil, fmt.Errorf("--%s: with several --type each type's value comes from %s", flag, c.String("types"))
		}
	}
	out := make([]settings, 0, len(types))
	topics := map[string]string{}
	for _, t := range types {
		if t.PoolSpec == nil {
			return nil, fmt.Errorf("--type %q: pool %q is not defined under \"pools\" in %s (several types need their pools there)", t.Name, t.Pool, c.String("types"))
		}
		if other, dup := topics[t.Topic]; dup {
			return nil, fmt.Errorf("--type: %q and %q share topic %q", other, t.Name, t.Topic)
		}
		topics[t.Topic] = t.Name
		s, err := settingsFor(c, t)
		if err != nil {
			return nil, fmt.Errorf("--type %q: %w", t.Name, err)
		}
		if c.IsSet("group") {
			s.worker.Group = c.String("group") + "-" + t.Name
		}
		out = append(out, s)
	}
	return out, nil
}

// flagOf names the flag of each worker.Config field.
var flagOf = map[string]string{
	"Topic":            "--topic",
	"Slice":            "--slice",
	"Guard":            "--send-guard",
	"MaxBatch":         "--batch-size",
	"Concurrency":      "--concurrency",
	"MaxInFlight":      "--max-in-flight",
	"MaxInFlightBytes": "--max-in-flight-bytes",
	"MaxAttempts":      "--max-attempts",
	"MaxRetryAfter":    "--max-retry-after",
	"Reserved":         "--reserved-partitions",
	"Priority":         "--priority",
	"Weight":           "--weight",
	"Pool.Name":        "--pool",
	"Pool.Capacity":    "--capacity",
	"Pool.Partitions":  "--partitions",
	"Pool.TTL":         "--lease-ttl",
	"Pool.Unit":        "--unit",
	"Pool.Ramp":        "--ramp",
	"Pool.Source":      "--capacity, --capacity-floor, --capacity-ceiling, --capacity-every, --probe-margin, --probe-reprobe",
	"RequestTimeout, Grace, ReadyAfter, StallTimeout": "--request-timeout, --grace, --ready-after, --stall-timeout",
}

// settingsFor validates the flags, with t's values for those not given (t
// may be nil); its errors name the flag.
func settingsFor(cc *cli.Context, t *recordtype.Type) (settings, error) {
	c := typedFlags(cc, t)
	log, err := newLogger(cc)
	if err != nil {
		return settings{}, err
	}
	brokers, kafka, err := kafkaConn(cc)
	if err != nil {
		return settings{}, err
	}
	redisCfg, err := redisConfig(cc)
	if err != nil {
		return settings{}, err
	}
	unit, err := ingest.ParseUnit(c.String("unit"))
	if err != nil {
		return settings{}, fmt.Errorf("--unit: %w", err)
	}
	pricing, err := ingest.ParseCost(unit, c.String("cost"))
	if err != nil {
		return settings{}, fmt.Errorf("--cost: %w", err)
	}
	ramp, err := readRamp(cc)
	if err != nil {
		return settings{}, err
	}
	priority, err := readPriority(c)
	if err != nil {
		return settings{}, err
	}
	weight := c.Int("weight")
	if weight < 1 {
		return settings{}, fmt.Errorf("--weight: must be a positive integer, got %d", weight)
	}
	capacity, source, err := readCapacity(c)
	if err != nil {
		return settings{}, err
	}
	define, err := lease.ParseDefinitionMode(cc.String("pool-definition"))
	if err != nil {
		return settings{}, fmt.Errorf("--pool-definition: %w", err)
	}
	topic := c.String("topic")
	if topic == "" && cc.Command != nil && cc.Command.Name == "bulk-load" {
		topic = defaultLoadTopic
	}
	s := settings{
		log:     log,
		redis:   redisCfg,
		define:  define,
		sinkURL: c.String("sink"),
		worker: worker.Config{
			Brokers:          brokers,
			Kafka:            kafka,
			Topic:            topic,
			Group:            c.String("group"),
			Pool:             lease.Pool{Name: c.String("pool"), Capacity: capacity, Unit: unit, Partitions: c.Int("partitions"), TTL: c.Duration("lease-ttl"), Ramp: ramp, Source: source},
			Reserved:         c.Int("reserved-partitions"),
			Priority:         priority,
			Weight:           weight,
			Pricing:          pricing,
			IDField:          c.String("id-field"),
			Slice:            c.Duration("slice"),
			Guard:            c.Duration("send-guard"),
			RequestTimeout:   c.Duration("request-timeout"),
			Grace:            c.Duration("grace"),
			MaxRetryAfter:    c.Duration("max-retry-after"),
			ReadyAfter:       c.Duration("ready-after"),
			StallTimeout:     c.Duration("stall-timeout"),
			MaxBatch:         c.Int("batch-size"),
			Concurrency:      c.Int("concurrency"),
			MaxInFlight:      c.Int("max-in-flight"),
			MaxInFlightBytes: c.Int64("max-in-flight-bytes"),
			MaxAttempts:      c.Int("max-attempts"),
			Logger:           log,
		},
	}
	s.worker.Group = cmp.Or(s.worker.Group, worker.DefaultGroup(s.worker.Topic))
	if t != nil {
		s.worker.Processor = t.Processor()
		s.typeName, s.rtype = t.Name, t
	}
	if template := c.String("sink-key"); template != "" {
		sk, err := recordtype.NewSinkKey(template, c.String("sink-key-strategy"))
		if err != nil {
			return s, fmt.Errorf("--sink-key, --sink-key-strategy: %w", err)
		}
		s.worker.Processor = ingest.Chain(s.worker.Processor, sk.Processor())
		s.sinkKey = sk
	} else if cc.IsSet("sink-key-strategy") {
		return s, errors.New("--sink-key-strategy: needs --sink-key TEMPLATE")
	}
	check := s.worker
	check.Topic = cmp.Or(check.Topic, "-") // required by the command (requireTopic), named there
	if err := check.Validate(); err != nil {
		if ce := (*worker.ConfigError)(nil); errors.As(err, &ce) && flagOf[ce.Field] != "" {
			return s, fmt.Errorf("%s: %w", flagOf[ce.Field], ce.Err)
		}
		return s, err
	}
	if s.sinkURL != "" {
		if err := sink.CheckURL(s.sinkURL); err != nil {
			return s, fmt.Errorf("--sink: %w; %s", err, "a sink URL looks like "+sink.URLForms)
		}
	}
	if s.sinkOpts, err = sinkOptions(cc, log, s.worker.RequestTimeout); err != nil {
		return s, err
	}
	s.sinkOpts.Unit = unit
	if source.Kind == lease.SourceSink {
		if err := sink.CheckCapacitySource(s.sinkURL, unit, s.sinkOpts.REST.Array); err != nil {
			return s, fmt.Errorf("--capacity sink: %w", err)
		}
	}
	return s, nil
}

// defaultLoadTopic is bulk-load's topic without --topic.
const defaultLoadTopic = "records"

// requireSink says a command needs --sink: the throttled service has no
// default, so that nothing is written to an emulator by mistake.
func requireSink(s settings) error {
	if s.sinkURL == "" {
		return fmt.Errorf("--sink: required: the throttled service to write to (%s)", "a sink URL looks like "+sink.URLForms)
	}
	return nil
}

// requireTopic says the worker command needs --topic (or a --type that
// names one) instead of draining a default topic it would create.
func requireTopic(s settings) error {
	if s.worker.Topic == "" {
		return errors.New("--topic: required: the Kafka topic to drain (or --type NAME with --types FILE, whose record type names it)")
	}
	return nil
}

// readCapacity reads --capacity (a number, sink or probe; a types file's
// pool gives a number) and the capacity source's flags.
func readCapacity(c flagValues) (float64, lease.Source, error) {
	var (
		capacity float64
		kind     lease.SourceKind
		err      error
	)
	if v, ok := c.typed["capacity"].(float64); ok {
		capacity = v
	} else if capacity, kind, err = lease.ParseCapacity(c.String("capacity")); err != nil {
		if c.String("capacity") == "" {
			err = errors.New("required: a number of units/s, sink (read it from the sink) or probe (find it)")
		}
		return 0, lease.Source{}, fmt.Errorf("--capacity: %w", err)
	}
	src := lease.Source{Kind: kind}
	if kind == lease.SourceNumber {
		for _, flag := range []string{"capacity-floor", "capacity-ceiling", "capacity-every", "probe-margin", "probe-reprobe"} {
			if c.IsSet(flag) {
				return 0, src, fmt.Errorf("--%s: only with --capacity sink or probe", flag)
			}
		}
		return capacity, src, nil
	}
	if kind == lease.SourceSink {
		for _, flag := range []string{"probe-margin", "probe-reprobe"} {
			if c.IsSet(flag) {
				return 0, src, fmt.Errorf("--%s: only with --capacity probe", flag)
			}
		}
	}
	src.Floor, src.Ceiling, src.Every = c.Float64("capacity-floor"), c.Float64("capacity-ceiling"), c.Duration("capacity-every")
	src.Margin, src.Reprobe = c.Float64("probe-margin"), c.Duration("probe-reprobe")
	// A placeholder until the pool is defined: the worker reads the sink
	// or starts the probe at its floor.
	capacity = max(src.Floor, src.Ceiling, 1)
	return capacity, src, nil
}

// readPriority reads --priority; empty (an unset chart value, say) is the
// command's default: low for bulk-load, normal otherwise.
func readPriority(c flagValues) (lease.Priority, error) {
	name := c.String("priority")
	if name == "" {
		if c.Command != nil && c.Command.Name == "bulk-load" {
			return lease.PriorityLow, nil
		}
		return lease.PriorityNormal, nil
	}
	p, err := lease.ParsePriority(name)
	if err != nil {
		return p, fmt.Errorf("--priority: %w", err)
	}
	return p, nil
}

// readRamp reads --ramp and the --ramp-* flags; a preset's fields are
// overridden by the flags given.
func readRamp(c *cli.Context) (lease.Ramp, error) {
	var r lease.Ramp
	switch preset := c.String("ramp"); preset {
	case "":
	case "gcs":
		r = lease.RampGCS
	case "firestore":
		r = lease.RampFirestore
	default:
		return r, fmt.Errorf("--ramp: unknown preset %q (want gcs or firestore)", preset)
	}
	if c.IsSet("ramp-start") {
		r.Start = c.Float64("ramp-start")
	}
	if c.IsSet("ramp-factor") {
		r.Factor = c.Float64("ramp-factor")
	}
	if c.IsSet("ramp-period") {
		r.Period = c.Duration("ramp-period")
	}
	if r.On() {
		r.IdleReset = c.Duration("ramp-idle-reset")
	}
	return r, nil
}

// startError maps an error of worker.Start to the command's: one about the
// setup (a setting, a pool defined differently in Redis) is a usage error
// (exit 2) naming the flag where it can; any other is a failure (exit 1).
func startError(err error) error {
	if ce := (*worker.ConfigError)(nil); errors.As(err, &ce) && flagOf[ce.Field] != "" {
		return usageError(fmt.Errorf("%s: %w", flagOf[ce.Field], ce.Err))
	}
	switch {
	case errors.Is(err, lease.ErrInvalidConfig):
		return usageError(fmt.Errorf("--redis-*: %w", err))
	case errors.Is(err, lease.ErrPoolMismatch):
		return usageError(fmt.Errorf("%w.\nWorkers and loads of one throttled service share its pool, and its definition. If this command writes to "+
			"another service, give it a pool of its own with --pool NAME; if the service's capacity changed, change the pool's with "+
			"`sluice pool set --pool NAME --capacity N` (its workers follow) and start this command with the new values, "+
			"or start it with --pool-definition apply, which changes the pool live to its definition", err))
	case errors.Is(err, lease.ErrPoolFlapping):
		return usageError(fmt.Errorf("%w (--pool-definition adopt)", err))
	case errors.Is(err, worker.ErrConfig), errors.Is(err, lease.ErrInvalidPool):
		return usageError(err)
	}
	return err
}

// describeTypes names the types of a worker for its start-up line.
func describeTypes(all []settings) string {
	names := make([]string, 0, len(all))
	for _, s := range all {
		names = append(names, s.typeName)
	}
	return strings.Join(names, ",")
}
