package sink

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/ingest"
)

// The query parameters of the cloud sinks' URLs, and the configurations
// Open builds from them.

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
