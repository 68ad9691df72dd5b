package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/recordtype"
)

// loadTokens reads a tokens file: one "TOKEN TYPE[,TYPE...]" per line ("*"
// for every type; blank lines and # comments skipped), plus SLUICE_API_TOKEN
// (all types) when set. Tokens are kept only as hashes.
func loadTokens(path string) (map[[32]byte][]string, error) {
	out := map[[32]byte][]string{}
	if tok := os.Getenv("SLUICE_API_TOKEN"); tok != "" {
		out[api.HashToken(tok)] = []string{"*"}
	}
	if path == "" {
		return out, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--tokens-file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		tok, types, ok := strings.Cut(s, " ")
		if !ok || strings.TrimSpace(types) == "" {
			return nil, fmt.Errorf("--tokens-file %s:%d: want \"TOKEN TYPE[,TYPE...]\"", path, line)
		}
		out[api.HashToken(tok)] = strings.Split(strings.TrimSpace(types), ",")
	}
	return out, sc.Err()
}

func apiCommand() *cli.Command {
	return &cli.Command{
		Name:  "api",
		Usage: "serve the intake API: POST /v1/records/{type} produces records to their type's topic",
		Description: "Validates every record of a request against its type before producing any, then\n" +
			"produces them all to the type's topic (created when missing) and answers 202.\n" +
			"GET /healthz, GET /readyz (Kafka reachable) and GET /metrics are served beside it;\n" +
			"api/openapi.yaml documents every route and status. On SIGTERM it stops accepting\n" +
			"and lets in-flight requests finish (30 s at most).",
		Flags: slices.Concat(kafkaFlags(), []cli.Flag{
			stringFlag("listen", "127.0.0.1:8080", "listen `address`"),
			stringFlag("tokens-file", "", "bearer tokens `FILE`: \"TOKEN TYPE[,TYPE...]\" per line (also SLUICE_API_TOKEN, all types)"),
			&cli.Int64Flag{Name: "max-body", Value: api.DefaultMaxBody, Usage: "request body limit in `bytes`", EnvVars: []string{"SLUICE_MAX_BODY"}},
			topicPartitionsFlag(),
		}, typeFlags()[:1], logFlags()),
		OnUsageError: onUsageError,
		Action: func(c *cli.Context) error {
			log, err := newLogger(c)
			if err != nil {
				return usageError(err)
			}
			if c.String("types") == "" {
				return usageError(errors.New("api needs --types FILE"))
			}
			types, err := recordtype.Load(c.String("types"))
			if err != nil {
				return usageError(err)
			}
			tokens, err := loadTokens(c.String("tokens-file"))
			if err != nil {
				return usageError(err)
			}
			brokers, conn, err := kafkaConn(c)
			if err != nil {
				return usageError(err)
			}
			if err := checkKafka(c.Context, brokers, conn); err != nil {
				return err
			}
			admin := queue.Admin{Brokers: brokers, Conn: conn}
			var topics []string
			for _, t := range types {
				if err := admin.EnsureTopics(c.Context, t.Topic, c.Int("topic-partitions")); err != nil {
					return err
				}
				topics = append(topics, t.Topic)
			}
			producer, err := queue.NewProducer(queue.ProducerConfig{Brokers: brokers, Conn: conn, Topics: topics, Logger: log})
			if err != nil {
				return err
			}
			defer producer.Close()
			h, err := api.New(api.Config{
				Types: types, Producer: producer, Tokens: tokens, MaxBody: c.Int64("max-body"), Logger: log,
				Ready: admin.Ping, Registry: prometheus.NewRegistry(),
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", c.String("listen"))
			if err != nil {
				return usageError(fmt.Errorf("--listen: %w", err))
			}
			log.Info("api: listening", "addr", ln.Addr().String(), "types", len(types))
			return httpserver.Serve(c.Context, ln, h, 30*time.Second) // drains in-flight requests
		},
	}
}
