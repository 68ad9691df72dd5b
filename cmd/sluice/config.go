package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
	"go.yaml.in/yaml/v3"
)

// configFlag is --config: a YAML file of flag values, keys named as the
// flags (without dashes in front).
func configFlag() cli.Flag {
	return stringFlag("config", "", "YAML `FILE` of flag values, keys named as the flags (capacity: 2000, sink: http://sink:8088, ...); flags and SLUICE_* variables override it; see examples/*.yaml")
}

// withConfigFiles gives every command with flags (subcommands included)
// --config: its other flags can come from a YAML file too, through
// urfave/cli's altsrc. A key that names no flag of the command, or a value
// of the wrong type, is a usage error naming the file and the key.
func withConfigFiles(cmds []*cli.Command) {
	for _, cmd := range cmds {
		withConfigFiles(cmd.Subcommands)
		if len(cmd.Flags) == 0 || cmd.Action == nil {
			continue
		}
		flags := make([]cli.Flag, 0, len(cmd.Flags)+1)
		for _, f := range cmd.Flags {
			flags = append(flags, fileFlag(f))
		}
		cmd.Flags = append(flags, configFlag())
		before := cmd.Before
		cmd.Before = func(c *cli.Context) error {
			if err := applyConfig(c, cmd.Flags); err != nil {
				return usageError(err)
			}
			if before != nil {
				return before(c)
			}
			return nil
		}
	}
}

// fileFlag wraps f so that altsrc can set it from the file.
func fileFlag(f cli.Flag) cli.Flag {
	switch f := f.(type) {
	case *cli.StringFlag:
		return altsrc.NewStringFlag(f)
	case *cli.IntFlag:
		return altsrc.NewIntFlag(f)
	case *cli.Int64Flag:
		return altsrc.NewInt64Flag(f)
	case *cli.Float64Flag:
		return altsrc.NewFloat64Flag(f)
	case *cli.DurationFlag:
		return altsrc.NewDurationFlag(f)
	case *cli.BoolFlag:
		return altsrc.NewBoolFlag(f)
	}
	return f
}

// applyConfig reads --config, when given, and sets the flags it names
// that no flag on the command line and no SLUICE_* variable set.
func applyConfig(c *cli.Context, flags []cli.Flag) error {
	path := c.String("config")
	if path == "" {
		return nil
	}
	values, err := readConfig(path, flags)
	if err != nil {
		return err
	}
	return altsrc.InitInputSourceWithContext(flags, func(*cli.Context) (altsrc.InputSourceContext, error) {
		return altsrc.NewMapInputSource(path, values), nil
	})(c)
}

// readConfig reads a config file into the values altsrc expects of each
// flag's type, checking that every key names a flag.
func readConfig(path string, flags []cli.Flag) (map[any]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	byName := map[string]cli.Flag{}
	var names []string
	for _, f := range flags {
		for _, n := range f.Names() {
			byName[n] = f
		}
		names = append(names, f.Names()[0])
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := map[any]any{}
	for _, key := range keys {
		f, ok := byName[key]
		if !ok || key == "config" {
			msg := fmt.Sprintf("--config %s: %q is not a flag of this command", path, key)
			if s := cli.SuggestFlag(flags, key, true); s != "" && key != "config" {
				msg += fmt.Sprintf(" (did you mean %q?)", strings.TrimLeft(s, "-"))
			}
			return nil, errors.New(msg)
		}
		v, err := configValue(f, doc[key])
		if err != nil {
			return nil, fmt.Errorf("--config %s: %s: %w", path, key, err)
		}
		out[key] = v
	}
	return out, nil
}

// configValue converts a YAML value to what altsrc wants for f: a
// string for string flags (numbers are taken as written), an int, a
// float64, a duration's text or a bool.
func configValue(f cli.Flag, v any) (any, error) {
	switch f.(type) {
	case *altsrc.StringFlag, *cli.StringFlag:
		switch v := v.(type) {
		case string:
			return v, nil
		case int, float64, bool:
			return fmt.Sprint(v), nil
		case []any: // a list: comma-separated, as the flag takes it
			parts := make([]string, len(v))
			for i, p := range v {
				parts[i] = fmt.Sprint(p)
			}
			return strings.Join(parts, ","), nil
		}
		return nil, fmt.Errorf("want a string, got %v", v)
	case *altsrc.IntFlag, *altsrc.Int64Flag, *cli.IntFlag, *cli.Int64Flag:
		switch v := v.(type) {
		case int:
			return v, nil
		case float64:
			if v == math.Trunc(v) {
				return int(v), nil
			}
		case string:
			if n, err := strconv.Atoi(v); err == nil {
				return n, nil
			}
		}
		return nil, fmt.Errorf("want a whole number, got %v", v)
	case *altsrc.Float64Flag, *cli.Float64Flag:
		switch v := v.(type) {
		case int:
			return float64(v), nil
		case float64:
			return v, nil
		case string:
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				return x, nil
			}
		}
		return nil, fmt.Errorf("want a number, got %v", v)
	case *altsrc.DurationFlag, *cli.DurationFlag:
		if s, ok := v.(string); ok {
			return s, nil
		}
		if n, ok := v.(int); ok && n == 0 {
			return "0s", nil
		}
		return nil, fmt.Errorf("want a duration such as 15s or 2m, got %v", v)
	case *altsrc.BoolFlag, *cli.BoolFlag:
		if b, ok := v.(bool); ok {
			return b, nil
		}
		return nil, fmt.Errorf("want true or false, got %v", v)
	}
	return nil, fmt.Errorf("cannot be set from a file")
}
