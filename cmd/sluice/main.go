// Command sluice drains Kafka into throttled services at exactly their
// provisioned rate. See `sluice --help`.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
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
)

func main() { os.Exit(run(os.Args, os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app := newApp(stdout, stderr)
	err := app.RunContext(ctx, args)
	if err == nil {
		return exitOK
	}
	var exit cli.ExitCoder
	if errors.As(err, &exit) {
		if msg := exit.Error(); msg != "" {
			fmt.Fprintln(stderr, "sluice:", msg)
		}
		return exit.ExitCode()
	}
	fmt.Fprintln(stderr, "sluice:", err)
	return exitFailure
}

func newApp(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:  "sluice",
		Usage: "drain Kafka into a throttled service at exactly its provisioned rate",
		Description: "sluice workers share a throttled service's capacity through expiring leases on\n" +
			"capacity partitions kept in Redis, release work in 200 ms slices, commit Kafka\n" +
			"offsets only once the sink acknowledged them, and dead-letter what can never be\n" +
			"written. Every flag can also be set by the environment variable shown beside it.\n\n" +
			"Exit codes: 0 done, 1 runtime failure, 2 bad usage or configuration,\n" +
			"3 bulk-load finished with dead-lettered records, 4 stress found a ceiling below\n" +
			"its --target.",
		Writer:               stdout,
		ErrWriter:            stderr,
		HideHelpCommand:      true,
		EnableBashCompletion: true,
		OnUsageError:         onUsageError,
		Commands: []*cli.Command{
			workerCommand(),
			bulkLoadCommand(),
			produceCommand(),
			sinkSimCommand(),
			poolCommand(),
			apiCommand(),
			stressCommand(),
		},
		ExitErrHandler: func(*cli.Context, error) {}, // run() reports errors and picks the exit code
	}
}

// usageError marks err as the user's to fix (exit code 2).
func usageError(err error) error { return cli.Exit(err.Error(), exitUsage) }
