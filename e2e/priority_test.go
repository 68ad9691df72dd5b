//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sinkwire"
)

// Live traffic first, on real Kafka and redis-server: upstream producers
// post 1,400 records/s to `sluice api`, drained by two `sluice worker`
// processes in the high class, into a sink emulator of 2,000 records/s
// (200 capacity partitions of 10), while `sluice bulk-load --workers 1`
// loads 50,000 records into the same pool in its default class (low).
// Every live record is stored within 2 s of its post (p99, measured where
// the sink answered it), no sliding second at the sink holds more than
// the capacity, and the bulk load drains at ≥ 0.85 of the 600 records/s
// the live traffic leaves. The target is 0.9, logged with the share; it
// is not met by every run on a busy 2-core machine (0.873-0.910 in five
// .ci/runs, 0.883-0.915 here): the high class leases 2-4 % more than its 1,400
// records/s (its demand's margin over the arrivals, in whole partitions
// of 10 records/s), and the bulk worker sends 97-99 % of its lease. 0.85
// fails the designs that give the lower class a fraction of its share
// (0.03-0.37 for some live traffic shapes in docs/capacity.md).
func TestLiveTrafficFirstBesideABulkLoad(t *testing.T) {
	const (
		capacity   = 2000
		partitions = 200
		liveRate   = 1400 // records/s
		bulkRows   = 50_000

		shareTarget, shareBound = 0.9, 0.85 // of what the live traffic leaves
	)
	e := newEnv(t, capacity, partitions, 15*time.Second)
	bulkTopic := e.name + "-bulk"
	require.NoError(t, queue.EnsureTopic(t.Context(), []string{brokers}, bulkTopic, 6))
	require.NoError(t, queue.EnsureTopic(t.Context(), []string{brokers}, bulkTopic+".dlq", 1))

	// The workers write through a proxy that notes when the sink stored
	// each live record.
	stored := newStoreClock()
	target, err := url.Parse(e.sim)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = stored.note
	front := httptest.NewServer(proxy)
	defer front.Close()
	common := slices.Clone(e.common())
	common[slices.Index(common, "--sink")+1] = front.URL

	// The intake API for the live type.
	dir := t.TempDir()
	types, tokens := filepath.Join(dir, "types.yaml"), filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(types, []byte("types:\n  live:\n    topic: "+e.name+"\n    id_field: id\n"), 0o600))
	require.NoError(t, os.WriteFile(tokens, []byte("live-token live\n"), 0o600))
	apiAddr := freeAddr(t)
	e.start("api", "api", "--brokers", brokers, "--listen", apiAddr, "--types", types, "--tokens-file", tokens)
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + apiAddr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "sluice api did not start")

	for _, id := range []string{"live1", "live2"} {
		e.start(id, append(append([]string{"worker", "--worker-id", id}, common...), "--priority", "high")...)
	}
	e.awaitGroup(2)

	// Producers: 28 records every 20 ms, paced on the clock.
	feed := startFeed(t, "http://"+apiAddr+"/v1/records/live", "live-token", liveRate)
	time.Sleep(5 * time.Second) // the live workers settle

	path := filepath.Join(dir, "bulk.ndjson")
	var rows strings.Builder
	for i := range bulkRows {
		fmt.Fprintf(&rows, `{"id":"bulk-%d","mag":%d.%d,"net":"nc"}`+"\n", i, i%7, i%10)
	}
	require.NoError(t, os.WriteFile(path, []byte(rows.String()), 0o600))
	summaryPath := filepath.Join(dir, "summary.json")
	bulkArgs := append(slices.Clone(common), "--workers", "1", "--summary-json", summaryPath, path)
	bulkArgs[slices.Index(bulkArgs, "--topic")+1] = bulkTopic
	load := e.start("bulk-load", append([]string{"bulk-load"}, bulkArgs...)...)

	// Every 2 s while the load runs, the classes' leased rates from
	// `sluice pool status` (their means are logged: what the high class
	// holds beyond its demand is what the low class lacks).
	var leasedMu sync.Mutex
	leased := map[lease.Priority][]float64{}
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-sampling:
				return
			case <-time.After(2 * time.Second):
			}
			code, out := e.run(20*time.Second, "pool", "status", "--redis-addr", e.redis, "--pool", e.name, "--json")
			var st lease.PoolStatus
			if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
				continue
			}
			leasedMu.Lock()
			for _, c := range st.Classes {
				leased[c.Priority] = append(leased[c.Priority], c.Leased)
			}
			leasedMu.Unlock()
		}
	}()

	// Mid-load, `sluice pool status` shows both classes.
	time.Sleep(20 * time.Second)
	st := e.pool()
	for _, c := range st.Classes {
		t.Logf("pool status mid-load: class %s, %d workers, demand %v, leased %.0f records/s (%d partitions)", c.Priority, c.Workers, c.Demand, c.Leased, c.Holds)
	}
	require.Len(t, st.Classes, 2, "the high and the low class")
	require.Equal(t, lease.PriorityHigh, st.Classes[0].Priority)
	require.Equal(t, 2, st.Classes[0].Workers)
	require.Equal(t, lease.PriorityLow, st.Classes[1].Priority)
	require.Equal(t, 1, st.Classes[1].Workers)

	code, ok := load.wait(3 * time.Minute)
	close(sampling)
	<-sampled
	for _, p := range []lease.Priority{lease.PriorityHigh, lease.PriorityLow} {
		var sum float64
		for _, v := range leased[p] {
			sum += v
		}
		t.Logf("class %s leased %.0f records/s on average over %d samples of the load: %.0f", p, sum/float64(max(len(leased[p]), 1)), len(leased[p]), leased[p])
	}
	require.True(t, ok, "the bulk load did not finish within 3 minutes")
	posted := feed.stop()
	require.Equal(t, 0, code, "the bulk load's exit code")
	sum := readSummaryFile(t, summaryPath)
	// Every live record stored: the last ones a moment after the feed.
	require.Eventually(t, func() bool { return stored.count() >= len(posted) }, 30*time.Second, 100*time.Millisecond,
		"live records stored: %d of %d", stored.count(), len(posted))

	latencies := make([]time.Duration, 0, len(posted))
	for id, at := range posted {
		done, ok := stored.at(id)
		require.True(t, ok, "live record %s stored", id)
		latencies = append(latencies, done.Sub(at))
	}
	slices.Sort(latencies)
	p := func(q float64) time.Duration { return latencies[int(q*float64(len(latencies)-1))] }
	bulkRate := float64(sum.RecordsDelivered) / sum.ElapsedS
	st2 := e.stats()
	e.report(st2)
	t.Logf("live: %d records posted at %d/s, store latency p50 %v, p99 %v, max %v", len(posted), liveRate,
		p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond))
	t.Logf("bulk load: %d records in %.1f s (first fetch to last acknowledgement) = %.0f records/s = %.3f of the %d left; busiest second at the sink %d of %d",
		sum.RecordsDelivered, sum.ElapsedS, bulkRate, bulkRate/(capacity-liveRate), capacity-liveRate, st2.MaxUnits1s, capacity)
	t.Logf("bulk load: answers within %.1f ms (p99); slices planned for a guard of %.1f ms at the end (%.1f ms at least)",
		sum.LatencyP99MS, sum.GuardFinalMS, sum.GuardMinMS)
	require.EqualValues(t, bulkRows, sum.RecordsDelivered)
	require.LessOrEqual(t, p(0.99), 2*time.Second, "live p99 within 2 s of the post")
	share := bulkRate / (capacity - liveRate)
	if share < shareTarget {
		t.Logf("the bulk load's share %.3f is short of its target %.2f", share, shareTarget)
	}
	require.GreaterOrEqual(t, share, shareBound, "the bulk load gets what the live traffic leaves")
	require.LessOrEqual(t, st2.MaxUnits1s, int64(capacity), "the sink's busiest second")
	require.Zero(t, st2.Throttled)
}

// storeClock notes when the sink first stored each live record, from its
// answers as they pass the proxy.
type storeClock struct {
	mu     sync.Mutex
	stored map[string]time.Time
}

func newStoreClock() *storeClock { return &storeClock{stored: map[string]time.Time{}} }

func (s *storeClock) note(resp *http.Response) error {
	if resp.Request.URL.Path != sinkwire.PathRecords {
		return nil
	}
	now := time.Now()
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return err
	}
	var res sinkwire.Response
	if json.Unmarshal(body, &res) != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range res.Results {
		if (r.Status == sinkwire.StatusStored || r.Status == sinkwire.StatusDuplicate) && strings.HasPrefix(r.ID, "live-") {
			if _, ok := s.stored[r.ID]; !ok {
				s.stored[r.ID] = now
			}
		}
	}
	return nil
}

func (s *storeClock) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.stored)
}

func (s *storeClock) at(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.stored[id]
	return at, ok
}

// liveFeed posts records to the intake API at a steady rate.
type liveFeed struct {
	t      *testing.T
	halt   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	posted map[string]time.Time // record ID → when its post began
}

// startFeed posts rate records/s to url, 28 a request every 20 ms on the
// clock, until stop. Like the many producers of a real intake, a post does
// not wait for the one before to be answered (up to feedInFlight at once):
// a single client posting in turn sent nothing while one answer was slow
// (the broker's produce on two busy cores) and then caught up in a burst,
// so the live traffic came in waves of 600 to 2,200 records/s rather than
// at its rate.
func startFeed(t *testing.T, url, token string, rate int) *liveFeed {
	f := &liveFeed{t: t, halt: make(chan struct{}), done: make(chan struct{}), posted: map[string]time.Time{}}
	const every = 20 * time.Millisecond
	per := rate * int(every) / int(time.Second)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: feedInFlight}}
	slots := make(chan struct{}, feedInFlight)
	var posting sync.WaitGroup
	go func() {
		defer close(f.done)
		defer posting.Wait()
		began := time.Now()
		for n := 0; ; n++ {
			select {
			case <-f.halt:
				return
			case <-time.After(time.Until(began.Add(time.Duration(n) * every))):
			}
			select {
			case <-f.halt:
				return
			case slots <- struct{}{}:
			}
			posting.Go(func() {
				defer func() { <-slots }()
				f.post(client, url, token, n, per)
			})
		}
	}()
	return f
}

// feedInFlight bounds the live feed's posts awaiting an answer.
const feedInFlight = 16

// post sends request n of the feed: per records.
func (f *liveFeed) post(client *http.Client, url, token string, n, per int) {
	var body bytes.Buffer
	ids := make([]string, per)
	for i := range per {
		ids[i] = fmt.Sprintf("live-%d-%d", n, i)
		fmt.Fprintf(&body, `{"id":"%s","mag":%d.%d,"net":"nc"}`+"\n", ids[i], i%7, n%10)
	}
	at := time.Now()
	req, _ := http.NewRequest(http.MethodPost, url, &body)
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		f.t.Errorf("post to the intake API: %v", err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		f.t.Errorf("the intake API answered %d", resp.StatusCode)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.posted[id] = at
	}
}

// stop ends the feed and returns what it posted.
func (f *liveFeed) stop() map[string]time.Time {
	close(f.halt)
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.posted
}
