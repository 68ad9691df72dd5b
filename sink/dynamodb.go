package sink

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/ingest"
)

// DynamoDB's request limits ("Service, account, and table quotas in Amazon
// DynamoDB", and the BatchWriteItem API reference): at most 25 put requests
// and 16 MiB in one BatchWriteItem, at most 400 KB in one item.
const (
	DynamoDBBatchItems = 25
	DynamoDBBatchBytes = 16 << 20
	// dynamoParallel is how many requests one Write has in flight at most:
	// conditional PutItems, or BatchWriteItems of a batch above 25 items.
	dynamoParallel = 25
	// dynamoItemOverhead is what one put request adds to a BatchWriteItem
	// body besides the record's JSON (attribute types, key attributes),
	// rounded up, for the 16 MiB check.
	dynamoItemOverhead = 1 << 10
)

// DynamoDBWrite is how a DynamoDBSink writes a batch.
type DynamoDBWrite string

const (
	// DynamoDBPut writes each record with a PutItem conditioned on
	// attribute_not_exists(partition key), up to 25 at once: a record
	// whose key is stored already is refused by the condition and counted
	// Duplicate, so delivered means stored for the first time.
	DynamoDBPut DynamoDBWrite = "put"
	// DynamoDBBatch writes up to 25 records with one BatchWriteItem. A
	// batch write cannot be conditioned: a record stored again replaces
	// itself and is counted Delivered, as an upsert is.
	DynamoDBBatch DynamoDBWrite = "batch"
)

// ErrDynamoDBConfig is wrapped by NewDynamoDB errors about its configuration.
var ErrDynamoDBConfig = errors.New("sink: dynamodb config")

// DynamoDBConfig configures a DynamoDBSink. Credentials come from the AWS
// SDK's default chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and
// AWS_SESSION_TOKEN), AWS_PROFILE and the shared config files, web
// identity, the container or instance role.
type DynamoDBConfig struct {
	// Table is the table's name; required.
	Table string
	// Region is the AWS region, e.g. "eu-west-1". Defaults to the SDK's
	// (AWS_REGION, the profile); required from one or the other.
	Region string
	// Endpoint replaces the region's endpoint, e.g.
	// "http://127.0.0.1:8000" for DynamoDB Local. Default: none.
	Endpoint string
	// PartitionKeyField and SortKeyField name top-level record fields whose
	// values (a string, or a number for a key of type N) become the
	// table's partition key and sort key. Empty: the keys come from the
	// record's sink key (see DynamoDBSink).
	PartitionKeyField, SortKeyField string
	// CreateTable creates the table when it is missing, with on-demand
	// capacity and the key attributes named PartitionKey and SortKey
	// (type S). Default false: a missing table is an error.
	CreateTable bool
	// PartitionKey and SortKey name the table's key attributes. With a
	// table that exists they are checked against its key schema (empty:
	// whatever it has); CreateTable uses them (PartitionKey default "pk",
	// SortKey default none).
	PartitionKey, SortKey string
	// Write is how records are written. Default DynamoDBPut.
	Write DynamoDBWrite
	// Timeout bounds each request. Default ingest.DefaultRequestTimeout.
	Timeout time.Duration
	// ReportCharge makes the sink report the write capacity units each
	// request consumed (ReturnConsumedCapacity) as Result.Charge, for a
	// pool that counts WCU (--unit cost --cost 1/KiB). Leave it false for
	// a pool of another unit: a charge in WCU would be read in that unit.
	ReportCharge bool
	// Logger receives the sink's events. Default slog.Default().
	Logger *slog.Logger
}

// DynamoDBSink writes records as items of one DynamoDB table.
//
// An item holds the record's JSON object as attribute values (the SDK's
// attributevalue rules: strings S, numbers N, true/false BOOL, null NULL,
// objects M, arrays L), plus its key attributes, which win over fields of
// the same name:
//
//   - a table with only a partition key: the key is the record's SinkKey
//     (its ID when empty);
//   - a table with a partition key and a sort key: the sort key is the
//     SinkKey (or ID), the partition key the record's PartitionKey, else
//     the SinkKey's part before its first '/', else "p" and a two-digit
//     bucket (00-63) of the FNV-1a hash of the sort key;
//   - PartitionKeyField and SortKeyField take the keys from record fields
//     instead.
//
// With DynamoDBPut (the default) each record is one PutItem conditioned on
// attribute_not_exists(partition key), up to 25 at once; a refused
// condition (ConditionalCheckFailedException) is a Duplicate. With
// DynamoDBBatch records go in BatchWriteItems of at most 25 items and 16
// MiB, and a rewrite is Delivered. A key repeated within one batch is
// written once; its later records are Duplicate.
//
// Results and errors:
//   - UnprocessedItems of a BatchWriteItem, and
//     ProvisionedThroughputExceededException, ThrottlingException and
//     RequestLimitExceeded are throttling: the records are Retryable and
//     Throttled (the worker retries them through the pacer, which charges
//     every attempt), and when every record of a Write was throttled,
//     Write returns an *ingest.SinkError with Throttled set;
//   - a ValidationException (an item over 400 KB, a number DynamoDB cannot
//     hold, a key of the wrong type) is Permanent for its record: a
//     PutItem names its record; a refused BatchWriteItem is split in
//     halves until the refused records are alone (about 2·log2(25)
//     requests for one bad record among 25), and the others are written;
//   - a key field that is missing or of the wrong type, and a value that
//     is not a JSON object, are Permanent without a request;
//   - 5xx answers (InternalServerError) are Retryable;
//   - a failure of the whole request or of the sink — a missing table
//     (ResourceNotFoundException), refused credentials, an endpoint that
//     does not answer — is the error of Write when no record of it was
//     stored; records next to stored ones are Retryable instead, so that
//     those stored are not counted twice;
//   - when the request deadline ends a Write with some answers in, they
//     stand and the records without one are Retryable and Throttled (the
//     table is slower than the pool's rate); a put that went unanswered
//     and whose retry finds its key stored is Delivered, not Duplicate
//     (see unanswered).
//
// With ReportCharge every request asks for ReturnConsumedCapacity TOTAL:
// a PutItem's consumed WCU is its record's Charge; a BatchWriteItem's are
// shared among its stored records in proportion to their estimated costs
// (the worker charges the pacer what a Charge exceeds the estimate by, and
// learns its estimates from the ratio). Safe for concurrent use.
type DynamoDBSink struct {
	client    *dynamodb.Client
	transport *http.Transport // closed by Close
	table     string
	hashKey   dynamoKey
	rangeKey  dynamoKey // name "" when the table has no sort key
	write     DynamoDBWrite
	timeout   time.Duration
	charge    bool
	log       *slog.Logger
	condition string
	pending   unanswered // keys of puts without an answer
}

// dynamoKey is one key attribute: its name, its type (S, N or B) and the
// record field it comes from ("" for the sink key).
type dynamoKey struct {
	name, typ, field string
}

var (
	_ ingest.Sink   = (*DynamoDBSink)(nil)
	_ ingest.Warmer = (*DynamoDBSink)(nil)
)

// NewDynamoDB validates cfg, reads the table's key schema (DescribeTable;
// with CreateTable, creates a missing table and waits until it is active).
// It returns an error wrapping ErrDynamoDBConfig for a bad config or a key
// schema the sink cannot fill, and the service's error otherwise.
func NewDynamoDB(ctx context.Context, cfg DynamoDBConfig) (*DynamoDBSink, error) {
	cfg.Write = cmp.Or(cfg.Write, DynamoDBPut)
	cfg.Timeout = cmp.Or(cfg.Timeout, ingest.DefaultRequestTimeout)
	switch {
	case !validDynamoTable(cfg.Table):
		return nil, fmt.Errorf("%w: table %q: want 3-255 letters, digits, '_', '-' or '.'", ErrDynamoDBConfig, cfg.Table)
	case cfg.Write != DynamoDBPut && cfg.Write != DynamoDBBatch:
		return nil, fmt.Errorf("%w: write %q: want put or batch", ErrDynamoDBConfig, cfg.Write)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: timeout %v is negative", ErrDynamoDBConfig, cfg.Timeout)
	}
	client, transport, err := newDynamoClient(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d := &DynamoDBSink{
		client:    client,
		transport: transport,
		table:     cfg.Table,
		write:     cfg.Write,
		timeout:   cfg.Timeout,
		charge:    cfg.ReportCharge,
		log:       cmp.Or(cfg.Logger, slog.Default()),
	}
	sctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	desc, err := d.describe(sctx, cfg)
	if err != nil {
		d.Close()
		return nil, err
	}
	if err := d.readKeys(desc, cfg); err != nil {
		d.Close()
		return nil, err
	}
	d.condition = "attribute_not_exists(#k)"
	return d, nil
}

// newDynamoClient builds the SDK client: the default credential chain,
// the region and endpoint of cfg, no SDK retries (the worker retries, each
// attempt paced and charged) and a connection pool for parallel puts.
func newDynamoClient(ctx context.Context, cfg DynamoDBConfig) (*dynamodb.Client, *http.Transport, error) {
	awsCfg, transport, err := awsConfig(ctx, cfg.Region)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: AWS configuration: %w", ErrDynamoDBConfig, err)
	}
	if awsCfg.Region == "" {
		transport.CloseIdleConnections()
		return nil, nil, fmt.Errorf("%w: no region: set ?region= in the sink URL or AWS_REGION", ErrDynamoDBConfig)
	}
	client := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
			// DynamoDB Local answers errors without the x-amz-crc32
			// header DynamoDB sends, which the SDK would warn about.
			o.DisableValidateResponseChecksum = true
		}
	})
	return client, transport, nil
}

// describe reads the table's description, creating the table first when
// it is missing and cfg.CreateTable is set.
func (d *DynamoDBSink) describe(ctx context.Context, cfg DynamoDBConfig) (*types.TableDescription, error) {
	out, err := d.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(d.table)})
	if err == nil {
		return out.Table, nil
	}
	if _, missing := errors.AsType[*types.ResourceNotFoundException](err); !missing || !cfg.CreateTable {
		return nil, fmt.Errorf("sink: dynamodb: describe table %s: %w", d.table, err)
	}
	in := &dynamodb.CreateTableInput{
		TableName:   aws.String(d.table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(cmp.Or(cfg.PartitionKey, "pk")), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{{AttributeName: aws.String(cmp.Or(cfg.PartitionKey, "pk")), KeyType: types.KeyTypeHash}},
	}
	if cfg.SortKey != "" {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{AttributeName: aws.String(cfg.SortKey), AttributeType: types.ScalarAttributeTypeS})
		in.KeySchema = append(in.KeySchema, types.KeySchemaElement{AttributeName: aws.String(cfg.SortKey), KeyType: types.KeyTypeRange})
	}
	if _, err := d.client.CreateTable(ctx, in); err != nil {
		if _, exists := errors.AsType[*types.ResourceInUseException](err); !exists {
			return nil, fmt.Errorf("sink: dynamodb: create table %s: %w", d.table, err)
		}
	}
	desc, err := dynamodb.NewTableExistsWaiter(d.client).WaitForOutput(ctx,
		&dynamodb.DescribeTableInput{TableName: aws.String(d.table)}, setupTimeout)
	if err != nil {
		return nil, fmt.Errorf("sink: dynamodb: table %s did not become active: %w", d.table, err)
	}
	d.log.Info("dynamodb table created", "table", d.table)
	return desc.Table, nil
}

// readKeys takes the key schema from desc and checks it against cfg.
func (d *DynamoDBSink) readKeys(desc *types.TableDescription, cfg DynamoDBConfig) error {
	types := map[string]string{}
	for _, a := range desc.AttributeDefinitions {
		types[aws.ToString(a.AttributeName)] = string(a.AttributeType)
	}
	for _, k := range desc.KeySchema {
		key := dynamoKey{name: aws.ToString(k.AttributeName), typ: types[aws.ToString(k.AttributeName)]}
		if k.KeyType == "HASH" {
			d.hashKey = key
		} else {
			d.rangeKey = key
		}
	}
	if d.hashKey.name == "" {
		return fmt.Errorf("%w: table %s has no partition key in its description", ErrDynamoDBConfig, d.table)
	}
	if cfg.PartitionKey != "" && cfg.PartitionKey != d.hashKey.name {
		return fmt.Errorf("%w: table %s: partition key is %q, the sink URL says pk=%s", ErrDynamoDBConfig, d.table, d.hashKey.name, cfg.PartitionKey)
	}
	if cfg.SortKey != "" && cfg.SortKey != d.rangeKey.name {
		return fmt.Errorf("%w: table %s: sort key is %q, the sink URL says sk=%s", ErrDynamoDBConfig, d.table, d.rangeKey.name, cfg.SortKey)
	}
	if cfg.SortKeyField != "" && d.rangeKey.name == "" {
		return fmt.Errorf("%w: table %s has no sort key for field %q", ErrDynamoDBConfig, d.table, cfg.SortKeyField)
	}
	d.hashKey.field, d.rangeKey.field = cfg.PartitionKeyField, cfg.SortKeyField
	for _, k := range []dynamoKey{d.hashKey, d.rangeKey} {
		if k.name != "" && k.field == "" && k.typ != "S" {
			return fmt.Errorf("%w: table %s: key %s is of type %s; keys from the sink key are strings (name a record field with pk_field= or sk_field=)", ErrDynamoDBConfig, d.table, k.name, k.typ)
		}
		if k.typ == "B" {
			return fmt.Errorf("%w: table %s: key %s is binary; the sink writes string and number keys", ErrDynamoDBConfig, d.table, k.name)
		}
	}
	return nil
}

// Warm implements ingest.Warmer: it describes the table once per connection
// wanted (up to conns at once), which opens the connections and checks the
// credentials and the table.
func (d *DynamoDBSink) Warm(ctx context.Context, conns int) error {
	return warmWith(ctx, conns, "dynamodb table "+d.table, func(ctx context.Context) error {
		_, err := d.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(d.table)})
		return err
	})
}

// Close closes the idle connections.
func (d *DynamoDBSink) Close() error {
	if d.transport != nil {
		d.transport.CloseIdleConnections()
	}
	return nil
}

// dynamoOp is one record's put.
type dynamoOp struct {
	i    int // index in the batch
	key  string
	item map[string]types.AttributeValue
	size int
}

// Write makes one attempt to write batch; see DynamoDBSink.
func (d *DynamoDBSink) Write(ctx context.Context, batch []ingest.Record) ([]ingest.Result, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	out := make([]ingest.Result, len(batch))
	ops := make([]dynamoOp, 0, len(batch))
	seen := make(map[string]bool, len(batch))
	for i, r := range batch {
		item, key, reason := d.item(r)
		switch {
		case reason != "":
			out[i] = ingest.Result{Outcome: ingest.Permanent, Reason: "dynamodb: " + reason}
		case seen[key]:
			out[i] = ingest.Result{Outcome: ingest.Duplicate}
		default:
			seen[key] = true
			ops = append(ops, dynamoOp{i: i, key: key, item: item, size: len(r.Value) + dynamoItemOverhead})
		}
	}
	if len(ops) == 0 {
		return out, nil
	}
	var fails []failure
	if d.write == DynamoDBBatch {
		fails = d.writeBatches(ctx, ops, batch, out)
	} else {
		fails = d.putAll(ctx, ops, out)
	}
	sent := make([]int, len(ops))
	for k, op := range ops {
		sent[k] = op.i
	}
	return settle(ctx, "dynamodb", sent, out, fails)
}

// item builds a record's item and the key it is stored under; reason says
// why the record cannot be written.
func (d *DynamoDBSink) item(r ingest.Record) (item map[string]types.AttributeValue, key, reason string) {
	dec := json.NewDecoder(bytes.NewReader(r.Value))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil || obj == nil || dec.More() {
		return nil, "", "value is not a JSON object"
	}
	item, err := attributevalue.MarshalMap(obj)
	if err != nil {
		return nil, "", "value: " + err.Error()
	}
	sortValue := cmp.Or(r.SinkKey, r.ID)
	hash := sortValue
	if d.rangeKey.name != "" {
		hash = dynamoPartition(r, sortValue)
	}
	hv, reason := d.keyValue(d.hashKey, obj, hash)
	if reason != "" {
		return nil, "", reason
	}
	item[d.hashKey.name] = hv
	key = keyString(hv)
	if d.rangeKey.name != "" {
		rv, reason := d.keyValue(d.rangeKey, obj, sortValue)
		if reason != "" {
			return nil, "", reason
		}
		item[d.rangeKey.name] = rv
		key += "\x00" + keyString(rv)
	}
	return item, key, ""
}

// keyValue is key k's attribute value: the record field it names, else
// def (a string).
func (d *DynamoDBSink) keyValue(k dynamoKey, obj map[string]any, def string) (types.AttributeValue, string) {
	if k.field == "" {
		if def == "" {
			return nil, fmt.Sprintf("key %s would be empty", k.name)
		}
		return &types.AttributeValueMemberS{Value: def}, ""
	}
	switch v := obj[k.field].(type) {
	case string:
		if k.typ != "S" {
			return nil, fmt.Sprintf("field %q is a string; key %s is of type %s", k.field, k.name, k.typ)
		}
		if v == "" {
			return nil, fmt.Sprintf("field %q (key %s) is empty", k.field, k.name)
		}
		return &types.AttributeValueMemberS{Value: v}, ""
	case json.Number:
		if k.typ != "N" {
			return nil, fmt.Sprintf("field %q is a number; key %s is of type %s", k.field, k.name, k.typ)
		}
		return &types.AttributeValueMemberN{Value: v.String()}, ""
	case nil:
		return nil, fmt.Sprintf("field %q (key %s) is missing or null", k.field, k.name)
	default:
		return nil, fmt.Sprintf("field %q (key %s) is neither a string nor a number", k.field, k.name)
	}
}

func keyString(v types.AttributeValue) string {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return "S" + v.Value
	case *types.AttributeValueMemberN:
		return "N" + v.Value
	}
	return ""
}

// dynamoPartition is the default partition key of a table with a sort key;
// see DynamoDBSink.
func dynamoPartition(r ingest.Record, sortValue string) string {
	if r.PartitionKey != "" {
		return r.PartitionKey
	}
	if head, _, ok := strings.Cut(r.SinkKey, "/"); ok && head != "" {
		return head
	}
	return hashBucket(sortValue)
}

// hashBucket is "p" and a two-digit bucket (00-63) of key's FNV-1a hash.
func hashBucket(key string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return fmt.Sprintf("p%02d", h.Sum32()%azurePartitionBuckets)
}

func validDynamoTable(s string) bool {
	if len(s) < 3 || len(s) > 255 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}
