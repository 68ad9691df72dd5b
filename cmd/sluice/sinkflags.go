package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
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
		stringFlag("sink-method", "POST", "rest+http(s):// sink: request method: POST, PUT or PATCH"),
		stringFlag("sink-body", "", "rest+http(s):// sink: JSON body `TEMPLATE`, or @FILE holding one: a string \"{field}\" is the record field's JSON value, \"{$record}\" the whole record, {field} inside a longer string the field's text, {$id} the record ID (default: the record as is)"),
		boolFlag("sink-array", "rest+http(s):// sink: send a write's records as one JSON array (up to --batch-size) instead of one request per record; the API's answer is every record's"),
		stringFlag("sink-retry-on", sink.DefaultRetryOn, "rest+http(s):// sink: statuses whose record is written again after a backoff: N, Nxx or N-M, comma-separated, each optionally :TEXT to match only answers whose body contains TEXT (429, 503 with Retry-After and an exhausted rate limit are throttling whatever the lists say)"),
		stringFlag("sink-dead-letter-on", sink.DefaultDeadLetterOn, "rest+http(s):// sink: statuses that refuse the request's record for good (dead-lettered); a write whose every request is refused the same way with nothing stored pauses the sink instead (see docs/sinks.md). 401, 403, 404, 405, 407, 501, 505 and statuses no list names pause the sink unless a list names them exactly"),
		boolFlag("sink-idempotency-key", "rest+http(s):// sink: the API honours the Idempotency-Key header every request carries (it stores a repeated request once); without it, and without {$id} in the URL or a --sink-body that carries it, the API cannot tell a record it has and start-up warns"),
		stringFlag("sink-duplicate-on", sink.DefaultDuplicateOn, "rest+http(s):// sink: statuses meaning the record was stored before, counted as duplicates, not delivered (e.g. 409, or 500:duplicate id for json-server)"),
	)
}

// The sinks' secrets from the environment.
const (
	envSinkAuthorization = "SLUICE_SINK_AUTHORIZATION"
	envAzureAccountKey   = "SLUICE_AZURE_ACCOUNT_KEY"
)

// sinkOptions builds sink.Open's config from the sink flags, with the
// request timeout and the logger of the command; its errors name the flag.
func sinkOptions(c *cli.Context, log *slog.Logger, timeout time.Duration) (sink.OpenConfig, error) {
	rest, err := restOptions(c)
	if err != nil {
		return sink.OpenConfig{}, err
	}
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
		REST:               rest,
		Logger:             log,
	}, nil
}

// restOptions reads the rest+http(s):// sink's flags; requests in parallel
// within a write follow --concurrency.
func restOptions(c *cli.Context) (sink.RESTOptions, error) {
	o := sink.RESTOptions{Method: c.String("sink-method"), Array: c.Bool("sink-array"), Parallel: c.Int("concurrency"), IdempotencyKey: c.Bool("sink-idempotency-key")}
	switch strings.ToUpper(o.Method) {
	case "POST", "PUT", "PATCH":
	default:
		return o, fmt.Errorf("--sink-method: want POST, PUT or PATCH, got %q", o.Method)
	}
	o.Body = c.String("sink-body")
	if file, ok := strings.CutPrefix(o.Body, "@"); ok {
		data, err := os.ReadFile(file)
		if err != nil {
			return o, fmt.Errorf("--sink-body: %w", err)
		}
		o.Body = string(data)
	}
	if _, _, err := sink.TemplateFields("", o.Body); err != nil {
		return o, fmt.Errorf("--sink-body: %w", err)
	}
	for _, l := range []struct {
		flag string
		set  *sink.StatusSet
	}{{"sink-retry-on", &o.Status.RetryOn}, {"sink-dead-letter-on", &o.Status.DeadLetterOn}, {"sink-duplicate-on", &o.Status.DuplicateOn}} {
		set, err := sink.ParseStatusSet(c.String(l.flag))
		if err != nil {
			return o, fmt.Errorf("--%s: %w", l.flag, err)
		}
		*l.set = set
	}
	if err := o.Status.Validate(); err != nil {
		return o, fmt.Errorf("--sink-retry-on, --sink-dead-letter-on, --sink-duplicate-on: %w", err)
	}
	return o, nil
}
