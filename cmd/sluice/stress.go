package main

import (
	"fmt"
	"slices"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/stress"
)

func stressCommand() *cli.Command {
	return &cli.Command{
		Name:  "stress",
		Usage: "find one partition's real ceiling: write one partition key at a rising rate until it throttles",
		Description: "The partition stress test Azure Table Storage recommends before production. Every\n" +
			"record shares one partition key (--prefix) and sequential sink keys under it, so\n" +
			"they stay in one key range. The rate starts at --start records/s and grows by\n" +
			"--step every --step-every up to --max; the run stops at the first step with more\n" +
			"than --threshold of its records throttled. It prints each step, the most records/s\n" +
			"the partition accepted over a step (its ceiling) and, with --target, the verdict.\n" +
			"Records are not retried. Exit code 4: the ceiling is below --target.",
		Flags: slices.Concat(inCategory(catConnect,
			stringFlag("sink", "http://127.0.0.1:8088", "the sink to stress, as a `URL`: "+sink.URLForms),
		), []cli.Flag{
			floatFlag("start", stress.DefaultStart, "first step's rate, `records/s`"),
			floatFlag("step", 0, "added to the rate every step, `records/s` (0: --start)"),
			durationFlag("step-every", stress.DefaultStepEvery, "how long each step lasts (≥ 1s)"),
			floatFlag("max", stress.DefaultMax, "highest rate tried, `records/s`"),
			floatFlag("target", 0, "the rate the partition must sustain for the verdict, `records/s` (e.g. 2000 for an Azure Tables partition); 0: no verdict"),
			stringFlag("prefix", "", "the partition key and sink key prefix of every record (default stress-<unix ms>)"),
			floatFlag("threshold", stress.DefaultThreshold, "share of a step's records that may be throttled or fail while the step still holds"),
			intFlag("batch-size", ingest.DefaultMaxBatch, "most records per write"),
			intFlag("concurrency", ingest.DefaultConcurrency, "most writes in flight"),
			durationFlag("request-timeout", ingest.DefaultRequestTimeout, "sink request timeout"),
			boolFlag("json", "print the report as JSON"),
		}, sinkFlags(), logFlags()),
		OnUsageError: onUsageError,
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return usageError(err)
			}
			if err := sink.CheckURL(c.String("sink")); err != nil {
				return usageError(err)
			}
			opts, err := sinkOptions(c, log, c.Duration("request-timeout"))
			if err != nil {
				return usageError(err)
			}
			target, err := sink.Open(c.Context, c.String("sink"), opts)
			if err != nil {
				return err
			}
			defer target.Close()
			rep, err := stress.Stress(c.Context, target, stress.Config{
				Start: c.Float64("start"), Step: c.Float64("step"), Max: c.Float64("max"), StepEvery: c.Duration("step-every"),
				Prefix: c.String("prefix"), Target: c.Float64("target"), Threshold: c.Float64("threshold"),
				BatchSize: c.Int("batch-size"), Concurrency: c.Int("concurrency"), Logger: log,
			})
			if err != nil && len(rep.Steps) == 0 {
				return usageError(err)
			}
			if c.Bool("json") {
				if jerr := printJSON(c, rep); jerr != nil {
					return jerr
				}
			} else {
				writeStress(c, rep)
			}
			if err != nil {
				return err
			}
			if rep.Verdict == "below target" {
				return cli.Exit("", exitBelowTarget)
			}
			return nil
		},
	}
}

// writeStress prints a stress report as a table and a summary.
func writeStress(c *cli.Context, rep stress.Report) {
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "offered/s\tsent\taccepted\tthrottled\tfailed\taccepted/s\theld\t")
	for _, st := range rep.Steps {
		fmt.Fprintf(tw, "%.0f\t%d\t%d\t%d\t%d\t%.0f\t%v\t\n", st.Rate, st.Sent, st.Accepted, st.Throttled, st.Failed, st.AcceptedPerSec, st.Held)
	}
	_ = tw.Flush()
	fmt.Fprintf(c.App.Writer, "partition %s: ceiling %.0f records/s (stopped: %s)", rep.Prefix, rep.Highest, rep.StoppedBy)
	if rep.Target > 0 {
		fmt.Fprintf(c.App.Writer, "; target %.0f records/s: %s", rep.Target, rep.Verdict)
	}
	fmt.Fprintln(c.App.Writer)
}
