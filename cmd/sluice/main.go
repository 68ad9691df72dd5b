// Command sluice drains Kafka into throttled services at exactly their
// provisioned rate. See `sluice --help`.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/urfave/cli/v2"
)

// Exit codes.
const (
	exitOK          = 0 // done; every record delivered
	exitFailure     = 1 // a runtime failure (service unreachable, I/O error)
	exitUsage       = 2 // a bad flag, argument, file or pool definition
	exitDeadLetters = 3 // bulk-load finished, but some records were dead-lettered
	exitBelowTarget = 4 // stress: the partition's ceiling is below --target
	// exitInterrupted: a bulk load stopped by Ctrl-C or SIGTERM before it
	// finished (128 + SIGINT, as shells report it); a rerun resumes.
	exitInterrupted = 130
)

func main() { os.Exit(run(os.Args, os.Stdin, os.Stdout, os.Stderr)) }

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app := newApp(stdout, stderr)
	app.Reader = stdin
	err := app.RunContext(ctx, args)
	if code, ok := app.Metadata[metaExit].(int); ok {
		return code // an unknown command, already reported
	}
	if err == nil {
		return exitOK
	}
	code, msg := exitFailure, err.Error()
	var exit cli.ExitCoder
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	}
	if msg != "" {
		if log, ok := app.Metadata[metaJSONLog].(*slog.Logger); ok {
			log.Error("sluice failed", "err", msg, "exit_code", code)
		} else {
			fmt.Fprintln(stderr, "sluice:", msg)
		}
	}
	return code
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:  "sluice",
		Usage: "drain Kafka into a throttled service at exactly its provisioned rate",
		Description: "sluice workers share a throttled service's capacity through expiring leases on\n" +
			"capacity partitions kept in Redis, release work in 200 ms slices, commit Kafka\n" +
			"offsets only once the sink acknowledged them, and dead-letter what can never be\n" +
			"written. Every flag can also be set by the environment variable shown beside it,\n" +
			"or by a key of the YAML file --config names (flags and variables win over the file).\n\n" +
			"Exit codes: 0 done, 1 runtime failure, 2 bad usage or configuration,\n" +
			"3 bulk-load finished with dead-lettered records, 4 stress found a ceiling below\n" +
			"its --target, 130 a bulk load interrupted by Ctrl-C or SIGTERM (a rerun resumes).",
		Version:              versionString(),
		Writer:               stdout,
		ErrWriter:            stderr,
		HideHelpCommand:      true,
		EnableBashCompletion: true,
		Suggest:              true,
		OnUsageError:         onUsageError,
		CommandNotFound:      commandNotFound,
		Commands: []*cli.Command{
			workerCommand(),
			bulkLoadCommand(),
			produceCommand(),
			sinkSimCommand(),
			poolCommand(),
			apiCommand(),
			stressCommand(),
			dlqCommand(),
		},
		ExitErrHandler: func(*cli.Context, error) {}, // run() reports errors and picks the exit code
	}
	withConfigFiles(app.Commands)
	return app
}

// App.Metadata keys: metaExit is an exit code decided outside an error (an
// unknown command); metaJSONLog is the command's logger with --log-format
// json, through which run reports the command's error.
const (
	metaExit    = "exit"
	metaJSONLog = "json-log"
)

// commandNotFound reports an unknown command, with the closest one there
// is, and makes the exit code 2 (bad usage).
func commandNotFound(c *cli.Context, name string) {
	msg := fmt.Sprintf("sluice: unknown command %q", name)
	commands := c.App.Commands
	if c.Command != nil && len(c.Command.Subcommands) > 0 {
		commands = c.Command.Subcommands
	}
	if name == "help" {
		msg += `; use "sluice --help" or "sluice COMMAND --help"`
	} else if suggestion := cli.SuggestCommand(commands, name); suggestion != "" {
		msg += ". " + suggestion
	}
	fmt.Fprintln(c.App.ErrWriter, msg+" (see --help)")
	if c.App.Metadata == nil {
		c.App.Metadata = map[string]any{}
	}
	c.App.Metadata[metaExit] = exitUsage
}

// Set at build time: go build -ldflags "-X main.version=v1.2.3 -X
// main.revision=abc123" (the Dockerfile does).
var version, revision string

// versionString is the module version and VCS revision: the build flags'
// when given, else what the Go toolchain recorded in the binary.
func versionString() string {
	v, rev, dirty := version, revision, false
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if rev == "" {
					rev = s.Value
				}
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	v = cmp.Or(v, "(devel)")
	if rev != "" {
		v += " (" + rev[:min(len(rev), 12)]
		if dirty {
			v += ", modified"
		}
		v += ")"
	}
	return v
}

// usageError marks err as the user's to fix (exit code 2).
func usageError(err error) error { return cli.Exit(err.Error(), exitUsage) }
