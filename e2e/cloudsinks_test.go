//go:build e2e

package e2e

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"
)

// The cloud sinks' servers (make e2e starts them with these defaults):
// DynamoDB Local (scripts/dynamodb.sh) and MinIO (scripts/s3.sh).
var (
	dynamoEndpoint = cmp.Or(os.Getenv("SLUICE_E2E_DYNAMODB_URL"), "http://127.0.0.1:18000")
	s3Endpoint     = cmp.Or(os.Getenv("SLUICE_E2E_S3_URL"), "http://127.0.0.1:19000")
)

// awsEnv gives this process and the sluice processes it starts the AWS
// SDK's credentials: scripts/s3.sh's MinIO root user, which DynamoDB Local
// (any key ID of letters and digits) accepts too.
var awsEnv = sync.OnceFunc(func() {
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":         cmp.Or(os.Getenv("SLUICE_S3_ACCESS_KEY"), "sluicetest"),
		"AWS_SECRET_ACCESS_KEY":     cmp.Or(os.Getenv("SLUICE_S3_SECRET_KEY"), "sluicetestsecret"),
		"AWS_REGION":                "us-east-1",
		"AWS_EC2_METADATA_DISABLED": "true",
	} {
		if os.Getenv(k) == "" {
			_ = os.Setenv(k, v)
		}
	}
})

func awsConfig(t *testing.T) aws.Config {
	t.Helper()
	awsEnv()
	cfg, err := config.LoadDefaultConfig(t.Context(), config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired))
	require.NoError(t, err)
	return cfg
}

// meter is a reverse proxy in front of a real server that counts the
// units each write request carries at the moment it reaches the server's
// door, for the sink-side busiest second (neither DynamoDB Local nor
// MinIO reports one).
type meter struct {
	srv   *httptest.Server
	units func(r *http.Request, body []byte) int64 // 0: not a write
	mu    sync.Mutex
	at    []time.Time
	n     []int64
}

func newMeter(t *testing.T, target string, units func(r *http.Request, body []byte) int64) *meter {
	u, err := url.Parse(target)
	require.NoError(t, err)
	m := &meter{units: units}
	proxy := httputil.NewSingleHostReverseProxy(u)
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if n := m.units(r, body); n > 0 {
			m.mu.Lock()
			m.at, m.n = append(m.at, time.Now()), append(m.n, n)
			m.mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(m.srv.Close)
	return m
}

// busiest returns the most units in any sliding second, and the total.
func (m *meter) busiest() (max1s, total int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum int64
	lo := 0
	for hi := range m.at {
		sum += m.n[hi]
		total += m.n[hi]
		for m.at[hi].Sub(m.at[lo]) >= time.Second {
			sum -= m.n[lo]
			lo++
		}
		max1s = max(max1s, sum)
	}
	return max1s, total
}

// dynamoUnits counts a DynamoDB write request's items, 1 WCU each (every
// USGS item is under 1 KiB).
func dynamoUnits(r *http.Request, body []byte) int64 {
	switch target := r.Header.Get("X-Amz-Target"); {
	case strings.HasSuffix(target, ".PutItem"):
		return 1
	case strings.HasSuffix(target, ".BatchWriteItem"):
		return int64(bytes.Count(body, []byte(`"PutRequest"`)))
	}
	return 0
}

// s3Units counts PUT requests of objects.
func s3Units(r *http.Request, _ []byte) int64 {
	if r.Method == http.MethodPut && strings.Count(strings.Trim(r.URL.Path, "/"), "/") >= 1 {
		return 1
	}
	return 0
}

// loadTwice bulk-loads the USGS file through sinkURL, then again with
// --no-resume (every record produced and written again), and checks both
// summaries: the first run stores every record, the second finds them all
// stored (but for the few writes of its own that went unanswered, which
// the sink counts as delivered when their retry finds them stored);
// nothing dead-lettered; every sliding second within the pool's capacity
// at the server's door.
func loadTwice(t *testing.T, e *env, m *meter, sinkURL string, extra ...string) {
	for run := range 2 {
		args, summary, _ := e.bulkLoadArgs(sinkURL, usgs, extra...)
		if run == 1 {
			args = slices.Insert(args, len(args)-1, "--no-resume")
		}
		began := time.Now()
		code, out := e.run(5*time.Minute, args...)
		require.Equal(t, 0, code, out)
		s := readSummaryFile(t, summary)
		t.Logf("run %d in %s: delivered %d, duplicates %d, dead-lettered %d, requests %d, attempts %d, throttled %d, failed writes %d, send max 1 s %d of %.0f, utilization %.3f",
			run+1, time.Since(began).Round(time.Millisecond), s.RecordsDelivered, s.DuplicatesAtSink, s.RecordsDeadLettered,
			s.SinkRequests, s.SinkRecordAttempts, s.SinkThrottled, s.SinkFailedWrites, s.SendMaxUnits1s, s.CapacityUnitsPerS, s.Utilization)
		require.EqualValues(t, usgsRecords, s.RecordsProduced, "run %d produced the whole file", run+1)
		require.EqualValues(t, usgsRecords, s.RecordsDelivered+s.DuplicatesAtSink, "run %d: every record stored or found stored", run+1)
		if run == 0 {
			require.Zero(t, s.DuplicatesAtSink, "run 1: every record stored for the first time")
		} else {
			require.LessOrEqual(t, s.RecordsDelivered, int64(usgsRecords/100), "run 2: nothing new was stored")
		}
		require.Zero(t, s.RecordsDeadLettered)
		require.LessOrEqual(t, float64(s.SendMaxUnits1s), s.CapacityUnitsPerS, "run %d: a sliding second over capacity at send time", run+1)
	}
	max1s, total := m.busiest()
	t.Logf("at the server's door: %d units in all, busiest sliding second %d (%.3f of %d)", total, max1s, float64(max1s)/float64(e.capacity), e.capacity)
	require.LessOrEqual(t, float64(max1s), 1.01*float64(e.capacity), "a sliding second over capacity at the server")
	require.GreaterOrEqual(t, total, int64(2*usgsRecords), "every record went to the server in each run")
}

// The USGS file into DynamoDB Local twice, conditional puts, WCU as the
// pool's unit (1 WCU per started KiB): 9,366 items, each stored once.
func TestBulkLoadIntoDynamoDBTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 200, 4, 5*time.Second)
	awsEnv()
	m := newMeter(t, dynamoEndpoint, dynamoUnits)
	table := e.name
	sinkURL := "dynamodb://" + table + "?region=us-east-1&create_table=true&endpoint=" + url.QueryEscape(m.srv.URL)
	loadTwice(t, e, m, sinkURL, "--unit", "cost", "--cost", "1/KiB")

	client := dynamodb.NewFromConfig(awsConfig(t), func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(dynamoEndpoint) })
	var items int32
	var start map[string]dtypes.AttributeValue
	ids := map[string]bool{}
	for {
		out, err := client.Scan(t.Context(), &dynamodb.ScanInput{TableName: aws.String(table), ExclusiveStartKey: start, ProjectionExpression: aws.String("pk")})
		require.NoError(t, err)
		items += out.Count
		for _, it := range out.Items {
			ids[it["pk"].(*dtypes.AttributeValueMemberS).Value] = true
		}
		if start = out.LastEvaluatedKey; start == nil {
			break
		}
	}
	require.EqualValues(t, usgsRecords, items, "items in the table")
	require.Len(t, ids, usgsRecords, "one item per record ID")
}

// The USGS file into MinIO twice, one object per record named by a
// hash-prefix:2 sink key, PUT requests as the pool's unit: 9,366 objects
// spread over the 256 two-hex-digit prefixes, each stored once.
func TestBulkLoadIntoS3Twice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 300, 6, 5*time.Second)
	awsEnv()
	m := newMeter(t, s3Endpoint, s3Units)
	bucket := fmt.Sprintf("e2e-quakes-%d", rand.IntN(1_000_000))
	sinkURL := "s3://" + bucket + "/quakes?create_bucket=true&endpoint=" + url.QueryEscape(m.srv.URL)
	loadTwice(t, e, m, sinkURL, "--sink-key", "{id}", "--sink-key-strategy", "hash-prefix:2")

	client := s3.NewFromConfig(awsConfig(t), func(o *s3.Options) { o.BaseEndpoint, o.UsePathStyle = aws.String(s3Endpoint), true })
	prefixes := map[string]int{}
	objects, sample := 0, ""
	p := s3.NewListObjectsV2Paginator(client, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String("quakes/")})
	for p.HasMorePages() {
		page, err := p.NextPage(t.Context())
		require.NoError(t, err)
		for _, o := range page.Contents {
			objects++
			sample = aws.ToString(o.Key)
			name := strings.TrimPrefix(aws.ToString(o.Key), "quakes/")
			require.Regexp(t, `^[0-9a-f]{2}/[a-z0-9]+\.json$`, name)
			prefixes[name[:2]]++
		}
	}
	require.Equal(t, usgsRecords, objects, "objects in the bucket")
	busiest := 0
	for _, n := range prefixes {
		busiest = max(busiest, n)
	}
	t.Logf("%d objects over %d prefixes, the fullest with %d", objects, len(prefixes), busiest)
	require.Len(t, prefixes, 256, "the names reach every two-hex-digit prefix")

	// One object holds its record's JSON.
	out, err := client.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(sample)})
	require.NoError(t, err)
	defer out.Body.Close()
	var rec map[string]any
	require.NoError(t, json.NewDecoder(out.Body).Decode(&rec))
	require.Contains(t, rec, "mag")
}
