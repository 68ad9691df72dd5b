package main

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/recordtype"
)

// typeFlags are the record-type flags shared by api, produce, worker and
// bulk-load.
func typeFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag("types", "", "record types `FILE` (YAML), see examples/types.yaml"),
		stringFlag("type", "", "record type `NAME` from --types; worker: several comma-separated, each drained from its own topic into its own pool"),
	}
}

// recordTypes loads the --type names from --types, in the order given;
// none without --type. Its errors name the flag.
func recordTypes(c *cli.Context) ([]*recordtype.Type, error) {
	names := splitList(c.String("type"))
	if len(names) == 0 {
		return nil, nil
	}
	if c.String("types") == "" {
		return nil, errors.New("--type needs --types FILE")
	}
	types, err := recordtype.Load(c.String("types"))
	if err != nil {
		return nil, err
	}
	out := make([]*recordtype.Type, len(names))
	for i, name := range names {
		if out[i] = types[name]; out[i] == nil {
			return nil, fmt.Errorf("--type %q: not defined in %s", name, c.String("types"))
		}
	}
	return out, nil
}

// oneType is recordTypes for the commands that take at most one type.
func oneType(c *cli.Context) (*recordtype.Type, error) {
	ts, err := recordTypes(c)
	switch {
	case err != nil:
		return nil, err
	case len(ts) > 1:
		return nil, fmt.Errorf("--type: this command takes one record type (got %d)", len(ts))
	case len(ts) == 1:
		return ts[0], nil
	}
	return nil, nil
}

// flagValues reads a command's flags with a record type's values standing in
// for the flags the user did not give: --topic, --id-field, --pool, --cost,
// --sink, --sink-key, --sink-key-strategy, and the pool's definition when
// the types file has one.
type flagValues struct {
	*cli.Context
	typed map[string]any
}

func typedFlags(c *cli.Context, t *recordtype.Type) flagValues {
	f := flagValues{Context: c, typed: map[string]any{}}
	if t == nil {
		return f
	}
	set := func(flag string, v any, given bool) {
		if given && !c.IsSet(flag) {
			f.typed[flag] = v
		}
	}
	set("topic", t.Topic, t.Topic != "")
	set("id-field", t.IDField, t.IDField != "")
	set("pool", t.Pool, t.Pool != "")
	set("cost", t.Cost, t.Cost != "")
	set("sink", t.Sink, t.Sink != "")
	set("sink-key", t.SinkKey.Template, t.SinkKey.Template != "")
	set("sink-key-strategy", t.SinkKey.Strategy, t.SinkKey.Strategy != "")
	if p := t.PoolSpec; p != nil {
		set("capacity", p.Capacity, true)
		set("unit", cmp.Or(p.Unit, string(ingest.UnitRecords)), true)
		set("partitions", p.Partitions, p.Partitions > 0)
		set("lease-ttl", p.LeaseTTL, p.LeaseTTL > 0)
		set("reserved-partitions", p.Reserved, p.Reserved > 0)
		// A pool's class and weight are its worker pods': a bulk load of
		// the type runs at its own --priority (low unless given), below
		// the live traffic the file describes.
		pods := c.Command != nil && c.Command.Name == "worker"
		if pods && p.Priority != "" && c.String("priority") == "" {
			f.typed["priority"] = p.Priority // an empty --priority (an unset chart value) is not given
		} else {
			set("priority", p.Priority, pods && p.Priority != "")
		}
		set("weight", p.Weight, pods && p.Weight > 0)
	}
	return f
}

func typedOr[T any](f flagValues, name string, flag func(string) T) T {
	if v, ok := f.typed[name].(T); ok {
		return v
	}
	return flag(name)
}

func (f flagValues) String(name string) string { return typedOr(f, name, f.Context.String) }
func (f flagValues) Int(name string) int       { return typedOr(f, name, f.Context.Int) }
func (f flagValues) Float64(name string) float64 {
	return typedOr(f, name, f.Context.Float64)
}
func (f flagValues) Duration(name string) time.Duration {
	return typedOr(f, name, f.Context.Duration)
}
