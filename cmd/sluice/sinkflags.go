package main

import (
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/sink"
)

// sinkFlags are the settings of the real sinks that --sink selects by its
// scheme. Secrets are never flags: the Azure account key comes from
// SLUICE_AZURE_ACCOUNT_KEY or the file --azure-account-key-file names, a
// PostgreSQL password from PGPASSWORD or ~/.pgpass.
func sinkFlags() []cli.Flag {
	return inCategory(catConnect,
		durationFlag("sink-statement-timeout", 0, "postgres:// sink: the server's statement_timeout, at most --request-timeout (default: --request-timeout); a slower batch is retried"),
		intFlag("sink-max-conns", sink.DefaultPostgresMaxConns, "postgres:// sink: connection pool size"),
		stringFlag("sink-headers-file", "", "http(s):// sink: file of extra request headers, one \"Name: value\" a line (secrets stay out of flags; "+envSinkAuthorization+" sets Authorization)"),
		boolFlag("sink-ndjson", "http(s):// sink: send batches as newline-delimited JSON instead of a JSON array"),
		stringFlag("sink-ca-file", "", "https:// sink: PEM file of extra trusted certificate authorities"),
		boolFlag("sink-insecure-skip-verify", "https:// sink: do not verify the sink's certificate (tests only)"),
		stringFlag("azure-account-key-file", "", "azuretables:// sink: file holding the storage account key (else "+envAzureAccountKey+")"),
	)
}

// The sinks' secrets from the environment.
const (
	envSinkAuthorization = "SLUICE_SINK_AUTHORIZATION"
	envAzureAccountKey   = "SLUICE_AZURE_ACCOUNT_KEY"
)

// sinkOptions builds sink.Open's config from the sink flags, with the
// request timeout and the logger of the command.
func sinkOptions(c *cli.Context, log *slog.Logger, timeout time.Duration) sink.OpenConfig {
	return sink.OpenConfig{
		Timeout:            timeout,
		StatementTimeout:   c.Duration("sink-statement-timeout"),
		MaxConns:           c.Int("sink-max-conns"),
		AccountKey:         os.Getenv(envAzureAccountKey),
		AccountKeyFile:     c.String("azure-account-key-file"),
		Authorization:      os.Getenv(envSinkAuthorization),
		HeadersFile:        c.String("sink-headers-file"),
		NDJSON:             c.Bool("sink-ndjson"),
		CAFile:             c.String("sink-ca-file"),
		InsecureSkipVerify: c.Bool("sink-insecure-skip-verify"),
		Logger:             log,
	}
}
