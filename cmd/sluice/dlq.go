package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/queue"
)

// dlqCommand is `sluice dlq`: see and replay a topic's dead letters.
func dlqCommand() *cli.Command {
	topicFlag := stringFlag("topic", "", "the record type's `topic` (its dead letters are in <topic>.dlq); required")
	return &cli.Command{
		Name:  "dlq",
		Usage: "inspect and replay a topic's dead letters",
		Subcommands: []*cli.Command{{
			Name:  "inspect",
			Usage: "count a topic's dead letters by reason and show the first of each",
			Description: "Reads <topic>.dlq from its start and groups the dead letters by their reason, less\n" +
				"the part that names the record (its position or file:line).",
			Flags:        slices.Concat(kafkaFlags(), []cli.Flag{topicFlag, intFlag("examples", 3, "dead letters shown per reason"), boolFlag("json", "print JSON")}, logFlags()),
			OnUsageError: onUsageError,
			Action:       dlqInspect,
		}, {
			Name:  "replay",
			Usage: "produce dead letters back to their topic, after the cause is fixed",
			Description: "Reads <topic>.dlq from its start and produces the dead letters whose reason matches\n" +
				"--reason back to <topic> with their ID, so workers write them again. The sink stores\n" +
				"each ID once, so replaying twice stores nothing twice; a record that is still refused\n" +
				"is dead-lettered again.",
			Flags: slices.Concat(kafkaFlags(), []cli.Flag{
				topicFlag,
				stringFlag("reason", "", "replay only the dead letters whose reason matches this `REGEX` (default: all)"),
				intFlag("limit", 0, "replay at most this many (0: all)"),
				boolFlag("dry-run", "only count what would be replayed"),
			}, logFlags()),
			OnUsageError: onUsageError,
			Action:       dlqReplay,
		}},
	}
}

// reasonCount is one row of `dlq inspect`.
type reasonCount struct {
	Reason   string                    `json:"reason"`
	Count    int                       `json:"count"`
	Examples []queue.DeadLetterMessage `json:"examples"`
}

func dlqInspect(c *cli.Context) error {
	admin, topic, _, err := dlqAdmin(c)
	if err != nil {
		return err
	}
	byKind := map[string]*reasonCount{}
	total := 0
	err = admin.ReadDeadLetters(c.Context, topic, func(m queue.DeadLetterMessage) error {
		total++
		rc := byKind[m.Kind()]
		if rc == nil {
			rc = &reasonCount{Reason: m.Kind()}
			byKind[m.Kind()] = rc
		}
		rc.Count++
		if len(rc.Examples) < c.Int("examples") {
			rc.Examples = append(rc.Examples, m)
		}
		return nil
	})
	if err != nil && !errors.Is(err, queue.ErrUnknownTopic) {
		return err
	}
	rows := make([]*reasonCount, 0, len(byKind))
	for _, rc := range byKind {
		rows = append(rows, rc)
	}
	slices.SortFunc(rows, func(a, b *reasonCount) int { return cmp.Or(b.Count-a.Count, cmp.Compare(a.Reason, b.Reason)) })
	if c.Bool("json") {
		return printJSON(c, map[string]any{"topic": queue.DeadLetterTopic(topic), "dead_letters": total, "reasons": rows})
	}
	fmt.Fprintf(c.App.Writer, "%s: %d dead letters\n", queue.DeadLetterTopic(topic), total)
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	for _, rc := range rows {
		fmt.Fprintf(tw, "%d\t%s\n", rc.Count, rc.Reason)
		for _, m := range rc.Examples {
			where := cmp.Or(m.Source, "before producing")
			fmt.Fprintf(tw, "\t  id %s (%s): %.120s\n", m.ID, where, m.Reason)
		}
	}
	return tw.Flush()
}

func dlqReplay(c *cli.Context) error {
	admin, topic, log, err := dlqAdmin(c)
	if err != nil {
		return err
	}
	match, err := regexp.Compile(c.String("reason"))
	if err != nil {
		return usageError(fmt.Errorf("--reason: %w", err))
	}
	var picked []queue.DeadLetterMessage
	err = admin.ReadDeadLetters(c.Context, topic, func(m queue.DeadLetterMessage) error {
		if limit := c.Int("limit"); limit > 0 && len(picked) >= limit {
			return nil
		}
		if match.MatchString(m.Reason) {
			picked = append(picked, m)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if c.Bool("dry-run") {
		fmt.Fprintf(c.App.Writer, "would replay %d dead letters to %s\n", len(picked), topic)
		return nil
	}
	producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: admin.Brokers, Conn: admin.Conn, Topics: []string{topic}, Logger: log})
	if err != nil {
		return err
	}
	defer producer.Close()
	for chunk := range slices.Chunk(picked, 500) {
		if err := producer.Replay(c.Context, topic, chunk); err != nil {
			return err
		}
	}
	fmt.Fprintf(c.App.Writer, "replayed %d dead letters to %s\n", len(picked), topic)
	return nil
}

// dlqAdmin reads the Kafka, logging and --topic flags, and checks the
// brokers.
func dlqAdmin(c *cli.Context) (queue.Admin, string, *slog.Logger, error) {
	topic := c.String("topic")
	if topic == "" {
		return queue.Admin{}, "", nil, usageError(errors.New("--topic: the record type's topic is required"))
	}
	log, err := newLogger(c)
	if err != nil {
		return queue.Admin{}, "", nil, usageError(err)
	}
	brokers, conn, err := kafkaConn(c)
	if err != nil {
		return queue.Admin{}, "", nil, usageError(err)
	}
	if err := checkKafka(c.Context, brokers, conn); err != nil {
		return queue.Admin{}, "", nil, err
	}
	return queue.Admin{Brokers: brokers, Conn: conn}, topic, log, nil
}
