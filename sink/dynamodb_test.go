package sink

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink/sinktest"
)

// awsTestCredentials sets the AWS SDK's environment for the tests: the
// root user scripts/s3.sh gives MinIO, which DynamoDB Local (which takes
// any key ID of letters and digits) accepts as well. Variables already set
// are kept.
var awsTestCredentials = sync.OnceFunc(func() {
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":         "sluicetest",
		"AWS_SECRET_ACCESS_KEY":     "sluicetestsecret",
		"AWS_EC2_METADATA_DISABLED": "true",
	} {
		if os.Getenv(k) == "" {
			_ = os.Setenv(k, v)
		}
	}
})

// dynamoEndpoint is the endpoint of a real DynamoDB Local:
// SLUICE_TEST_DYNAMODB_URL, or the one scripts/dynamodb.sh starts
// (idempotent; the Makefile stops it).
func dynamoEndpoint(t testing.TB) string {
	t.Helper()
	awsTestCredentials()
	return dynamoDBService.URL(t)
}

// openDynamo opens a DynamoDBSink on a fresh table with partition key pk
// (and sort key sk when sortKey).
func openDynamo(t testing.TB, write DynamoDBWrite, sortKey bool, tweak ...func(*DynamoDBConfig)) *DynamoDBSink {
	t.Helper()
	cfg := DynamoDBConfig{
		Table: freshTable("t"), Region: "us-east-1", Endpoint: dynamoEndpoint(t),
		CreateTable: true, Write: write, Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
	}
	if sortKey {
		cfg.SortKey = "sk"
	}
	for _, f := range tweak {
		f(&cfg)
	}
	s, err := NewDynamoDB(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// dynamoStopped is a sink whose endpoint nothing listens on.
func dynamoStopped(t *testing.T, write DynamoDBWrite) ingest.Sink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	client, transport, err := newDynamoClient(t.Context(), DynamoDBConfig{Region: "us-east-1", Endpoint: "http://" + addr, Timeout: 2 * time.Second})
	require.NoError(t, err)
	s := &DynamoDBSink{client: client, transport: transport, table: "stopped", hashKey: dynamoKey{name: "pk", typ: "S"},
		write: write, timeout: 2 * time.Second, condition: "attribute_not_exists(#k)"}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// oversized is a record over DynamoDB's 400 KB item limit.
func oversized(id string) ingest.Record {
	return ingest.Record{ID: id, Value: []byte(`{"mag":1,"pad":"` + strings.Repeat("x", 410<<10) + `"}`), Cost: 1}
}

// dynamoAnswer is DynamoDB's JSON answer with error type code (its
// __type) and status, as the service sends it.
func dynamoAnswer(status int, code, message string) serverAnswer {
	return serverAnswer{status: status, header: http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		body: `{"__type":"com.amazonaws.dynamodb.v20120810#` + code + `","message":"` + message + `"}`}
}

// dynamoThrough is a sink on DynamoDB Local's table of s, through a proxy
// that answers the PutItem and BatchWriteItem requests carrying an item
// whose key starts with marker with answer, as DynamoDB answers under
// load, and forwards the others to DynamoDB Local. At the test's end it
// checks that the table holds the 25 unmarked items of dynamoMixed, and
// no marked one.
func dynamoThrough(t *testing.T, s *DynamoDBSink, marker string, answer serverAnswer) *DynamoDBSink {
	t.Helper()
	p := newAnswerProxy(t, dynamoEndpoint(t), func(r *http.Request, body []byte) (serverAnswer, bool) {
		return answer, bytes.Contains(body, []byte(`{"S":"`+marker))
	})
	t.Cleanup(func() {
		// Once written: the proxy answered the marked items' requests, and
		// DynamoDB Local stored the others, and only those.
		require.Positive(t, p.answered.Load(), "the proxy answered no request itself")
		out, err := s.client.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(s.table), ConsistentRead: aws.Bool(true)})
		require.NoError(t, err)
		for _, item := range out.Items {
			require.NotContains(t, item[s.hashKey.name].(*types.AttributeValueMemberS).Value, marker, "an answered item is not stored")
		}
		require.Len(t, out.Items, DynamoDBBatchItems, "the items forwarded are stored")
	})
	client, transport, err := newDynamoClient(t.Context(), DynamoDBConfig{Region: "us-east-1", Endpoint: p.url})
	require.NoError(t, err)
	through := &DynamoDBSink{client: client, transport: transport, table: s.table, hashKey: s.hashKey,
		write: s.write, timeout: s.timeout, condition: s.condition, log: s.log}
	t.Cleanup(func() { _ = through.Close() })
	return through
}

// dynamoMixed is 25 records and then n whose keys start with marker: with
// BatchWriteItem, the 25 go in one request and the marked ones in another.
func dynamoMixed(marker string, n int) []ingest.Record {
	batch := make([]ingest.Record, 0, DynamoDBBatchItems+n)
	for i := range DynamoDBBatchItems {
		batch = append(batch, ingest.Record{ID: fmt.Sprintf("cold-%02d", i), Value: []byte(`{"mag":1}`), Cost: 1})
	}
	for i := range n {
		batch = append(batch, ingest.Record{ID: fmt.Sprintf("%s-%d", marker, i), Value: []byte(`{"mag":2}`), Cost: 1})
	}
	return batch
}

// DynamoDB Local never throttles nor fails a request (it ignores the
// provisioned throughput), so the retryable and throttled cases put a
// proxy in front of it that answers the requests of chosen items as
// DynamoDB does — 500 InternalServerError; 400
// ProvisionedThroughputExceededException — and forwards the others, which
// DynamoDB Local stores. A stopped server (nothing listens) is a failure
// of the whole write.
func TestDynamoDBConformance(t *testing.T) {
	t.Parallel()
	for _, write := range []DynamoDBWrite{DynamoDBPut, DynamoDBBatch} {
		t.Run(string(write), func(t *testing.T) {
			t.Parallel()
			sinktest.Suite{
				Open: func(t *testing.T) ingest.Sink { return openDynamo(t, write, false) },
				// BatchWriteItem cannot be conditioned: a rewrite is an upsert.
				Upsert: write == DynamoDBBatch,
				Retryable: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
					fail := dynamoAnswer(http.StatusInternalServerError, "InternalServerError", "Internal server error")
					return dynamoThrough(t, s.(*DynamoDBSink), "fail-", fail), dynamoMixed("fail", 2)
				},
				Throttled: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
					hot := dynamoAnswer(http.StatusBadRequest, "ProvisionedThroughputExceededException",
						"The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.")
					return dynamoThrough(t, s.(*DynamoDBSink), "hot-", hot), dynamoMixed("hot", 2)
				},
				// The table is deleted under the sink: ResourceNotFoundException.
				Down: func(t *testing.T) ingest.Sink {
					s := openDynamo(t, write, false)
					_, err := s.client.DeleteTable(t.Context(), &dynamodb.DeleteTableInput{TableName: aws.String(s.table)})
					require.NoError(t, err)
					return s
				},
				Stopped: func(t *testing.T) ingest.Sink { return dynamoStopped(t, write) },
				// An item over DynamoDB's 400 KB: ValidationException.
				Bad: oversized,
			}.Run(t)
		})
	}
}

// getItem reads an item by its key attributes.
func getItem(t *testing.T, s *DynamoDBSink, key map[string]types.AttributeValue) map[string]types.AttributeValue {
	t.Helper()
	out, err := s.client.GetItem(t.Context(), &dynamodb.GetItemInput{TableName: aws.String(s.table), Key: key, ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	return out.Item
}

func countItems(t *testing.T, s *DynamoDBSink) int {
	t.Helper()
	out, err := s.client.Scan(t.Context(), &dynamodb.ScanInput{TableName: aws.String(s.table), Select: types.SelectCount})
	require.NoError(t, err)
	return int(out.Count)
}

func str(v string) *types.AttributeValueMemberS { return &types.AttributeValueMemberS{Value: v} }

func TestDynamoDBItemsAndKeys(t *testing.T) {
	t.Parallel()
	for _, write := range []DynamoDBWrite{DynamoDBPut, DynamoDBBatch} {
		t.Run(string(write), func(t *testing.T) {
			t.Parallel()
			s := openDynamo(t, write, true)
			res, err := s.Write(t.Context(), []ingest.Record{
				{ID: "us1", SinkKey: "ab/2025-05-01/us1", Value: []byte(`{"mag":4.5,"depth":10,"id":"us1","tsunami":false,"place":"","geo":{"lat":1.25,"lon":-2},"tags":["a",1],"note":null,"sk":"overwritten"}`)},
				{ID: "us2", PartitionKey: "given", Value: []byte(`{"mag":1}`)},
				{ID: "us3", Value: []byte(`{"mag":2}`)},
				{ID: "us3-again", SinkKey: "us3", Value: []byte(`{"mag":2}`)}, // the same key in the batch
				{ID: "arr", Value: []byte(`[1,2]`)},
			})
			require.NoError(t, err)
			require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered, ingest.Delivered, ingest.Duplicate, ingest.Permanent}, outcomesOf(res))
			require.Contains(t, res[4].Reason, "not a JSON object")

			item := getItem(t, s, map[string]types.AttributeValue{"pk": str("ab"), "sk": str("ab/2025-05-01/us1")})
			require.Equal(t, &types.AttributeValueMemberN{Value: "4.5"}, item["mag"])
			require.Equal(t, &types.AttributeValueMemberN{Value: "10"}, item["depth"])
			require.Equal(t, &types.AttributeValueMemberBOOL{Value: false}, item["tsunami"])
			require.Equal(t, str(""), item["place"])
			require.Equal(t, &types.AttributeValueMemberNULL{Value: true}, item["note"])
			require.Equal(t, str("ab/2025-05-01/us1"), item["sk"], "the key attribute wins over the field")
			geo := item["geo"].(*types.AttributeValueMemberM).Value
			require.Equal(t, &types.AttributeValueMemberN{Value: "1.25"}, geo["lat"])
			tags := item["tags"].(*types.AttributeValueMemberL).Value
			require.Equal(t, []types.AttributeValue{str("a"), &types.AttributeValueMemberN{Value: "1"}}, tags)

			require.NotEmpty(t, getItem(t, s, map[string]types.AttributeValue{"pk": str("given"), "sk": str("us2")}))
			require.NotEmpty(t, getItem(t, s, map[string]types.AttributeValue{"pk": str(hashBucket("us3")), "sk": str("us3")}),
				"no partition key nor '/': a hash bucket of the sort key")
			require.Equal(t, 3, countItems(t, s))
		})
	}
}

// Keys from record fields: a number key, checked against the table's type
// before any request.
func TestDynamoDBKeysFromFields(t *testing.T) {
	t.Parallel()
	endpoint := dynamoEndpoint(t)
	table := freshTable("num")
	admin := openDynamo(t, DynamoDBPut, false)
	_, err := admin.client.CreateTable(t.Context(), &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("code"), AttributeType: types.ScalarAttributeTypeN}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("code"), KeyType: types.KeyTypeHash}},
	})
	require.NoError(t, err)

	_, err = NewDynamoDB(t.Context(), DynamoDBConfig{Table: table, Region: "us-east-1", Endpoint: endpoint})
	require.ErrorIs(t, err, ErrDynamoDBConfig, "a number key cannot come from the sink key")
	require.ErrorContains(t, err, "pk_field")
	_, err = NewDynamoDB(t.Context(), DynamoDBConfig{Table: table, Region: "us-east-1", Endpoint: endpoint, PartitionKey: "id"})
	require.ErrorContains(t, err, `partition key is "code"`)

	s, err := NewDynamoDB(t.Context(), DynamoDBConfig{Table: table, Region: "us-east-1", Endpoint: endpoint, PartitionKeyField: "code"})
	require.NoError(t, err)
	defer s.Close()
	res, err := s.Write(t.Context(), []ingest.Record{
		{ID: "a", Value: []byte(`{"code":12345678901234567890,"mag":1}`)},
		{ID: "b", Value: []byte(`{"code":"12","mag":1}`)},
		{ID: "c", Value: []byte(`{"mag":1}`)},
		{ID: "d", Value: []byte(`{"code":12345678901234567890,"mag":2}`)},
	})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Permanent, ingest.Duplicate}, outcomesOf(res))
	require.Contains(t, res[1].Reason, `field "code" is a string; key code is of type N`)
	require.Contains(t, res[2].Reason, `field "code" (key code) is missing`)
	item := getItem(t, s, map[string]types.AttributeValue{"code": &types.AttributeValueMemberN{Value: "12345678901234567890"}})
	require.Equal(t, &types.AttributeValueMemberN{Value: "1"}, item["mag"], "the number key kept all its digits")
}

// With a pool in WCU the sink reports what DynamoDB consumed: 1 WCU per
// started KiB of the item.
func TestDynamoDBReportsConsumedWCU(t *testing.T) {
	t.Parallel()
	value := []byte(`{"mag":1,"pad":"` + strings.Repeat("x", 2500) + `"}`) // 3 started KiB
	for _, write := range []DynamoDBWrite{DynamoDBPut, DynamoDBBatch} {
		t.Run(string(write), func(t *testing.T) {
			t.Parallel()
			s := openDynamo(t, write, false, func(c *DynamoDBConfig) { c.ReportCharge = true })
			res, err := s.Write(t.Context(), []ingest.Record{{ID: "a", Value: value, Cost: 1}, {ID: "b", Value: value, Cost: 1}})
			require.NoError(t, err)
			require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Delivered}, outcomesOf(res))
			if write == DynamoDBPut {
				require.Equal(t, []int64{3, 3}, []int64{res[0].Charge, res[1].Charge})
			} else {
				// 6 WCU for the request, shared by the estimates (1 and 1).
				require.Equal(t, []int64{3, 3}, []int64{res[0].Charge, res[1].Charge})
			}
			plain := openDynamo(t, write, false)
			res, err = plain.Write(t.Context(), []ingest.Record{{ID: "a", Value: value, Cost: 1}})
			require.NoError(t, err)
			require.Zero(t, res[0].Charge, "no charge for a pool of another unit")
		})
	}
}

// One bad item among 25 in a BatchWriteItem: the halves find it, its
// neighbours are stored.
func TestDynamoDBBatchSplitFindsTheBadItem(t *testing.T) {
	t.Parallel()
	s := openDynamo(t, DynamoDBBatch, false)
	batch := make([]ingest.Record, 60) // 3 requests: 25, 25, 10
	for i := range batch {
		batch[i] = ingest.Record{ID: fmt.Sprintf("r%02d", i), Value: []byte(`{"mag":1}`), Cost: 1}
	}
	batch[7], batch[41] = oversized("big7"), oversized("big41")
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	for i, r := range res {
		want := ingest.Delivered
		if i == 7 || i == 41 {
			want = ingest.Permanent
			require.Contains(t, r.Reason, "ValidationException")
		}
		require.Equal(t, want, r.Outcome, "record %d: %s", i, r.Reason)
	}
	require.Equal(t, 58, countItems(t, s))
}

// dynamoFake answers every request with status and body, the way DynamoDB
// answers under throttling (DynamoDB Local never throttles).
func dynamoFake(t *testing.T, write DynamoDBWrite, answer func(target string, body []byte) (int, string)) *DynamoDBSink {
	t.Helper()
	awsTestCredentials()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		status, out := answer(r.Header.Get("X-Amz-Target"), body)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(out))), 10))
		w.WriteHeader(status)
		_, _ = io.WriteString(w, out)
	}))
	t.Cleanup(srv.Close)
	client, transport, err := newDynamoClient(t.Context(), DynamoDBConfig{Region: "us-east-1", Endpoint: srv.URL, Timeout: 2 * time.Second})
	require.NoError(t, err)
	s := &DynamoDBSink{client: client, transport: transport, table: "quakes", hashKey: dynamoKey{name: "pk", typ: "S"},
		write: write, timeout: 2 * time.Second, condition: "attribute_not_exists(#k)"}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestDynamoDBThrottling(t *testing.T) {
	t.Parallel()
	recs := []ingest.Record{{ID: "a", Value: []byte(`{"mag":1}`)}, {ID: "b", Value: []byte(`{"mag":2}`)}}
	throttled := `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"The level of configured provisioned throughput for the table was exceeded."}`
	for _, code := range []string{"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"} {
		for _, write := range []DynamoDBWrite{DynamoDBPut, DynamoDBBatch} {
			s := dynamoFake(t, write, func(string, []byte) (int, string) {
				return 400, strings.ReplaceAll(throttled, "ProvisionedThroughputExceededException", code)
			})
			_, err := s.Write(t.Context(), recs)
			se := (*ingest.SinkError)(nil)
			require.ErrorAs(t, err, &se, "%s %s", write, code)
			require.True(t, se.Throttled, "%s %s", write, code)
		}
	}

	// A BatchWriteItem that stored a and left b unprocessed: b is retried
	// through the pacer, throttled.
	s := dynamoFake(t, DynamoDBBatch, func(string, []byte) (int, string) {
		return 200, `{"UnprocessedItems":{"quakes":[{"PutRequest":{"Item":{"pk":{"S":"b"},"mag":{"N":"2"}}}}]}}`
	})
	res, err := s.Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)
	require.Equal(t, ingest.Retryable, res[1].Outcome)
	require.True(t, res[1].Throttled)

	// Every item unprocessed: the request was throttled as a whole.
	s = dynamoFake(t, DynamoDBBatch, func(string, []byte) (int, string) {
		return 200, `{"UnprocessedItems":{"quakes":[{"PutRequest":{"Item":{"pk":{"S":"a"}}}},{"PutRequest":{"Item":{"pk":{"S":"b"}}}}]}}`
	})
	_, err = s.Write(t.Context(), recs)
	se := (*ingest.SinkError)(nil)
	require.ErrorAs(t, err, &se)
	require.True(t, se.Throttled)

	// One put throttled, the other stored: a per-record result.
	s = dynamoFake(t, DynamoDBPut, func(_ string, body []byte) (int, string) {
		if bytes.Contains(body, []byte(`"S":"b"`)) {
			return 400, throttled
		}
		return 200, `{}`
	})
	res, err = s.Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Retryable}, outcomesOf(res))
	require.True(t, res[1].Throttled)

	// The request deadline with one answer in: it stands, and the record
	// without one is retried as throttled (the server is too slow); its
	// retry finds it stored by that unanswered put: delivered, not a
	// duplicate. A later redelivery is a duplicate.
	release := make(chan struct{})
	var calls atomic.Int32
	s = dynamoFake(t, DynamoDBPut, func(_ string, body []byte) (int, string) {
		if !bytes.Contains(body, []byte(`"S":"b"`)) {
			return 200, `{}`
		}
		if calls.Add(1) == 1 {
			<-release
			return 200, `{}`
		}
		return 400, `{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"}`
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	res, err = s.Write(ctx, recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Retryable}, outcomesOf(res))
	require.True(t, res[1].Throttled)
	close(release)
	res, err = s.Write(t.Context(), recs[1:])
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered}, outcomesOf(res))
	res, err = s.Write(t.Context(), recs[1:])
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Duplicate}, outcomesOf(res))

	// A 500 for every request: retried, never dead-lettered.
	s = dynamoFake(t, DynamoDBPut, func(string, []byte) (int, string) {
		return 500, `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"boom"}`
	})
	res, err = s.Write(t.Context(), recs)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Retryable, ingest.Retryable}, outcomesOf(res))
}

func TestShareCharge(t *testing.T) {
	t.Parallel()
	batch := []ingest.Record{{Cost: 1}, {Cost: 2}, {Cost: 1}, {Cost: 3}}
	out := make([]ingest.Result, len(batch))
	shareCharge(out, batch, []int{0, 1, 3}, 13) // estimates 1+2+3 = 6
	require.Equal(t, []int64{2, 4, 0, 7}, []int64{out[0].Charge, out[1].Charge, out[2].Charge, out[3].Charge})
	out = make([]ingest.Result, len(batch))
	shareCharge(out, batch, []int{0, 2}, 3)
	require.Equal(t, int64(3), out[0].Charge+out[2].Charge, "the shares add up to the request's charge")
}

func TestClassifyDynamo(t *testing.T) {
	t.Parallel()
	s := dynamoFake(t, DynamoDBPut, func(string, []byte) (int, string) {
		return 400, `{"__type":"com.amazon.coral.service#UnrecognizedClientException","message":"The security token included in the request is invalid."}`
	})
	_, err := s.Write(t.Context(), []ingest.Record{{ID: "a", Value: []byte(`{}`)}})
	require.ErrorContains(t, err, "UnrecognizedClientException", "refused credentials fail the whole write")
}

func TestNewDynamoDBRejectsBadConfig(t *testing.T) {
	t.Parallel()
	awsTestCredentials()
	for _, cfg := range []DynamoDBConfig{
		{Table: "ab", Region: "us-east-1"},
		{Table: "a b c", Region: "us-east-1"},
		{Table: "quakes", Region: "us-east-1", Write: "merge"},
		{Table: "quakes", Region: "us-east-1", Timeout: -1},
	} {
		_, err := NewDynamoDB(t.Context(), cfg)
		require.ErrorIs(t, err, ErrDynamoDBConfig, "%+v", cfg)
	}
	// A missing table without create_table: the service's error, at open.
	_, err := NewDynamoDB(t.Context(), DynamoDBConfig{Table: "missing_table", Region: "us-east-1", Endpoint: dynamoEndpoint(t)})
	require.ErrorContains(t, err, "ResourceNotFoundException")
}

func TestOpenDynamoDBFromURL(t *testing.T) {
	t.Parallel()
	endpoint := dynamoEndpoint(t)
	table := freshTable("open")
	s, err := Open(t.Context(), "dynamodb://"+table+"?region=us-east-1&create_table=true&sk=sk&write=batch&endpoint="+endpoint, OpenConfig{Unit: ingest.UnitCost})
	require.NoError(t, err)
	defer s.Close()
	ds := s.(*DynamoDBSink)
	require.Equal(t, DynamoDBBatch, ds.write)
	require.True(t, ds.charge, "a pool in cost units gets the consumed WCU")
	require.Equal(t, "sk", ds.rangeKey.name)
	require.NoError(t, ds.Warm(t.Context(), 4))
	res, err := s.Write(t.Context(), []ingest.Record{{ID: "x", SinkKey: "p1/x", Value: []byte(`{}`)}})
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)

	for _, bad := range []string{
		"dynamodb://ab?region=us-east-1",
		"dynamodb://quakes/extra?region=us-east-1",
		"dynamodb://quakes?region=us-east-1&write=merge",
		"dynamodb://quakes?region=us-east-1&create_table=maybe",
		"dynamodb://quakes?region=us-east-1&endpoint=127.0.0.1:8000",
		"dynamodb://quakes?region=us-east-1&pk_feld=id",
		"dynamodb://key:secret@quakes?region=us-east-1",
	} {
		require.ErrorIs(t, CheckURL(bad), ErrSinkURL, bad)
	}
	require.NoError(t, CheckURL("dynamodb://quakes?region=eu-west-1&pk_field=id"))
}

// BenchmarkDynamoDBWrite measures unthrottled writes into DynamoDB Local,
// by write mode and batch size:
// go test -run '^$' -bench DynamoDBWrite ./sink/
func BenchmarkDynamoDBWrite(b *testing.B) {
	for _, write := range []DynamoDBWrite{DynamoDBPut, DynamoDBBatch} {
		for _, size := range []int{25, 100, 500} {
			b.Run(fmt.Sprintf("write=%s/batch=%d", write, size), func(b *testing.B) {
				s := openDynamo(b, write, false)
				value := []byte(`{"mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`)
				n := 0
				for b.Loop() {
					batch := make([]ingest.Record, size)
					for i := range batch {
						n++
						batch[i] = ingest.Record{ID: fmt.Sprintf("r%09d", n), Value: value}
					}
					res, err := s.Write(b.Context(), batch)
					if err != nil {
						b.Fatal(err)
					}
					for _, r := range res {
						if r.Outcome != ingest.Delivered {
							b.Fatal(r.Outcome, r.Reason)
						}
					}
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
			})
		}
	}
}
