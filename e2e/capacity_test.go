//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sinkwire"
)

// withFlag returns args with the value after flag replaced (appended when
// args do not have flag).
func withFlag(args []string, flag, value string) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		if a == flag && i+1 < len(out) {
			out[i+1] = value
			return out
		}
	}
	return append(out, flag, value)
}

// synthetic writes a CSV of n records with unique IDs (prefix-0, ...) shaped
// like the USGS file's rows, and returns its path.
func synthetic(t *testing.T, prefix string, n int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("id,time,mag,place\n")
	for i := range n {
		fmt.Fprintf(&b, "%s-%d,2025-05-01T00:%02d:%02d.000Z,%d.%d,\"%d km N of somewhere\"\n", prefix, i, i/60%60, i%60, i%7, i%10, i%97)
	}
	path := filepath.Join(t.TempDir(), prefix+".csv")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// poolCapacity is the pool's capacity in force, -1 while it is not
// defined.
func (e *env) poolCapacity() float64 {
	e.t.Helper()
	code, out := e.run(20*time.Second, "pool", "status", "--redis-addr", e.redis, "--pool", e.name, "--json")
	if code != 0 {
		return -1
	}
	var st lease.PoolStatus
	require.NoError(e.t, json.Unmarshal([]byte(out), &st), out)
	return st.Pool.Capacity
}

// busiestSince returns the most units the sink accepted in any sliding
// second (five consecutive 200 ms steps of its series) that starts at or
// after from, and the series from there.
func busiestSince(st sinkwire.Stats, from time.Time) (int64, []int64) {
	first := 0
	if d := from.Sub(st.SeriesStart); d > 0 {
		first = min(int((d+200*time.Millisecond-1)/(200*time.Millisecond)), len(st.UnitsPer200ms))
	}
	var most int64
	for i := first; i+5 <= len(st.UnitsPer200ms); i++ {
		var sum int64
		for _, n := range st.UnitsPer200ms[i : i+5] {
			sum += n
		}
		most = max(most, sum)
	}
	return most, st.UnitsPer200ms[first:]
}

// Issue 29 (a): a rolling "upgrade" that changes the pool through the
// deployment's values. Three workers run with capacity 2,000 and
// --pool-definition apply, as the chart starts them; three new ones start
// with capacity 1,000, and the first of them applies it as a live change
// (a decrease: at once) instead of refusing to start; the old ones adopt
// it and are stopped one by one. No process exits non-zero, no sliding
// second at the sink after the switch holds more than 1,000, and every
// record is stored once.
func TestRollingUpgradeAppliesThePoolDefinition(t *testing.T) {
	t.Parallel()
	const n = 24000
	e := newEnv(t, 2000, 20, 6*time.Second)
	var old []*proc
	for i := range 3 {
		old = append(old, e.worker(fmt.Sprintf("old%d", i+1), "--pool-definition", "apply"))
	}
	e.awaitGroup(3)
	code, out := e.run(2*time.Minute, "produce", "--brokers", brokers, "--topic", e.name, "--id-field", "id", synthetic(t, "up", n))
	require.Equal(t, 0, code, out)
	e.awaitAccepted(6000, time.Minute)

	var fresh []*proc
	for i := range 3 {
		args := append(append([]string{"worker", "--worker-id", fmt.Sprintf("new%d", i+1)}, e.common()...), "--pool-definition", "apply")
		fresh = append(fresh, e.start(fmt.Sprintf("new%d", i+1), withFlag(args, "--capacity", "1000")...))
	}
	var st = e.pool()
	require.Eventually(t, func() bool { st = e.pool(); return st.Pool.Capacity == 1000 }, 20*time.Second, 100*time.Millisecond,
		"the new deployment's capacity was applied")
	require.NotNil(t, st.Pool.Switch)
	switchAt := st.Pool.Switch.At
	t.Logf("capacity 1,000 applied, switching at %s; changes: %v", switchAt.Format(time.RFC3339Nano), st.Pool.Changes)
	for _, p := range old {
		time.Sleep(2 * time.Second)
		p.signal(t, syscall.SIGTERM)
		code, ok := p.wait(30 * time.Second)
		require.True(t, ok, "%s did not stop", p.name)
		require.Zero(t, code, "%s exited non-zero", p.name)
	}
	sink := e.awaitAccepted(n, 2*time.Minute)
	for _, p := range fresh {
		p.signal(t, syscall.SIGTERM)
		code, ok := p.wait(30 * time.Second)
		require.True(t, ok, "%s did not stop", p.name)
		require.Zero(t, code, "%s exited non-zero", p.name)
	}
	after, series := busiestSince(sink, switchAt)
	t.Logf("sink: accepted %d, duplicates %d, throttled %d; busiest second before the switch %d, after it %d; units per 200 ms after it %v",
		sink.Accepted, sink.Duplicates, sink.Throttled, sink.MaxUnits1s, after, series)
	// Each record is stored once; the consumer group's rebalances as the
	// new pods join redeliver a few records in flight, which the sink
	// recognises by their IDs (Duplicates).
	require.EqualValues(t, n, sink.Accepted, "every record at the sink, once")
	require.LessOrEqual(t, after, int64(1000), "busiest second after the switch")
	require.Greater(t, after, int64(900), "the new capacity is used")
}

// Issue 29: two deployments that keep disagreeing about a pool. A applies
// 2,000, B applies 1,000, A again 2,000 (a rollback is allowed once); B
// again would change it back a second time: refused with exit 2 and an
// error naming both definitions and the workers that applied them.
func TestDisagreeingDeploymentsAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2000, 10, 6*time.Second)
	start := func(id, capacity string) *proc {
		args := append(append([]string{"worker", "--worker-id", id}, e.common()...), "--pool-definition", "apply")
		return e.start(id, withFlag(args, "--capacity", capacity)...)
	}
	capacityIs := func(c float64) {
		require.Eventually(t, func() bool { return e.poolCapacity() == c }, 20*time.Second, 100*time.Millisecond)
	}
	a1 := start("deploy-a-1", "2000")
	capacityIs(2000)
	b1 := start("deploy-b-1", "1000")
	capacityIs(1000)
	time.Sleep(1500 * time.Millisecond) // past the switch
	a2 := start("deploy-a-2", "2000")
	capacityIs(2000)
	time.Sleep(6 * time.Second) // past the raise's switch (a renewal interval)
	b2 := start("deploy-b-2", "1000")
	code, ok := b2.wait(30 * time.Second)
	require.True(t, ok, "the flapping deployment's worker did not exit")
	require.Equal(t, 2, code)
	data, err := os.ReadFile(b2.log)
	require.NoError(t, err)
	log := string(data)
	t.Logf("the refused worker said: %s", strings.TrimSpace(log[strings.LastIndex(strings.TrimSpace(log), "\n")+1:]))
	require.Contains(t, log, "definition flapping")
	for _, want := range []string{"capacity 2000 records/s", "capacity 1000 records/s", "deploy-a-1", "deploy-b-1", "deploy-a-2", "deploy-b-2"} {
		require.Contains(t, log, want)
	}
	require.EqualValues(t, 2000, e.pool().Pool.Capacity, "the pool stays as it was")
	for _, p := range []*proc{a1, b1, a2} {
		p.signal(t, syscall.SIGTERM)
		code, ok := p.wait(30 * time.Second)
		require.True(t, ok)
		require.Zero(t, code, "%s", p.name)
	}
}

// busiestBetween returns the most units that reached the meter in any
// sliding second lying within [from, to).
func (m *meter) busiestBetween(from, to time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var most int64
	for i, at := range m.at {
		if at.Before(from) || at.Add(time.Second).After(to) {
			continue
		}
		var sum int64
		for j := i; j < len(m.at) && m.at[j].Sub(at) < time.Second; j++ {
			sum += m.n[j]
		}
		most = max(most, sum)
	}
	return most
}

// total returns the units that reached the meter so far.
func (m *meter) total() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var sum int64
	for _, n := range m.n {
		sum += n
	}
	return sum
}

// Issue 28: a pool whose capacity is the DynamoDB table's. The table is
// created at 200 WCU and the USGS file bulk-loaded with --capacity sink
// (WCU: --unit cost --cost 1/KiB, read every 2 s): the pool runs at 200.
// UpdateTable to 100 WCU mid-load: from one poll interval and a second
// after it, no sliding second at DynamoDB Local's door holds more than
// 100 WCU. Back to 300: the pool follows at the switch instant (and uses
// it). Every record is stored once.
func TestCapacityFollowsTheDynamoDBTable(t *testing.T) {
	t.Parallel()
	const poll = 2 * time.Second
	e := newEnv(t, 200, 4, 6*time.Second)
	awsEnv()
	m := newMeter(t, dynamoEndpoint, dynamoUnits)
	client := dynamodb.NewFromConfig(awsConfig(t), func(o *dynamodb.Options) { o.BaseEndpoint = aws.String(dynamoEndpoint) })
	table := e.name
	_, err := client.CreateTable(t.Context(), &dynamodb.CreateTableInput{
		TableName:             aws.String(table),
		AttributeDefinitions:  []dtypes.AttributeDefinition{{AttributeName: aws.String("pk"), AttributeType: dtypes.ScalarAttributeTypeS}},
		KeySchema:             []dtypes.KeySchemaElement{{AttributeName: aws.String("pk"), KeyType: dtypes.KeyTypeHash}},
		BillingMode:           dtypes.BillingModeProvisioned,
		ProvisionedThroughput: &dtypes.ProvisionedThroughput{ReadCapacityUnits: aws.Int64(5), WriteCapacityUnits: aws.Int64(200)},
	})
	require.NoError(t, err)
	setWCU := func(wcu int64) time.Time {
		_, err := client.UpdateTable(t.Context(), &dynamodb.UpdateTableInput{TableName: aws.String(table),
			ProvisionedThroughput: &dtypes.ProvisionedThroughput{ReadCapacityUnits: aws.Int64(5), WriteCapacityUnits: aws.Int64(wcu)}})
		require.NoError(t, err)
		return time.Now()
	}
	sinkURL := "dynamodb://" + table + "?region=us-east-1&endpoint=" + url.QueryEscape(m.srv.URL)
	args, summary, _ := e.bulkLoadArgs(sinkURL, usgs, "--unit", "cost", "--cost", "1/KiB", "--capacity-every", poll.String())
	load := e.start("bulk-load", withFlag(args, "--capacity", "sink")...)

	require.Eventually(t, func() bool { return e.poolCapacity() == 200 }, 30*time.Second, 100*time.Millisecond, "the pool runs at the table's 200 WCU")
	st := e.pool()
	t.Logf("pool status: %s", st.Pool.CapacityLine())
	require.Equal(t, "capacity 200 cost/s (from DynamoDB table "+table+": 200 WCU)", st.Pool.CapacityLine())
	require.Eventually(t, func() bool { return m.total() >= 1500 }, time.Minute, 50*time.Millisecond)
	began200 := time.Now()
	time.Sleep(4 * time.Second)
	down := setWCU(100)
	at200 := m.busiestBetween(began200, down)
	require.Eventually(t, func() bool { return e.poolCapacity() == 100 }, poll+time.Second, 50*time.Millisecond, "the pool follows the table down within a poll interval")
	time.Sleep(12 * time.Second)
	up := setWCU(300)
	at100 := m.busiestBetween(down.Add(poll+time.Second), up)
	require.Eventually(t, func() bool { return e.poolCapacity() == 300 }, poll+time.Second, 50*time.Millisecond, "the pool follows the table up")
	st = e.pool()
	require.NotNil(t, st.Pool.Switch)
	switchAt := st.Pool.Switch.At
	code, ok := load.wait(2 * time.Minute)
	require.True(t, ok, "the load did not finish")
	require.Zero(t, code)
	beforeSwitch := m.busiestBetween(up, switchAt)
	at300 := m.busiestBetween(switchAt, time.Now())
	s := readSummaryFile(t, summary)
	t.Logf("busiest second at the door: %d at 200 WCU, %d from a poll and a second after the change to 100 WCU, %d from the change to 300 until its switch at +%s, %d after it",
		at200, at100, beforeSwitch, switchAt.Sub(up).Round(time.Millisecond), at300)
	t.Logf("summary: delivered %d, duplicates %d, dead-lettered %d, throttled %d", s.RecordsDelivered, s.DuplicatesAtSink, s.RecordsDeadLettered, s.SinkThrottled)
	require.EqualValues(t, usgsRecords, s.RecordsDelivered, "every record stored once")
	require.Zero(t, s.RecordsDeadLettered)
	require.LessOrEqual(t, at200, int64(200))
	require.Greater(t, at200, int64(180), "the pool used the table's 200 WCU")
	require.LessOrEqual(t, at100, int64(100), "≤ 100 WCU from one poll interval + one second after the change")
	require.LessOrEqual(t, beforeSwitch, int64(100), "the raise waits for its switch instant")
	require.LessOrEqual(t, at300, int64(300))
	require.Greater(t, at300, int64(250), "the pool used the table's 300 WCU")
}

// quotaAPI is a REST API that announces its quota in every answer
// (RateLimit-Policy) and enforces it over a sliding second (429 beyond
// it): it stores each record ID once (a repeat is 409) and keeps the
// stored requests' arrival times.
type quotaAPI struct {
	srv    *httptest.Server
	limit  int64
	policy string

	mu        sync.Mutex
	start     time.Time
	first     time.Time     // when the first answer was written
	window    ingest.Window // requests admitted in the last second
	stored    map[string]bool
	throttled int
}

func newQuotaAPI(t *testing.T, limit int64, policy string) *quotaAPI {
	a := &quotaAPI{limit: limit, policy: policy, start: time.Now(), window: ingest.NewWindow(time.Second), stored: map[string]bool{}}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("RateLimit-Policy", a.policy)
		id := strings.TrimPrefix(r.URL.Path, "/items/")
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.first.IsZero() {
			a.first = time.Now()
		}
		at := time.Since(a.start)
		if a.window.Sum(at)+1 > a.limit {
			a.throttled++
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		a.window.Add(at, 1)
		if a.stored[id] {
			w.WriteHeader(http.StatusConflict)
			return
		}
		a.stored[id] = true
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// Issue 28: a REST API that announces `RateLimit-Policy: 500;w=1` in its
// answers. A bulk load with --capacity sink starts at a token rate, and
// from the first answer on the pool's capacity is 500 records/s (in force
// within a second and lease.ProbeLead of it, the raise's switch); the
// busiest second at the API holds at most 500 and the API throttles
// nothing. Every record is stored once.
func TestCapacityFromARESTAPIsRateLimitPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 500, 10, 6*time.Second)
	api := newQuotaAPI(t, 500, "500;w=1")
	args, summary, _ := e.bulkLoadArgs("rest+"+api.srv.URL+"/items/{id}", usgs)
	began := time.Now()
	load := e.start("bulk-load", withFlag(args, "--capacity", "sink")...)
	require.Eventually(t, func() bool { return e.poolCapacity() == 500 }, 30*time.Second, 50*time.Millisecond, "the pool takes the API's limit")
	learnt := time.Since(began)
	st := e.pool()
	require.NotNil(t, st.Pool.Switch, "a raise takes effect at a switch instant")
	api.mu.Lock()
	fromFirst := st.Pool.Switch.At.Sub(api.first)
	api.mu.Unlock()
	t.Logf("capacity 500 after %s, in force %s after the API's first answer: %s", learnt.Round(time.Millisecond), fromFirst.Round(time.Millisecond), st.Pool.CapacityLine())
	require.Equal(t, "capacity 500 records/s (from the REST API "+api.srv.URL+"/items/{…}: RateLimit-Policy 500;w=1)", st.Pool.CapacityLine())
	// From the first answer: the reader asks for the pool's turn at once
	// (at most once a second) and a raise switches lease.ProbeLead ahead.
	require.LessOrEqual(t, fromFirst, time.Second+lease.ProbeLead, "in force from the first answer on")
	code, ok := load.wait(2 * time.Minute)
	require.True(t, ok, "the load did not finish")
	require.Zero(t, code)
	s := readSummaryFile(t, summary)
	api.mu.Lock()
	busiest, stored, throttled := api.window.Max(), len(api.stored), api.throttled
	api.mu.Unlock()
	t.Logf("API: %d stored, busiest second %d requests, %d throttled; summary: delivered %d, dead-lettered %d, utilization %.3f",
		stored, busiest, throttled, s.RecordsDelivered, s.RecordsDeadLettered, s.Utilization)
	require.Equal(t, usgsRecords, stored, "every record stored once")
	require.EqualValues(t, usgsRecords, s.RecordsDelivered)
	require.LessOrEqual(t, busiest, int64(500), "busiest second at the API")
	require.Zero(t, throttled, "the API throttled nothing")
}
