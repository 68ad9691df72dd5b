package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// ErrSinkURL is wrapped by Open and CheckURL errors about the sink's URL.
var ErrSinkURL = errors.New("sink URL")

// OpenConfig holds what Open needs beyond the URL. Secrets never come from
// the URL's query string: the caller passes them here (read from the
// environment or a file).
type OpenConfig struct {
	// Timeout is the request timeout the writes run under (the pipeline's
	// deadline on each write); each sink's own timeouts must fit inside it.
	// It also bounds each HTTP and Azure request. Defaults to
	// ingest.DefaultRequestTimeout (2 s).
	Timeout time.Duration
	// StatementTimeout is the PostgreSQL statement_timeout; at most
	// Timeout. Defaults to Timeout.
	StatementTimeout time.Duration
	// MaxConns bounds the PostgreSQL pool. Default DefaultPostgresMaxConns.
	MaxConns int
	// AccountKey is the Azure storage account key; AccountKeyFile, when
	// set instead, names a file holding it (surrounding white space is
	// ignored).
	AccountKey, AccountKeyFile string
	// HeadersFile names a file of extra HTTP headers for the HTTP and REST
	// sinks, one
	// "Name: value" a line (blank lines and lines starting with # are
	// skipped); values may be secrets and are never logged.
	HeadersFile string
	// Authorization, when set, is the HTTP sink's Authorization header
	// (it replaces one from HeadersFile). Never logged.
	Authorization string
	// NDJSON makes the HTTP sink send newline-delimited JSON.
	NDJSON bool
	// CAFile and InsecureSkipVerify are the HTTP sink's TLS settings; see
	// HTTPConfig.
	CAFile             string
	InsecureSkipVerify bool
	// REST holds the settings of a rest+http(s):// sink; HeadersFile,
	// Authorization, CAFile and InsecureSkipVerify apply to it too.
	REST RESTOptions
	// Unit is the pool's unit. The DynamoDB sink reports the write
	// capacity units it consumed as charges only when it is
	// ingest.UnitCost (the pool counts WCU); a charge in WCU would be
	// misread in records or bytes.
	Unit ingest.Unit
	// Logger receives the sink's events. Default slog.Default().
	Logger *slog.Logger
}

// RESTOptions are the settings of a rest+http(s):// sink beyond its URL;
// see RESTConfig for each.
type RESTOptions struct {
	Method   string
	Array    bool
	Body     string
	Status   StatusRules
	Parallel int
	// IdempotencyKey says the API honours the Idempotency-Key header
	// (every request carries one): it stores a repeated request once.
	IdempotencyKey bool
}

// Opened is a sink opened by Open. Close releases its connections; it is a
// no-op for the HTTP sink.
type Opened interface {
	ingest.Sink
	io.Closer
}

// URLForms names the sink URLs Open takes, one example each, for help
// texts and errors.
const URLForms = "http://host:port (the sink emulator's batch protocol), rest+https://api.example.com/items/{$id} (a REST API), " +
	"postgres://user@host:5432/db?table=T, azuretables://host/account?table=T, dynamodb://table, s3://bucket/prefix, " +
	"gs://bucket/prefix, opensearch://host:9200/index (opensearchs:// for TLS)"

// CheckURL checks the --sink URL without connecting: its scheme selects the
// sink, and the sink's required parts must be present.
//
//   - http://host:port, https://host:port: the HTTP sink (the emulator's
//     batch protocol);
//   - rest+http://host/path/{field}, rest+https://…: the REST sink
//     (RESTSink) for a plain API; the URL after "rest+" is the request URL
//     template (see RESTConfig.URL);
//   - postgres://user@host:port/db?table=T (also postgresql://): the
//     PostgreSQL sink; optional query parameters id_column and value_column
//     (defaults "id" and "value"), create_table=false to not create a
//     missing table; other parameters go to the driver;
//   - azuretables://host:port/account?table=T: the Azure Table Storage sink
//     (AzureTablesSink), path-style as Azurite serves it, plain HTTP when
//     host is a loopback address and HTTPS otherwise;
//     azuretables://account.table.core.windows.net?table=T: the account is
//     the host's first label. Optional batch_ops and batch_bytes lower the
//     entity-group transaction limits (at most 100 and 4 MiB). The account
//     key comes from OpenConfig;
//   - dynamodb://table?region=R&endpoint=E: the DynamoDB sink
//     (DynamoDBSink); see DynamoDBURLParams for the options;
//   - s3://bucket/prefix?endpoint=E: the S3-compatible object-store sink
//     (S3Sink); see S3URLParams for the options;
//   - gs://bucket/prefix?endpoint=E: the Cloud Storage sink (GCSSink); see
//     GCSURLParams for the options;
//   - opensearch://host:port/index (plain HTTP), opensearchs://… (HTTPS):
//     the OpenSearch _bulk sink (OpenSearchSink); elasticsearch:// and
//     elasticsearchs:// are aliases (Elasticsearch 7 and 8 speak the same
//     _bulk API); see OpenSearchURLParams for the options.
func CheckURL(raw string) error {
	if target, ok := restTarget(raw); ok {
		if _, err := parseURLTemplate(target); err != nil {
			return fmt.Errorf("%w: %w", ErrSinkURL, err)
		}
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSinkURL, err)
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return fmt.Errorf("%w: %q has no host", ErrSinkURL, raw)
		}
	case "postgres", "postgresql":
		if u.Host == "" {
			return fmt.Errorf("%w: %q has no host", ErrSinkURL, redact(u))
		}
		if u.Query().Get("table") == "" {
			return fmt.Errorf("%w: %q needs ?table=<name>", ErrSinkURL, redact(u))
		}
	case "azuretables":
		if u.Host == "" {
			return fmt.Errorf("%w: %q has no host", ErrSinkURL, raw)
		}
		if u.User != nil {
			return fmt.Errorf("%w: %q: credentials do not belong in the URL; pass the account key apart", ErrSinkURL, u.Redacted())
		}
		if !validTableName(u.Query().Get("table")) {
			return fmt.Errorf("%w: %q needs ?table=<name> (3-63 letters and digits, not starting with a digit)", ErrSinkURL, raw)
		}
	case "dynamodb":
		if _, err := dynamoConfig(u, OpenConfig{}); err != nil {
			return err
		}
	case "s3":
		if _, err := s3Config(u, OpenConfig{}); err != nil {
			return err
		}
	case "gs":
		if _, err := gcsConfig(u, OpenConfig{}); err != nil {
			return err
		}
	case "opensearch", "opensearchs", "elasticsearch", "elasticsearchs":
		if _, err := openSearchConfig(u, OpenConfig{}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: unknown scheme %q in %q (want http, https, rest+http, rest+https, postgres, azuretables, dynamodb, s3, gs, opensearch or opensearchs)", ErrSinkURL, u.Scheme, redact(u))
	}
	return nil
}

// Open checks raw (see CheckURL) and opens the sink it names. It returns an
// error wrapping ErrSinkURL for a bad URL or configuration, for a
// StatementTimeout longer than Timeout among them.
func Open(ctx context.Context, raw string, cfg OpenConfig) (Opened, error) {
	if err := CheckURL(raw); err != nil {
		return nil, err
	}
	if cfg.Timeout < 0 || cfg.StatementTimeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout", ErrSinkURL)
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, ingest.DefaultRequestTimeout)
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, cfg.Timeout)
	if cfg.StatementTimeout > cfg.Timeout {
		return nil, fmt.Errorf("%w: the statement timeout %s must fit inside the request timeout %s, or a write could land after the lease it was paced under stopped counting",
			ErrSinkURL, cfg.StatementTimeout, cfg.Timeout)
	}
	if target, ok := restTarget(raw); ok {
		header, err := sinkHeaders(cfg)
		if err != nil {
			return nil, err
		}
		s, err := NewREST(RESTConfig{URL: target, Method: cfg.REST.Method, Array: cfg.REST.Array, Body: cfg.REST.Body,
			Status: cfg.REST.Status, Header: header, Timeout: cfg.Timeout, Parallel: cfg.REST.Parallel,
			CAFile: cfg.CAFile, InsecureSkipVerify: cfg.InsecureSkipVerify})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSinkURL, err)
		}
		return s, nil
	}
	u, _ := url.Parse(raw)
	switch u.Scheme {
	case "postgres", "postgresql":
		q := u.Query()
		pc := PostgresConfig{
			Table:            q.Get("table"),
			IDColumn:         q.Get("id_column"),
			ValueColumn:      q.Get("value_column"),
			CreateTable:      q.Get("create_table") != "false",
			StatementTimeout: cfg.StatementTimeout,
			MaxConns:         cfg.MaxConns,
			Logger:           cfg.Logger,
		}
		for _, k := range []string{"table", "id_column", "value_column", "create_table"} {
			q.Del(k)
		}
		u.RawQuery = q.Encode()
		pc.URL = u.String()
		s, err := NewPostgres(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrSinkURL, redact(u), err)
		}
		return s, nil
	case "azuretables":
		ac, err := azureConfig(u, cfg)
		if err != nil {
			return nil, err
		}
		s, err := NewAzureTables(ctx, ac)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrSinkURL, raw, err)
		}
		return s, nil
	case "dynamodb":
		dc, _ := dynamoConfig(u, cfg)
		s, err := NewDynamoDB(ctx, dc)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrSinkURL, raw, err)
		}
		return s, nil
	case "s3":
		sc, _ := s3Config(u, cfg)
		s, err := NewS3(ctx, sc)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrSinkURL, raw, err)
		}
		return s, nil
	case "gs":
		gc, _ := gcsConfig(u, cfg)
		s, err := NewGCS(ctx, gc)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrSinkURL, raw, err)
		}
		return s, nil
	case "opensearch", "opensearchs", "elasticsearch", "elasticsearchs":
		oc, _ := openSearchConfig(u, cfg)
		header, err := sinkHeaders(cfg)
		if err != nil {
			return nil, err
		}
		oc.Header = header
		s, err := NewOpenSearch(ctx, oc)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrSinkURL, raw, err)
		}
		return s, nil
	default:
		header, err := sinkHeaders(cfg)
		if err != nil {
			return nil, err
		}
		s, err := NewHTTP(HTTPConfig{URL: raw, Timeout: cfg.Timeout, Header: header, NDJSON: cfg.NDJSON,
			CAFile: cfg.CAFile, InsecureSkipVerify: cfg.InsecureSkipVerify})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSinkURL, err)
		}
		return s, nil
	}
}

// sinkHeaders are the HTTP sinks' extra headers: the headers file's, and
// Authorization when given apart.
func sinkHeaders(cfg OpenConfig) (http.Header, error) {
	header, err := readHeaders(cfg.HeadersFile)
	if err != nil {
		return nil, err
	}
	if cfg.Authorization != "" {
		header.Set("Authorization", cfg.Authorization)
	}
	return header, nil
}

// readHeaders reads the HTTP sink's extra headers from file ("": none).
// Errors name the file and line but never a value.
func readHeaders(file string) (http.Header, error) {
	h := http.Header{}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("headers file: %w", err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			name, value, ok := strings.Cut(line, ":")
			name = strings.TrimSpace(name)
			if !ok || name == "" || strings.ContainsAny(name, " \t") {
				return nil, fmt.Errorf("headers file %s:%d: want \"Name: value\"", file, n+1)
			}
			h.Add(name, strings.TrimSpace(value))
		}
	}
	return h, nil
}

// redact hides a password in u for messages.
func redact(u *url.URL) string { return u.Redacted() }

// Redact returns a sink URL with any password in it hidden, for messages.
func Redact(raw string) string {
	if _, ok := restTarget(raw); ok {
		return raw // a REST URL holds no credentials (CheckURL refuses them); braces stay readable
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
