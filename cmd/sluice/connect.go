package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/queue"
)

// Secrets never come from a flag's value: the environment variables below,
// or the file a *-password-file flag names.
const (
	envKafkaPassword = "SLUICE_KAFKA_SASL_PASSWORD"
	envRedisPassword = "SLUICE_REDIS_PASSWORD"
	envSentinelPass  = "SLUICE_REDIS_SENTINEL_PASSWORD"
)

// kafkaFlags are the flags of every command that talks to Kafka.
func kafkaFlags() []cli.Flag {
	return inCategory(catKafka,
		stringFlag("brokers", "127.0.0.1:9092", "Kafka bootstrap brokers, `host:port[,host:port...]`"),
		boolFlag("kafka-tls", "connect to Kafka over TLS (implied by the other --kafka-*-file flags)"),
		stringFlag("kafka-ca-file", "", "PEM `FILE` of the certificate authorities trusted for the brokers (default: the system's)"),
		stringFlag("kafka-cert-file", "", "client certificate PEM `FILE` for mTLS (with --kafka-key-file)"),
		stringFlag("kafka-key-file", "", "client key PEM `FILE` for mTLS"),
		stringFlag("kafka-server-name", "", "TLS server name to verify instead of the broker's host"),
		boolFlag("kafka-insecure-skip-verify", "do not verify the brokers' certificates (tests only)"),
		stringFlag("kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: no SASL)"),
		stringFlag("kafka-sasl-username", "", "SASL user name"),
		stringFlag("kafka-sasl-password-file", "", "`FILE` holding the SASL password (else "+envKafkaPassword+")"),
	)
}

// redisFlags are the flags of every command that talks to Redis.
func redisFlags() []cli.Flag {
	return inCategory(catRedis,
		&cli.StringFlag{Name: "redis-addr", Aliases: []string{"redis-url"}, Value: "127.0.0.1:6379", EnvVars: []string{"SLUICE_REDIS_ADDR", "SLUICE_REDIS_URL"},
			Usage: "Redis holding the capacity pools: `host:port`, redis://[user@]host:port[/db] or rediss:// (TLS); several comma-separated independent masters form a Redlock quorum (with --redis-cluster: seed nodes of one cluster)"},
		boolFlag("redis-cluster", "--redis-addr names seed nodes (one or more, comma-separated) of one Redis Cluster: the client finds the other nodes and follows failovers; a pool's keys share one hash slot"),
		stringFlag("redis-username", "", "Redis ACL user name (a URL's own wins)"),
		stringFlag("redis-password-file", "", "`FILE` holding the Redis password (else "+envRedisPassword+")"),
		intFlag("redis-db", 0, "Redis database number (a URL's own wins)"),
		boolFlag("redis-tls", "connect to Redis over TLS (rediss:// URLs always do)"),
		stringFlag("redis-ca-file", "", "PEM `FILE` of the certificate authorities trusted for Redis"),
		stringFlag("redis-cert-file", "", "client certificate PEM `FILE` for Redis TLS (with --redis-key-file)"),
		stringFlag("redis-key-file", "", "client key PEM `FILE` for Redis TLS"),
		stringFlag("redis-server-name", "", "TLS server name to verify instead of the Redis host"),
		boolFlag("redis-insecure-skip-verify", "do not verify Redis's certificate (tests only)"),
		stringFlag("redis-sentinel-master", "", "use Redis Sentinel: the monitored master's `NAME` (--redis-sentinel-addrs name the sentinels)"),
		stringFlag("redis-sentinel-addrs", "", "Redis Sentinel addresses, `host:port[,host:port...]`"),
		stringFlag("redis-sentinel-username", "", "ACL user name of the Sentinels themselves, when they require one (the master's is --redis-username)"),
		stringFlag("redis-sentinel-password-file", "", "`FILE` holding the Sentinels' own password, when they require one (else "+envSentinelPass+")"),
	)
}

// secret reads a password from file when it is named, else from the
// environment variable env; surrounding white space is dropped.
func secret(flag, file, env string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(env)), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// kafkaConn reads the Kafka flags; its errors name the flag.
func kafkaConn(c *cli.Context) (brokers []string, conn queue.Conn, err error) {
	brokers = splitList(c.String("brokers"))
	if len(brokers) == 0 {
		return nil, conn, errors.New("--brokers: at least one host:port is required")
	}
	password, err := secret("kafka-sasl-password-file", c.String("kafka-sasl-password-file"), envKafkaPassword)
	if err != nil {
		return nil, conn, err
	}
	conn, err = queue.NewConn(queue.Security{
		TLS:                c.Bool("kafka-tls"),
		CAFile:             c.String("kafka-ca-file"),
		CertFile:           c.String("kafka-cert-file"),
		KeyFile:            c.String("kafka-key-file"),
		ServerName:         c.String("kafka-server-name"),
		InsecureSkipVerify: c.Bool("kafka-insecure-skip-verify"),
		SASLMechanism:      c.String("kafka-sasl-mechanism"),
		Username:           c.String("kafka-sasl-username"),
		Password:           password,
	})
	if err != nil {
		return nil, conn, fmt.Errorf("--kafka-*: %w", err)
	}
	return brokers, conn, nil
}

// redisConfig reads the Redis flags; its errors name the flag.
func redisConfig(c *cli.Context) (lease.RedisConfig, error) {
	password, err := secret("redis-password-file", c.String("redis-password-file"), envRedisPassword)
	if err != nil {
		return lease.RedisConfig{}, err
	}
	cfg := lease.RedisConfig{
		Addrs:              splitList(c.String("redis-addr")),
		Username:           c.String("redis-username"),
		Password:           password,
		DB:                 c.Int("redis-db"),
		Cluster:            c.Bool("redis-cluster"),
		TLS:                c.Bool("redis-tls"),
		CAFile:             c.String("redis-ca-file"),
		CertFile:           c.String("redis-cert-file"),
		KeyFile:            c.String("redis-key-file"),
		ServerName:         c.String("redis-server-name"),
		InsecureSkipVerify: c.Bool("redis-insecure-skip-verify"),
		SentinelMaster:     c.String("redis-sentinel-master"),
		SentinelAddrs:      splitList(c.String("redis-sentinel-addrs")),
	}
	if cfg.SentinelMaster != "" {
		// The Sentinels answer with their own credentials, if any: a
		// Sentinel without users refuses the master's.
		cfg.Addrs = nil
		cfg.SentinelUsername = c.String("redis-sentinel-username")
		if cfg.SentinelPassword, err = secret("redis-sentinel-password-file", c.String("redis-sentinel-password-file"), envSentinelPass); err != nil {
			return cfg, err
		}
	} else if len(cfg.Addrs) == 0 {
		return cfg, errors.New("--redis-addr: at least one host:port or URL is required")
	}
	return cfg, nil
}

// connectRedis opens the Redis clients and checks that a quorum answers
// (lease.Connect); an invalid setting is a usage error.
func connectRedis(ctx context.Context, cfg lease.RedisConfig, log *slog.Logger) ([]redis.UniversalClient, error) {
	clients, err := lease.Connect(ctx, cfg, log)
	if errors.Is(err, lease.ErrInvalidConfig) {
		return nil, usageError(fmt.Errorf("--redis-*: %w", err))
	}
	return clients, err
}

// checkKafka checks, within 10 s, that the brokers answer with the TLS and
// SASL setup given (exit 1 otherwise).
func checkKafka(ctx context.Context, brokers []string, conn queue.Conn) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return queue.Check(cctx, brokers, conn)
}

// poolRedis connects a pool command to Redis from its flags: a context
// of 10 s for its work, the clients, and done, which closes both. A flag
// error is a usage error.
func poolRedis(c *cli.Context) (ctx context.Context, clients []redis.UniversalClient, done func(), err error) {
	log, err := newLogger(c)
	if err != nil {
		return nil, nil, nil, usageError(err)
	}
	cfg, err := redisConfig(c)
	if err != nil {
		return nil, nil, nil, usageError(err)
	}
	if clients, err = connectRedis(c.Context, cfg, log); err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	return ctx, clients, func() { cancel(); closeAll(clients) }, nil
}

func closeAll(clients []redis.UniversalClient) {
	for _, c := range clients {
		_ = c.Close()
	}
}
