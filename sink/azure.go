package sink

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"

	"github.com/sluicehq/sluice/ingest"
)

// An entity-group transaction holds at most ingest.DefaultBatchOps (100)
// operations and ingest.DefaultBatchBytes (4 MiB), all on one PartitionKey
// ("Performing entity group transactions", Azure Table Storage REST
// reference).
const (
	// azureOpOverhead is what one operation adds to the multipart body
	// besides its entity (boundary, request line and headers), rounded up.
	azureOpOverhead = 1 << 10
	// azurePartitionBuckets is the number of default partition keys.
	azurePartitionBuckets = 64
)

// innerStatus and innerCode find a refused transaction's status and error
// code in the SDK's error text.
var (
	innerStatus = regexp.MustCompile(`HTTP/1\.1 (\d{3}) `)
	innerCode   = regexp.MustCompile(`"code":"(\w+)"`)
)

// ErrAzureConfig is wrapped by NewAzureTables errors about its configuration.
var ErrAzureConfig = errors.New("sink: azure tables config")

// AzureTablesConfig configures an AzureTablesSink.
type AzureTablesConfig struct {
	// ServiceURL is the Table service's URL, e.g.
	// "https://myaccount.table.core.windows.net" or, for Azurite,
	// "http://127.0.0.1:10102/devstoreaccount1"; required.
	ServiceURL string
	// Account and Key are the storage account's name and key (base64);
	// required. The key comes from the environment or a file, never a flag.
	Account, Key string
	// Table is the table's name (3-63 letters and digits, not starting with
	// a digit); created when missing. Required.
	Table string
	// Timeout bounds each transaction. Default DefaultTimeout.
	Timeout time.Duration
	// Batch limits each entity-group transaction; zero fields take the
	// service's maxima, 100 operations and 4 MiB, which are also the most
	// allowed.
	Batch ingest.BatchLimits
	// Logger receives the sink's events. Default slog.Default().
	Logger *slog.Logger
}

// AzureTablesSink writes records as entities of one Azure table:
//
//   - RowKey is the record's SinkKey (its ID when empty), with the characters
//     Table Storage forbids in keys ('/', '\', '#', '?' and control
//     characters) percent-encoded;
//   - PartitionKey is the record's PartitionKey; when empty, the part of
//     SinkKey before its first '/' when it has one, else "p" and a two-digit
//     bucket (00-63) of the FNV-1a hash of the RowKey, so that records spread
//     over 64 partitions;
//   - the entity's properties are "ID" (the record ID) and "Value" (the JSON
//     object, as a string: Table Storage has no nested properties).
//
// Write groups the batch by PartitionKey into entity-group transactions of
// at most 100 upserts (InsertReplace) and 4 MiB. Upserts make rewrites
// idempotent, but the service cannot tell a new entity from a replaced one:
// every stored record is Delivered, never Duplicate, except a RowKey
// repeated within one batch (Duplicate, written once). When a transaction
// is refused with a 4xx (one bad entity fails the whole group), its records
// are upserted one by one so that only the bad ones are Permanent. 408, 429
// (Throttled), 500 (OperationTimedOut), 503 (ServerBusy) and 504 are
// Retryable; transport errors fail the whole attempt. Safe for concurrent
// use.
type AzureTablesSink struct {
	client    *aztables.Client
	transport *http.Transport // nil in tests that build the struct
	timeout   time.Duration
	batch     ingest.BatchLimits
	log       *slog.Logger
}

var _ ingest.Sink = (*AzureTablesSink)(nil)

// NewAzureTables validates cfg, connects with the shared key and creates
// the table when missing. It returns an error wrapping ErrAzureConfig for a
// bad config and the service's error otherwise.
func NewAzureTables(ctx context.Context, cfg AzureTablesConfig) (*AzureTablesSink, error) {
	switch {
	case cfg.ServiceURL == "":
		return nil, fmt.Errorf("%w: service URL is required", ErrAzureConfig)
	case cfg.Account == "":
		return nil, fmt.Errorf("%w: account is required", ErrAzureConfig)
	case cfg.Key == "":
		return nil, fmt.Errorf("%w: account key is required", ErrAzureConfig)
	case !validTableName(cfg.Table):
		return nil, fmt.Errorf("%w: table %q: want 3-63 letters and digits, not starting with a digit", ErrAzureConfig, cfg.Table)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: timeout %v is negative", ErrAzureConfig, cfg.Timeout)
	case cfg.Batch.MaxOps < 0 || cfg.Batch.MaxOps > ingest.DefaultBatchOps || cfg.Batch.MaxBytes < 0 || cfg.Batch.MaxBytes > ingest.DefaultBatchBytes:
		return nil, fmt.Errorf("%w: batch limits %d operations, %d bytes: want 1..%d and 1..%d", ErrAzureConfig, cfg.Batch.MaxOps, cfg.Batch.MaxBytes, ingest.DefaultBatchOps, ingest.DefaultBatchBytes)
	}
	cred, err := aztables.NewSharedKeyCredential(cfg.Account, cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: account key: %w", ErrAzureConfig, err)
	}
	opts := &aztables.ClientOptions{}
	opts.Retry = policy.RetryOptions{MaxRetries: -1} // one attempt per Write: the worker retries
	opts.Telemetry.Disabled = true
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns, transport.MaxIdleConnsPerHost = 64, 64
	opts.Transport = &http.Client{Transport: transport}
	svc, err := aztables.NewServiceClientWithSharedKey(cfg.ServiceURL, cred, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: service URL: %w", ErrAzureConfig, err)
	}
	if _, err := svc.CreateTable(ctx, cfg.Table, nil); err != nil {
		var re *azcore.ResponseError
		if !errors.As(err, &re) || re.ErrorCode != string(aztables.TableAlreadyExists) {
			return nil, fmt.Errorf("sink: azure tables: create table %s: %w", cfg.Table, err)
		}
	}
	return &AzureTablesSink{
		client:    svc.NewClient(cfg.Table),
		transport: transport,
		timeout:   cfg.Timeout,
		batch:     cfg.Batch, // GroupBatches takes the maxima for zero fields
		log:       cmp.Or(cfg.Logger, slog.Default()),
	}, nil
}

// Warm implements ingest.Warmer: it reads the table's access policy once
// per connection wanted (up to conns at once), which opens the connections
// and checks the key and the table.
func (a *AzureTablesSink) Warm(ctx context.Context, conns int) error {
	return warmWith(ctx, conns, "azure tables", func(ctx context.Context) error {
		_, err := a.client.GetAccessPolicy(ctx, nil)
		return err
	})
}

// Close closes the idle connections to the service.
func (a *AzureTablesSink) Close() error {
	if a.transport != nil {
		a.transport.CloseIdleConnections()
	}
	return nil
}

// azureOp is one record's upsert.
type azureOp struct {
	i      int // index in the batch
	pk     string
	entity []byte
}

// Write makes one attempt to upsert batch; see AzureTablesSink.
func (a *AzureTablesSink) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	out := make([]ingest.Result, len(batch))
	var ops []azureOp
	seen := map[[2]string]bool{}
	for i, r := range batch {
		if !json.Valid(r.Value) {
			out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: "azure tables: value is not valid JSON"}
			continue
		}
		row := EscapeAzureKey(cmp.Or(r.SinkKey, r.ID))
		pk := AzurePartitionKey(r)
		if seen[[2]string{pk, row}] {
			out[i] = ingest.Result{Outcome: ingest.Duplicate}
			continue
		}
		seen[[2]string{pk, row}] = true
		entity, err := json.Marshal(map[string]string{"PartitionKey": pk, "RowKey": row, "ID": r.ID, "Value": string(r.Value)})
		if err != nil {
			out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: "azure tables: " + err.Error()}
			continue
		}
		ops = append(ops, azureOp{i: i, pk: pk, entity: entity})
	}
	groups := ingest.GroupBatches(len(ops), func(k int) string { return ops[k].pk },
		func(k int) int { return len(ops[k].entity) + azureOpOverhead }, a.batch)
	for _, g := range groups {
		tx := make([]azureOp, len(g))
		for j, k := range g {
			tx[j] = ops[k]
		}
		if err := a.submit(ctx, tx, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// submit writes one transaction and sets its records' results; it returns
// an error when the whole attempt failed (transport error, ctx done).
func (a *AzureTablesSink) submit(ctx context.Context, ops []azureOp, out []ingest.Result) error {
	actions := make([]aztables.TransactionAction, len(ops))
	for k, op := range ops {
		actions[k] = aztables.TransactionAction{ActionType: aztables.TransactionTypeInsertReplace, Entity: op.entity}
	}
	tctx, cancel := ctx, context.CancelFunc(func() {})
	if a.timeout > 0 {
		tctx, cancel = context.WithTimeout(ctx, a.timeout)
	}
	_, err := a.client.SubmitTransaction(tctx, actions, nil)
	cancel()
	if err == nil {
		for _, op := range ops {
			out[op.i] = ingest.Result{Outcome: ingest.Delivered}
		}
		return nil
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	res, perRecord := classifyAzure(err)
	if !perRecord {
		return fmt.Errorf("sink: azure tables: %w", err)
	}
	if res.Outcome == ingest.Retryable || len(ops) == 1 {
		for _, op := range ops {
			out[op.i] = res
		}
		return nil
	}
	// One bad entity fails the group: upsert one by one.
	for _, op := range ops {
		if err := a.submit(ctx, []azureOp{op}, out); err != nil {
			return err
		}
	}
	return nil
}

// classifyAzure maps a service answer to a per-record result; perRecord is
// false for errors without an answer (transport), which fail the attempt.
// Status and error codes: "Table service error codes" and "Common REST API
// error codes" in the Azure Storage REST reference.
func classifyAzure(err error) (res ingest.Result, perRecord bool) {
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return ingest.Result{}, false
	}
	status, code := re.StatusCode, re.ErrorCode
	if status < 400 {
		// A refused transaction is a 202 whose multipart body holds the
		// failed operation's answer; the SDK gives it only as text.
		msg := err.Error()
		if m := innerStatus.FindStringSubmatch(msg); m != nil {
			status, _ = strconv.Atoi(m[1])
		}
		if m := innerCode.FindStringSubmatch(msg); m != nil {
			code = m[1]
		}
	}
	reason := fmt.Sprintf("azure tables: HTTP %d %s", status, code)
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		// Credentials, a missing table, a wrong endpoint: the sink's
		// problem, not the record's.
		return ingest.Result{}, false
	case http.StatusTooManyRequests:
		return ingest.Result{Outcome: ingest.Retryable, Throttled: true, Reason: reason}, true
	case http.StatusRequestTimeout, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return ingest.Result{Outcome: ingest.Retryable, Throttled: code == "ServerBusy", Reason: reason}, true
	}
	if status >= 400 && status < 500 {
		return ingest.Result{Outcome: ingest.Permanent, Reason: reason}, true
	}
	return ingest.Result{}, false
}

// AzurePartitionKey is the PartitionKey a record is stored under; see
// AzureTablesSink.
func AzurePartitionKey(r ingest.Record) string {
	if r.PartitionKey != "" {
		return EscapeAzureKey(r.PartitionKey)
	}
	if head, _, ok := strings.Cut(r.SinkKey, "/"); ok && head != "" {
		return EscapeAzureKey(head)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(cmp.Or(r.SinkKey, r.ID)))
	return fmt.Sprintf("p%02d", h.Sum32()%azurePartitionBuckets)
}

// EscapeAzureKey percent-encodes the characters Table Storage forbids in a
// PartitionKey or RowKey ('/', '\', '#', '?', control characters) and '%'.
func EscapeAzureKey(k string) string {
	var b strings.Builder
	for _, c := range []byte(k) {
		switch {
		case c == '/', c == '\\', c == '#', c == '?', c == '%', c < 0x20, c == 0x7f:
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func validTableName(s string) bool {
	if len(s) < 3 || len(s) > 63 || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
