package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
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

// azureConfig reads an azuretables:// URL and the account key.
func azureConfig(u *url.URL, cfg OpenConfig) (AzureTablesConfig, error) {
	ac := AzureTablesConfig{Table: u.Query().Get("table"), Timeout: cfg.Timeout, Logger: cfg.Logger}
	for param, limit := range map[string]*int{"batch_ops": &ac.Batch.MaxOps, "batch_bytes": &ac.Batch.MaxBytes} {
		if v := u.Query().Get(param); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return ac, fmt.Errorf("%w %s: %s: want a positive integer, got %q", ErrSinkURL, u.String(), param, v)
			}
			*limit = n
		}
	}
	scheme := "https"
	if ip := net.ParseIP(u.Hostname()); (ip != nil && ip.IsLoopback()) || u.Hostname() == "localhost" {
		scheme = "http"
	}
	if account := strings.Trim(u.Path, "/"); account != "" {
		ac.Account = account
		ac.ServiceURL = scheme + "://" + u.Host + "/" + account
	} else {
		ac.Account, _, _ = strings.Cut(u.Hostname(), ".")
		ac.ServiceURL = scheme + "://" + u.Host
	}
	ac.Key = strings.TrimSpace(cfg.AccountKey)
	if cfg.AccountKeyFile != "" {
		data, err := os.ReadFile(cfg.AccountKeyFile)
		if err != nil {
			return ac, fmt.Errorf("account key file: %w", err)
		}
		ac.Key = strings.TrimSpace(string(data))
	}
	if ac.Key == "" {
		return ac, fmt.Errorf("%w %s: the account key is missing", ErrSinkURL, u.String())
	}
	return ac, nil
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

// DynamoDBURLParams are the query parameters of a dynamodb://table URL:
//
//   - region: the AWS region (default: the SDK's, from AWS_REGION or the
//     profile);
//   - endpoint: a URL that replaces the region's endpoint, e.g.
//     http://127.0.0.1:8000 for DynamoDB Local;
//   - write: put (conditional PutItems, the default: a redelivery is a
//     duplicate) or batch (BatchWriteItems of 25: a redelivery is
//     rewritten and counted as delivered);
//   - pk, sk: the table's partition and sort key attribute names, checked
//     against the table, and used by create_table (default pk, no sort key);
//   - pk_field, sk_field: record fields the keys' values come from
//     (default: the sink key);
//   - create_table=true: create a missing table (on-demand capacity).
var DynamoDBURLParams = []string{"region", "endpoint", "write", "pk", "sk", "pk_field", "sk_field", "create_table"}

// dynamoConfig reads a dynamodb:// URL.
func dynamoConfig(u *url.URL, cfg OpenConfig) (DynamoDBConfig, error) {
	q := u.Query()
	dc := DynamoDBConfig{
		Table: u.Host, Region: q.Get("region"), Endpoint: q.Get("endpoint"),
		PartitionKey: q.Get("pk"), SortKey: q.Get("sk"),
		PartitionKeyField: q.Get("pk_field"), SortKeyField: q.Get("sk_field"),
		Write: DynamoDBWrite(q.Get("write")), Timeout: cfg.Timeout,
		ReportCharge: cfg.Unit == ingest.UnitCost, Logger: cfg.Logger,
	}
	if err := knownParams(u, DynamoDBURLParams); err != nil {
		return dc, err
	}
	if u.User != nil {
		return dc, fmt.Errorf("%w: %q: credentials do not belong in the URL; the AWS SDK's default chain supplies them", ErrSinkURL, u.Redacted())
	}
	if !validDynamoTable(dc.Table) || (u.Path != "" && u.Path != "/") {
		return dc, fmt.Errorf("%w: %q: want dynamodb://<table> with a table name of 3-255 letters, digits, '_', '-' or '.'", ErrSinkURL, u.Redacted())
	}
	if dc.Write != "" && dc.Write != DynamoDBPut && dc.Write != DynamoDBBatch {
		return dc, fmt.Errorf("%w: %q: write=%s: want put or batch", ErrSinkURL, u.Redacted(), dc.Write)
	}
	if v := q.Get("create_table"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return dc, fmt.Errorf("%w: %q: create_table=%s: want true or false", ErrSinkURL, u.Redacted(), v)
		}
		dc.CreateTable = b
	}
	if dc.Endpoint != "" {
		if e, err := url.Parse(dc.Endpoint); err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return dc, fmt.Errorf("%w: %q: endpoint=%s: want http(s)://host[:port]", ErrSinkURL, u.Redacted(), dc.Endpoint)
		}
	}
	return dc, nil
}

// S3URLParams are the query parameters of an s3://bucket/prefix URL:
//
//   - endpoint: the S3-compatible server's URL, e.g. http://127.0.0.1:9000
//     (default: Amazon S3);
//   - region: the bucket's region (default: the SDK's, else us-east-1);
//   - layout: record (one object per record, named by its sink key; the
//     default) or batch (one NDJSON object per request);
//   - gzip=true: gzip the batch layout's objects;
//   - spread=N: hex digits of the batch layout's name prefix (default 2);
//   - virtual_host=true: bucket.endpoint addressing instead of paths;
//   - create_bucket=true: create a missing bucket.
var S3URLParams = []string{"endpoint", "region", "layout", "gzip", "spread", "virtual_host", "create_bucket"}

// s3Config reads an s3:// URL.
func s3Config(u *url.URL, cfg OpenConfig) (S3Config, error) {
	q := u.Query()
	sc := S3Config{
		Bucket: u.Host, Prefix: strings.TrimPrefix(u.Path, "/"), Region: q.Get("region"), Endpoint: q.Get("endpoint"),
		Layout: S3Layout(q.Get("layout")), Timeout: cfg.Timeout, Logger: cfg.Logger,
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %q: %s", ErrSinkURL, u.Redacted(), fmt.Sprintf(format, args...))
	}
	if err := knownParams(u, S3URLParams); err != nil {
		return sc, err
	}
	if u.User != nil {
		return sc, bad("credentials do not belong in the URL; the AWS SDK's default chain supplies them")
	}
	if !validBucket(sc.Bucket) {
		return sc, bad("want s3://<bucket>[/prefix] with a bucket name of 3-63 lower-case letters, digits, '.' or '-'")
	}
	if sc.Layout != "" && sc.Layout != S3PerRecord && sc.Layout != S3PerBatch {
		return sc, bad("layout=%s: want record or batch", sc.Layout)
	}
	for param, dst := range map[string]*bool{"gzip": &sc.Gzip, "virtual_host": &sc.VirtualHost, "create_bucket": &sc.CreateBucket} {
		if v := q.Get(param); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return sc, bad("%s=%s: want true or false", param, v)
			}
			*dst = b
		}
	}
	if v := q.Get("spread"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 32 {
			return sc, bad("spread=%s: want 1..32 hex digits", v)
		}
		sc.Spread = n
	}
	if sc.Gzip && sc.Layout != S3PerBatch {
		return sc, bad("gzip=true needs layout=batch")
	}
	if sc.Endpoint != "" {
		if e, err := url.Parse(sc.Endpoint); err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return sc, bad("endpoint=%s: want http(s)://host[:port]", sc.Endpoint)
		}
	}
	return sc, nil
}

// GCSURLParams are the query parameters of a gs://bucket/prefix URL:
//
//   - endpoint: an emulator's URL, e.g. http://127.0.0.1:4443
//     (fake-gcs-server; default: Cloud Storage, or STORAGE_EMULATOR_HOST);
//   - layout: record (one object per record, named by its sink key; the
//     default) or batch (one NDJSON object per request);
//   - gzip=true: gzip the batch layout's objects;
//   - spread=N: hex digits of the batch layout's name prefix (default 2);
//   - create_bucket=true: create a missing bucket, in project;
//   - project: the project of create_bucket (required with it outside an
//     emulator).
var GCSURLParams = []string{"endpoint", "layout", "gzip", "spread", "create_bucket", "project"}

// gcsConfig reads a gs:// URL.
func gcsConfig(u *url.URL, cfg OpenConfig) (GCSConfig, error) {
	q := u.Query()
	gc := GCSConfig{
		Bucket: u.Host, Prefix: strings.TrimPrefix(u.Path, "/"), Endpoint: q.Get("endpoint"), Project: q.Get("project"),
		Layout: GCSLayout(q.Get("layout")), Timeout: cfg.Timeout, Logger: cfg.Logger,
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %q: %s", ErrSinkURL, u.Redacted(), fmt.Sprintf(format, args...))
	}
	if err := knownParams(u, GCSURLParams); err != nil {
		return gc, err
	}
	if u.User != nil {
		return gc, bad("credentials do not belong in the URL; Application Default Credentials supply them")
	}
	if !validGCSBucket(gc.Bucket) {
		return gc, bad("want gs://<bucket>[/prefix] with a bucket name of 3-63 lower-case letters, digits, '-', '_' or '.'")
	}
	if gc.Layout != "" && gc.Layout != GCSPerRecord && gc.Layout != GCSPerBatch {
		return gc, bad("layout=%s: want record or batch", gc.Layout)
	}
	for param, dst := range map[string]*bool{"gzip": &gc.Gzip, "create_bucket": &gc.CreateBucket} {
		if v := q.Get(param); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return gc, bad("%s=%s: want true or false", param, v)
			}
			*dst = b
		}
	}
	if v := q.Get("spread"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 32 {
			return gc, bad("spread=%s: want 1..32 hex digits", v)
		}
		gc.Spread = n
	}
	if gc.Gzip && gc.Layout != GCSPerBatch {
		return gc, bad("gzip=true needs layout=batch")
	}
	if gc.CreateBucket && gc.Project == "" && gc.Endpoint == "" {
		return gc, bad("create_bucket=true needs project=<project ID>")
	}
	if gc.Endpoint != "" {
		if e, err := url.Parse(gc.Endpoint); err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return gc, bad("endpoint=%s: want http(s)://host[:port]", gc.Endpoint)
		}
	}
	return gc, nil
}

// OpenSearchURLParams are the query parameters of an
// opensearch://host:port/index URL (opensearchs:// for HTTPS;
// elasticsearch:// and elasticsearchs:// alike):
//
//   - action: create (the default: a redelivery is a duplicate, 409) or
//     index (an upsert: a redelivery replaces the document);
//   - max_bytes: the most bytes of one _bulk request body, as bytes or
//     with a KiB or MiB suffix (default 5MiB, at most 100MiB, the node's
//     default http.max_content_length);
//   - max_records: the most documents of one _bulk request (default
//     1000).
//
// The port defaults to 9200. Credentials never come from the URL: the
// Authorization header (Basic for a user, ApiKey for an API key) comes
// from OpenConfig.Authorization or HeadersFile; CAFile and
// InsecureSkipVerify apply to opensearchs://.
var OpenSearchURLParams = []string{"action", "max_bytes", "max_records"}

// openSearchConfig reads an opensearch:// URL.
func openSearchConfig(u *url.URL, cfg OpenConfig) (OpenSearchConfig, error) {
	q := u.Query()
	scheme := "http"
	if strings.HasSuffix(u.Scheme, "s") {
		scheme = "https"
	}
	host := u.Host
	if u.Port() == "" && u.Hostname() != "" {
		host = net.JoinHostPort(u.Hostname(), "9200")
	}
	oc := OpenSearchConfig{
		URL: scheme + "://" + host, Index: strings.Trim(u.Path, "/"), Action: OpenSearchAction(q.Get("action")),
		CAFile: cfg.CAFile, InsecureSkipVerify: cfg.InsecureSkipVerify, Timeout: cfg.Timeout, Logger: cfg.Logger,
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %q: %s", ErrSinkURL, u.Redacted(), fmt.Sprintf(format, args...))
	}
	if err := knownParams(u, OpenSearchURLParams); err != nil {
		return oc, err
	}
	switch {
	case u.User != nil:
		return oc, bad("credentials do not belong in the URL; pass the Authorization header apart (Basic or ApiKey)")
	case u.Hostname() == "":
		return oc, bad("no host: want %s://host[:port]/index", u.Scheme)
	case !validIndex(oc.Index):
		return oc, bad("want %s://host[:port]/<index> with an index name of lower-case characters, not starting with '_', '-' or '+', without \\ / * ? \" < > | , # : or spaces", u.Scheme)
	case oc.Action != "" && oc.Action != OpenSearchCreate && oc.Action != OpenSearchIndex:
		return oc, bad("action=%s: want create or index", oc.Action)
	}
	if v := q.Get("max_records"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return oc, bad("max_records=%s: want a positive integer", v)
		}
		oc.MaxRecords = n
	}
	if v := q.Get("max_bytes"); v != "" {
		n, err := parseByteSize(v)
		if err != nil || n < 1 || n > OpenSearchMaxContentLength {
			return oc, bad("max_bytes=%s: want 1 to 100MiB (bytes, or a number with a KiB or MiB suffix)", v)
		}
		oc.MaxBytes = n
	}
	return oc, nil
}

// parseByteSize reads a size in bytes: an integer, optionally followed by
// KiB or MiB (also KB and MB, which mean the same binary multiples).
func parseByteSize(v string) (int, error) {
	mult := 1
	s := strings.TrimSpace(v)
	for suffix, m := range map[string]int{"KiB": 1 << 10, "MiB": 1 << 20, "KB": 1 << 10, "MB": 1 << 20} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = strings.TrimSpace(n), m
			break
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > OpenSearchMaxContentLength {
		return 0, fmt.Errorf("size %q: want bytes, or a number with a KiB or MiB suffix", v)
	}
	return n * mult, nil
}

// knownParams refuses query parameters other than known, so that a typo
// is not silently ignored.
func knownParams(u *url.URL, known []string) error {
	for k := range u.Query() {
		if !slices.Contains(known, k) {
			return fmt.Errorf("%w: %q: unknown option %q (want %s)", ErrSinkURL, u.Redacted(), k, strings.Join(known, ", "))
		}
	}
	return nil
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
