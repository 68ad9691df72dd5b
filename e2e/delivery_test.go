//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sinkwire"
)

// faultProxy stands between sluice and the sink emulator: while fault says
// so it answers every request itself (a sink-wide failure, as a whole or
// record by record), otherwise it forwards to the emulator. It can also
// stop listening altogether.
type faultProxy struct {
	t     *testing.T
	addr  string
	fwd   *httputil.ReverseProxy
	mu    sync.Mutex
	fault fault
	began time.Time
	srv   *http.Server
	// faulted is when the fault last answered a request; resumed is when
	// the first request after that went to the emulator.
	faulted, resumed time.Time
}

// fault decides the answer to a request whose body is request at elapsed
// since it was set: on, the proxy answers status, header and body itself.
type fault func(elapsed time.Duration, request []byte) (status int, header http.Header, body string, on bool)

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	p := &faultProxy{t: t, fwd: httputil.NewSingleHostReverseProxy(u), began: time.Now()}
	p.listen(freeAddr(t))
	t.Cleanup(p.stop)
	return p
}

func (p *faultProxy) listen(addr string) {
	p.t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port may linger a moment after a stop
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(p.t, err)
	p.addr = addr
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
}

func (p *faultProxy) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

func (p *faultProxy) url() string { return "http://" + p.addr }

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	fault, elapsed := p.fault, time.Since(p.began)
	p.mu.Unlock()
	if fault != nil && r.URL.Path == "/v1/records" {
		data, err := io.ReadAll(r.Body)
		if err != nil {
			return // the client is gone
		}
		status, header, body, on := fault(elapsed, data)
		p.mu.Lock()
		switch {
		case on:
			p.faulted = time.Now()
		case !p.faulted.IsZero() && p.resumed.Before(p.faulted):
			p.resumed = time.Now()
		}
		p.mu.Unlock()
		if on {
			for k, v := range header {
				w.Header()[k] = v
			}
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(data))
	}
	p.fwd.ServeHTTP(w, r)
}

// resumedAt is when the first request after the fault's last answer went
// to the emulator; zero while none has.
func (p *faultProxy) resumedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed.Before(p.faulted) {
		return time.Time{}
	}
	return p.resumed
}

// setFault injects f from now on (elapsed counts from now).
func (p *faultProxy) setFault(f fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault, p.began = f, time.Now()
}

// bulkLoadArgs are a bulk load of path by this env through sink, with a
// summary and a dead-letter file in the test's temp dir.
func (e *env) bulkLoadArgs(sinkURL, path string, extra ...string) (args []string, summary, deadLetters string) {
	dir := e.t.TempDir()
	summary, deadLetters = filepath.Join(dir, "summary.json"), filepath.Join(dir, "dlq.ndjson")
	args = append([]string{"bulk-load"}, e.common()...)
	for i, a := range args {
		if a == "--sink" {
			args[i+1] = sinkURL
		}
	}
	args = append(args, "--workers", "2", "--summary-json", summary, "--dead-letter-file", deadLetters)
	return append(append(args, extra...), path), summary, deadLetters
}

func readSummaryFile(t *testing.T, path string) bulkload.Summary {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var s bulkload.Summary
	require.NoError(t, json.Unmarshal(data, &s), string(data))
	return s
}

// dlqCount is the number of messages in the env's dead-letter topic.
func (e *env) dlqCount() int64 {
	e.t.Helper()
	ends, err := queue.EndOffsets(e.t.Context(), []string{brokers}, queue.DeadLetterTopic(e.name))
	require.NoError(e.t, err)
	var n int64
	for _, end := range ends {
		n += end
	}
	return n
}

// A failure of the sink as a whole — wrong credentials, an outage,
// throttling however long, an answer sluice cannot read — pauses the
// workers: nothing is dead-lettered, and once the sink is back every
// record is stored once.
func TestSinkWideFailuresPauseNotDeadLetter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lasts  time.Duration
		status int
		header http.Header
		body   string
	}{
		{"401 for 10 s", 10 * time.Second, http.StatusUnauthorized, nil, `{"error":"invalid token"}`},
		{"503 for 20 s", 20 * time.Second, http.StatusServiceUnavailable, nil, "down for maintenance"},
		{"429 with Retry-After 3600 for 60 s", 60 * time.Second, http.StatusTooManyRequests, http.Header{"Retry-After": {"3600"}}, `{"error":"slow down"}`},
		{"an answer it cannot read for 10 s", 10 * time.Second, http.StatusOK, nil, `{"ok":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1000, 10, 5*time.Second)
			proxy := newFaultProxy(t, e.sim)
			proxy.setFault(func(elapsed time.Duration, _ []byte) (int, http.Header, string, bool) {
				return tc.status, tc.header, tc.body, elapsed < tc.lasts
			})
			args, summary, _ := e.bulkLoadArgs(proxy.url(), head(t, 300))
			code, out := e.run(3*time.Minute, args...)
			require.Equal(t, 0, code, out)
			s := readSummaryFile(t, summary)
			require.Zero(t, s.RecordsDeadLettered, "nothing dead-lettered")
			require.Zero(t, e.dlqCount())
			require.EqualValues(t, 300, s.RecordsDelivered)
			require.Positive(t, s.SinkFailedWrites)
			st := e.stats()
			require.EqualValues(t, 300, st.Accepted, "every record once after recovery")
			require.Zero(t, st.Duplicates)
			// Each of the load's two workers pauses its own sink once: one
			// WARN a worker, not one a record.
			paused := strings.Count(out, "sink paused")
			require.True(t, paused >= 1 && paused <= 2, "one WARN for the pause per worker, not one a record: %d", paused)
			require.Contains(t, out, "sink resumed")
			e.report(st)
		})
	}
}

// Every record answered 429 with Retry-After: 3600, in a 429 answer that
// lists each record (the form sink-sim answers with when it throttles),
// is a throttle of the whole key space, so the sink is paused as for a
// whole-request failure: a WARN, one probe every --max-retry-after (30 s),
// nothing dead-lettered and no attempt used. A throttle of 240 s (capacity
// 500, two workers): writes go to the sink again within one probe interval
// of its end, at the pool's rate again within a second or two, and the
// load finishes, every record once. One that outlasts
// --sink-timeout: the load gives up (exit 1) and dead-letters nothing.
func TestRecordThrottleOfAnyLengthPausesTheSink(t *testing.T) {
	// Four minutes long: beside the other parallel cases, not after them.
	t.Parallel()
	const probeInterval = 30 * time.Second // ingest.DefaultMaxRetryAfter
	for _, tc := range []struct {
		name   string
		lasts  time.Duration
		extra  []string
		code   int
		within time.Duration // for the load to end
	}{
		{"240 s", 240 * time.Second, nil, 0, 240*time.Second + 3*probeInterval},
		{"past --sink-timeout", time.Hour, []string{"--sink-timeout", "40s"}, 1, 40*time.Second + 3*probeInterval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 500, 10, 5*time.Second)
			proxy := newFaultProxy(t, e.sim)
			proxy.setFault(func(elapsed time.Duration, request []byte) (int, http.Header, string, bool) {
				if elapsed >= tc.lasts {
					return 0, nil, "", false
				}
				return http.StatusTooManyRequests, http.Header{"Retry-After": {"3600"}}, throttleEach(t, request), true
			})
			began := time.Now()
			args, summary, _ := e.bulkLoadArgs(proxy.url(), head(t, 300), tc.extra...)
			code, out := e.run(tc.within, args...)
			require.Equal(t, tc.code, code, out)
			require.Contains(t, out, "sink paused", "the whole key space throttled is the sink's throttle")
			require.Zero(t, e.dlqCount(), "nothing dead-lettered")
			st := e.stats()
			require.Zero(t, st.Duplicates)
			if tc.code != 0 {
				require.Regexp(t, `no progress for 4[01]s: the sink is paused \(last error: every key throttled`, out)
				require.Zero(t, st.Accepted, "nothing reached the sink through the throttle")
				took := time.Since(began)
				t.Logf("gave up after %v", took.Round(time.Millisecond))
				require.Less(t, took, 40*time.Second+probeInterval, "gave up at --sink-timeout (40 s), within a probe")
				return
			}
			s := readSummaryFile(t, summary)
			require.Zero(t, s.RecordsDeadLettered)
			require.EqualValues(t, 300, s.RecordsDelivered)
			require.EqualValues(t, 300, st.Accepted, "every record once after the throttle")
			resumed := proxy.resumedAt().Sub(began.Add(tc.lasts))
			t.Logf("writes resumed %v after the throttle ended (probe interval %v)", resumed.Round(time.Millisecond), probeInterval)
			require.Less(t, resumed, probeInterval+2*time.Second, "writes resume within one probe interval")
			// And at the rate: the pause cut the pacer's throttle ceiling
			// once (to 0.7), not once per refused probe (0.7 ^ 8 after
			// 240 s, when these 300 records took 4.4 s to climb back).
			span := st.LastChargeAt.Sub(st.FirstChargeAt)
			t.Logf("the 300 records stored in %v after the first", span.Round(time.Millisecond))
			require.Less(t, span, 3*time.Second, "the load climbs back to its rate at once")
			e.report(st)
		})
	}
}

// throttleEach is the throttled answer's body to a request of records:
// each one 429, as sink-sim answers when it throttles.
func throttleEach(t *testing.T, request []byte) string {
	var records []sinkwire.Record
	if err := json.Unmarshal(request, &records); err != nil {
		t.Errorf("not a request of records: %v", err) // the proxy's goroutine: no FailNow
	}
	res := sinkwire.Response{Results: make([]sinkwire.Result, len(records))}
	for i, r := range records {
		res.Results[i] = sinkwire.Result{ID: r.ID, Status: sinkwire.StatusThrottled, Error: "throttled"}
	}
	body, _ := json.Marshal(res)
	return string(body)
}

// A sink that does not answer: the preflight says so before anything is
// produced (exit 1). A sink that goes away during the load: the load gives
// up after --sink-timeout (exit 1, naming the sink and the last error),
// dead-letters nothing, and a rerun once it is back stores the rest, every
// record once.
func TestUnreachableSinkBulkLoadGivesUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1000, 10, 5*time.Second)
	args, _, _ := e.bulkLoadArgs("http://"+freeAddr(t), head(t, 100))
	code, out := e.run(time.Minute, args...)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "does not answer")
	require.Zero(t, e.dlqCount())

	proxy := newFaultProxy(t, e.sim)
	path := head(t, 3000)
	args, summary, _ := e.bulkLoadArgs(proxy.url(), path, "--sink-timeout", "5s")
	p := e.start("bulk-load", args...)
	e.awaitAccepted(1000, time.Minute)
	proxy.stop() // gone: connections refused
	began := time.Now()
	code, ok := p.wait(time.Minute)
	require.True(t, ok, "the load did not give up")
	took := time.Since(began)
	require.Equal(t, 1, code)
	log, err := os.ReadFile(p.log)
	require.NoError(t, err)
	require.Contains(t, string(log), "no progress for")
	require.Contains(t, string(log), "connection refused")
	require.Less(t, took, 20*time.Second, "gave up after --sink-timeout (5 s) and the grace")
	require.Zero(t, e.dlqCount(), "nothing dead-lettered")

	proxy.listen(proxy.addr) // back
	code, out = e.run(3*time.Minute, args...)
	require.Equal(t, 0, code, out)
	s := readSummaryFile(t, summary)
	t.Logf("rerun: %+v", s)
	st := e.stats()
	require.EqualValues(t, 3000, st.Accepted, "every record once")
	e.report(st)
}

// A record over the broker's 1 MiB message limit is dead-lettered with its
// file:line and size; its neighbours load; the dead-letter file keeps it
// whole; the produce count is exact.
func TestOversizedRecordIsDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2000, 10, 5*time.Second)
	data, err := os.ReadFile(head(t, 1200))
	require.NoError(t, err)
	lines := strings.SplitAfter(string(data), "\n")
	// A row whose place is 2 MiB.
	huge := `2025-05-15T00:00:00.000Z,36.7,-116.3,10.8,1.0,ml,10,113,0.01,0.07,nn,huge,2025-05-15T00:00:00.000Z,"` +
		strings.Repeat("far away ", 2<<20/9) + `",earthquake,,1.2,0.15,7,automatic,nn,nn` + "\n"
	path := filepath.Join(t.TempDir(), "huge.csv")
	all := strings.Join(lines[:601], "") + huge + strings.Join(lines[601:], "")
	require.NoError(t, os.WriteFile(path, []byte(all), 0o600))

	args, summary, deadLetters := e.bulkLoadArgs(e.sim, path)
	code, out := e.run(3*time.Minute, args...)
	require.Equal(t, 3, code, out)
	s := readSummaryFile(t, summary)
	require.EqualValues(t, 1201, s.RecordsTotal)
	require.EqualValues(t, 1200, s.RecordsProduced, "the count is exact")
	require.EqualValues(t, 1200, s.RecordsDelivered, "its neighbours load")
	require.EqualValues(t, 1, s.RecordsDeadLettered)

	var dead []queue.DeadLetterMessage
	require.NoError(t, queue.Admin{Brokers: []string{brokers}}.ReadDeadLetters(t.Context(), e.name, func(m queue.DeadLetterMessage) error {
		dead = append(dead, m)
		return nil
	}))
	require.Len(t, dead, 1)
	require.Contains(t, dead[0].Reason, path+":602: queue: record too large for a Kafka message")
	require.Greater(t, dead[0].Truncated, 2<<20, "the topic keeps its start and says how large it was")
	f, err := os.Open(deadLetters)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 8<<20)
	require.True(t, sc.Scan())
	require.Greater(t, len(sc.Bytes()), 2<<20, "the dead-letter file keeps it whole")

	code, out = e.run(time.Minute, "produce", "--brokers", brokers, "--topic", e.name+"-produce", "--id-field", "id", path)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "read 1201 rows: produced 1200 records")
}

// An ID column that repeats is reported: the sink keeps one record per ID,
// so a user must see that before believing the load.
func TestDuplicateIDsAreReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5000, 10, 5*time.Second)
	args, summary, _ := e.bulkLoadArgs(e.sim, usgs)
	for i, a := range args {
		if a == "--id-field" {
			args[i+1] = "net" // the network code: a few dozen values
		}
	}
	code, out := e.run(3*time.Minute, args...)
	require.Equal(t, 0, code, out)
	s := readSummaryFile(t, summary)
	st := e.stats()
	t.Logf("%d rows, %d distinct IDs, %d repeated; examples %v", s.RecordsTotal, st.Accepted, s.DuplicateIDs, s.DuplicateIDExamples)
	require.EqualValues(t, usgsRecords, s.RecordsTotal)
	require.EqualValues(t, usgsRecords-st.Accepted, s.DuplicateIDs)
	require.NotEmpty(t, s.DuplicateIDExamples)
	require.Contains(t, out, "IDs repeat in the input")
	require.Contains(t, out, "id_field=net")
	require.Contains(t, out, "repeat an earlier row's ID")
	require.Equal(t, st.Accepted, s.RecordsDelivered, "delivered counts what the sink stored for the first time")
	require.Equal(t, s.DuplicateIDs, s.DuplicatesAtSink, "the repeats reach the sink as redeliveries")
	require.Equal(t, s.RecordsTotal, s.RecordsDelivered+s.DuplicatesAtSink+s.RecordsDeadLettered)
}

// kill -9 of a bulk load at about half stored, long after the whole file
// was produced, then the same command again: the rerun produces nothing
// again, every record is stored once, and at most 1.1 × the file's
// records are sent to the sink in all. (A kill while the load is still
// producing: TestBulkLoadResumesAfterKillDuringProduction.)
func TestBulkLoadResumesAfterKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2000, 20, 5*time.Second)
	args, summary, _ := e.bulkLoadArgs(e.sim, usgs)
	p := e.start("bulk-load", args...)
	e.awaitAccepted(usgsRecords/2, 2*time.Minute)
	p.signal(t, syscall.SIGKILL)
	_, ok := p.wait(10 * time.Second)
	require.True(t, ok)
	before := e.stats()

	began := time.Now()
	code, out := e.run(3*time.Minute, args...)
	require.Equal(t, 0, code, out)
	s := readSummaryFile(t, summary)
	st := e.stats()
	t.Logf("killed with %d stored; the rerun took %s: %+v", before.Accepted, time.Since(began), s)
	require.EqualValues(t, usgsRecords, st.Accepted, "every record once")
	require.LessOrEqual(t, float64(st.Records), 1.1*usgsRecords, "record attempts sent to the sink in all")
	require.Positive(t, s.RecordsSkipped, "the rerun resumed")
	require.Less(t, s.RecordsProduced, int64(usgsRecords))
	e.report(st)
}

// bulk-load --workers 0 reports what worker pods of the group deliver; with
// no pod it says so and gives up after --sink-timeout.
func TestWorkersZeroReportsPodsProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3000, 10, 5*time.Second)
	e.worker("pod-1")
	e.worker("pod-2")
	e.awaitGroup(2)
	args, summary, _ := e.bulkLoadArgs(e.sim, usgs, "--workers", "0")
	code, out := e.run(3*time.Minute, args...)
	require.Equal(t, 0, code, out)
	s := readSummaryFile(t, summary)
	require.EqualValues(t, usgsRecords, s.RecordsDelivered, "from the group's committed offsets")
	require.Greater(t, s.Utilization, 0.5)
	require.Contains(t, out, "delivered=")
	e.report(e.stats())

	lonely := newEnv(t, 1000, 10, 5*time.Second)
	args, _, _ = lonely.bulkLoadArgs(lonely.sim, head(t, 50), "--workers", "0", "--sink-timeout", "5s")
	code, out = lonely.run(time.Minute, args...)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "no live member for 5s")
}

// Dead letters can be counted by reason and, once the cause is fixed,
// replayed to their topic with their IDs: the sink stores each once,
// however often they are replayed.
func TestDeadLetterReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1000, 10, 5*time.Second, "--required-fields", "mag")
	var b strings.Builder
	for i := range 100 {
		if i%10 == 3 {
			fmt.Fprintf(&b, `{"id":"r%d","depth":%d}`+"\n", i, i) // no mag: the sink refuses it
		} else {
			fmt.Fprintf(&b, `{"id":"r%d","mag":1.5,"depth":%d}`+"\n", i, i)
		}
	}
	path := filepath.Join(t.TempDir(), "in.ndjson")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	args, _, _ := e.bulkLoadArgs(e.sim, path)
	code, out := e.run(2*time.Minute, args...)
	require.Equal(t, 3, code, out)
	require.EqualValues(t, 90, e.stats().Accepted)

	code, out = e.run(time.Minute, "dlq", "inspect", "--brokers", brokers, "--topic", e.name)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, e.name+".dlq: 10 dead letters")
	require.Contains(t, out, `10  HTTP 400: missing required field "mag"`)

	// The cause fixed: a sink that no longer requires mag, drained by a pod.
	e.startSim()
	e.worker("pod")
	for range 2 {
		code, out = e.run(time.Minute, "dlq", "replay", "--brokers", brokers, "--topic", e.name, "--reason", "missing required field")
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "replayed 10 dead letters")
	}
	var st = e.awaitAccepted(10, time.Minute)
	require.Eventually(t, func() bool { st = e.stats(); return st.Duplicates >= 10 }, time.Minute, 100*time.Millisecond,
		"the second replay's records reach the sink too")
	require.EqualValues(t, 10, st.Accepted, "each replayed record stored once")
	require.EqualValues(t, 10, st.Duplicates, "the second replay's copies are duplicates")
}
