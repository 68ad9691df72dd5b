package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/worker"
)

func dryRunFlag() cli.Flag {
	return boolFlag("dry-run", "check the whole setup and print what would run, producing and writing nothing: the flags, --config, --types, "+
		"the pool against the definition in Redis (nothing stored), the topics (exist or would be created), the sink's preflight and, for "+
		"bulk-load, every input's header and rows; exit 0, or 2 naming the first problem")
}

// dryRunError makes any problem a dry run finds a usage error (exit 2):
// the setup is what it checks.
func dryRunError(err error) error {
	if err == nil {
		return nil
	}
	var exit cli.ExitCoder
	if errors.As(err, &exit) && exit.ExitCode() == exitUsage {
		return err
	}
	return usageError(fmt.Errorf("dry run: %w", err))
}

// printPlan writes what a run of the process would do with each job.
func printPlan(w io.Writer, proc *worker.Process, all []settings) {
	fmt.Fprintln(w, "dry run: every check passed; nothing was stored, created, produced or written")
	for i, job := range proc.Jobs {
		plan := proc.Plans[i]
		cfg := job.Config
		if all[i].typeName != "" {
			fmt.Fprintf(w, "type      %s\n", all[i].typeName)
		}
		stored := "stored in Redis"
		if !plan.PoolStored {
			stored = "new: a run stores it"
		}
		fmt.Fprintf(w, "pool      %s: %s (%s)\n", cfg.Pool.Name, cfg.Pool, stored)
		fmt.Fprintf(w, "capacity  %v %s/s in %d partitions of %v %s/s each\n", cfg.Pool.Capacity, cfg.Pool.Unit, cfg.Pool.Partitions,
			cfg.Pool.Capacity/float64(cfg.Pool.Partitions), cfg.Pool.Unit)
		fmt.Fprintf(w, "sink      %s (answers)\n", sink.Redact(job.SinkURL))
		if plan.TopicPartitions > 0 {
			fmt.Fprintf(w, "topic     %s: %d partitions; dead letters to %s\n", cfg.Topic, plan.TopicPartitions, queue.DeadLetterTopic(cfg.Topic))
		} else {
			fmt.Fprintf(w, "topic     %s: new: a run creates it with %d partitions; dead letters to %s\n", cfg.Topic, plan.CreatePartitions, queue.DeadLetterTopic(cfg.Topic))
		}
		fmt.Fprintf(w, "group     %s, %d worker(s) here\n", cfg.Group, job.Workers)
	}
}

// inputCount is what a dry run read of the inputs.
type inputCount struct {
	rows, bad int64
	firstBad  string
}

// countRows reads every row of rows: those a load would produce, and
// those it would dead-letter (malformed, without an ID).
func countRows(rows bulkload.Rows) (inputCount, error) {
	var n inputCount
	for {
		_, err := rows.Next()
		if err == io.EOF {
			return n, nil
		}
		var rowErr *bulkload.RowError
		switch {
		case errors.As(err, &rowErr):
			n.bad++
			if n.firstBad == "" {
				n.firstBad = rowErr.Error()
			}
		case err != nil:
			return n, err
		}
		n.rows++
	}
}

// printLoadPlan writes what a bulk load would do beyond its process's
// plan: the inputs, and how far earlier runs of the same load got.
func printLoadPlan(c *cli.Context, proc *worker.Process, in *bulkload.Input, n inputCount, loadID string) error {
	w := c.App.Writer
	fmt.Fprintf(w, "input     %s: %d rows", strings.Join(in.Names(), ", "), n.rows)
	if n.bad > 0 {
		fmt.Fprintf(w, ", %d of them to be dead-lettered (the first: %s)", n.bad, n.firstBad)
	}
	fmt.Fprintln(w)
	if loadID == "" {
		fmt.Fprintln(w, "load      no identity (standard input or --no-resume): a rerun produces every row again")
		return nil
	}
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	defer cancel()
	resumed, err := bulkload.RedisProgress{Client: proc.Redis[0]}.Resume(ctx, loadID)
	switch {
	case err != nil:
		return err
	case !resumed.FinishedAt.IsZero():
		fmt.Fprintf(w, "load      %s: nothing to do, finished at %s (--no-resume loads it again)\n", loadID, resumed.FinishedAt.Local().Format(time.DateTime))
	case resumed.Rows > 0:
		fmt.Fprintf(w, "load      %s: resumes after the %d rows an earlier run produced\n", loadID, resumed.Rows)
	default:
		fmt.Fprintf(w, "load      %s: new\n", loadID)
	}
	return nil
}
