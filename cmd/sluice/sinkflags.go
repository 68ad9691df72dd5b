package main

import (
	"github.com/urfave/cli/v2"

	"github.com/sluicehq/sluice/sink"
)

// sinkFlags are the settings of the real sinks that --sink selects by its
// scheme. Secrets are never flags: the Azure account key comes from
// SLUICE_AZURE_ACCOUNT_KEY or the file --azure-account-key-file names, a
// PostgreSQL password from PGPASSWORD or ~/.pgpass.
func sinkFlags() []cli.Flag {
	return inCategory(catConnect,
		durationFlag("sink-statement-timeout", sink.DefaultPostgresStatementTimeout, "postgres:// sink: the server's statement_timeout; a slower batch is retried"),
		intFlag("sink-max-conns", sink.DefaultPostgresMaxConns, "postgres:// sink: connection pool size"),
		stringFlag("azure-account-key-file", "", "azuretables:// sink: file holding the storage account key (else SLUICE_AZURE_ACCOUNT_KEY)"),
	)
}

// sinkOptions builds sink.Open's config from the sink flags.
func sinkOptions(c *cli.Context, s settings) sink.OpenConfig {
	return sink.OpenConfig{
		Timeout:          s.requestTimeout,
		StatementTimeout: c.Duration("sink-statement-timeout"),
		MaxConns:         c.Int("sink-max-conns"),
		AccountKeyFile:   c.String("azure-account-key-file"),
		Logger:           s.log,
	}
}
