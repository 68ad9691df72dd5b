//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// startJSONServer starts a json-server of its own (npm, scripts/
// jsonserver.sh) on a free port with one empty collection, and stops it
// at cleanup. It returns the server's base URL.
func startJSONServer(t *testing.T, collection string) string {
	t.Helper()
	port := strings.TrimPrefix(freeAddr(t), "127.0.0.1:")
	script, err := filepath.Abs("../scripts/jsonserver.sh")
	require.NoError(t, err)
	envs := append(os.Environ(), "SLUICE_JSONSERVER_PORT="+port, "SLUICE_JSONSERVER_COLLECTIONS="+collection)
	var stderr bytes.Buffer
	cmd := exec.Command(script, "start")
	cmd.Env, cmd.Stderr = envs, &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "scripts/jsonserver.sh start: %s", stderr.String())
	t.Cleanup(func() {
		stop := exec.Command(script, "stop")
		stop.Env = envs
		_ = stop.Run()
	})
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// jsonServerCount is how many items a json-server collection holds.
func jsonServerCount(t *testing.T, base, collection string) int {
	t.Helper()
	resp, err := http.Get(base + "/" + collection + "?_limit=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	n, err := strconv.Atoi(resp.Header.Get("X-Total-Count"))
	require.NoError(t, err, "X-Total-Count")
	return n
}

// recordingProxy stands between sluice and a REST API and keeps, for every
// write request (not GET), when it arrived and the status the API
// answered: the sink side's view of the rate.
type recordingProxy struct {
	srv   *httptest.Server
	fwd   *httputil.ReverseProxy
	start time.Time

	mu       sync.Mutex
	window   ingest.Window // write requests arrived in the last second
	statuses map[int]int
}

func newRecordingProxy(t *testing.T, target string) *recordingProxy {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	p := &recordingProxy{fwd: httputil.NewSingleHostReverseProxy(u), start: time.Now(),
		window: ingest.NewWindow(time.Second), statuses: map[int]int{}}
	p.fwd.ErrorLog = log.New(io.Discard, "", 0) // a request sluice gave up on is counted as a 502
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	p.fwd.Transport = tr
	p.srv = httptest.NewServer(p)
	t.Cleanup(p.srv.Close)
	t.Cleanup(tr.CloseIdleConnections)
	return p
}

func (p *recordingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		p.fwd.ServeHTTP(w, r)
		return
	}
	p.mu.Lock()
	p.window.Add(time.Since(p.start), 1)
	p.mu.Unlock()
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	p.fwd.ServeHTTP(rec, r)
	p.mu.Lock()
	p.statuses[rec.status]++
	p.mu.Unlock()
}

// busiest returns the most write requests that arrived in any sliding
// second, and the count of answers by status; it resets both.
func (p *recordingProxy) busiest() (maxPerSecond int64, statuses map[int]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	maxPerSecond, statuses = p.window.Max(), p.statuses
	p.window, p.statuses = ingest.NewWindow(time.Second), map[int]int{}
	return maxPerSecond, statuses
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// The USGS file through the REST sink into json-server, a third-party REST
// API from npm, at a pool of 500 records/s with one request per record:
// every record stored once, and no sliding second at the API's side holds
// more requests than the pool's capacity (+1 % for jitter between send and
// accept, as everywhere). A second load of the file (produced again) adds
// nothing: json-server answers each POST of an id it holds with its 500
// "duplicate id", which --sink-duplicate-on maps to a duplicate.
//
// json-server (Node, one thread, a linear scan of the collection per
// insert) serves fewer than 500 requests/s on a loaded 2-core machine, so
// its answers lag; the requests get 5 s (and the leases the margin that
// needs), and the pacer, which keeps each request in its account until a
// second after its answer, slows to what the API serves. A request whose
// answer is lost to its deadline is stored once all the same: its retry is
// a duplicate.
func TestRESTSinkLoadsUSGSIntoJSONServerTwice(t *testing.T) {
	t.Parallel()
	const capacity = 500
	api := startJSONServer(t, "earthquakes")
	proxy := newRecordingProxy(t, api)
	e := newEnv(t, capacity, 10, 15*time.Second)
	sinkURL := "rest+" + proxy.srv.URL + "/earthquakes"
	for run := 1; run <= 2; run++ {
		extra := []string{"--sink-duplicate-on", "500:duplicate id", "--sink-timeout", "2m", "--request-timeout", "5s", "--concurrency", "8"}
		if run == 2 {
			extra = append(extra, "--no-resume")
		}
		args, summary, _ := e.bulkLoadArgs(sinkURL, usgs, extra...)
		began := time.Now()
		code, out := e.run(5*time.Minute, args...)
		require.Equal(t, 0, code, "run %d:\n%s", run, out)
		s := readSummaryFile(t, summary)
		busiest, statuses := proxy.busiest()
		t.Logf("run %d in %v: delivered %d, duplicates %d, dead-lettered %d, throttled %d, failed writes %d, writes %d, utilization %.3f; at the API: %v, busiest second %d requests (%.3f of %d)",
			run, time.Since(began).Round(time.Millisecond), s.RecordsDelivered, s.DuplicatesAtSink, s.RecordsDeadLettered, s.SinkThrottled,
			s.SinkFailedWrites, s.SinkRequests, s.Utilization, statuses, busiest, float64(busiest)/capacity, capacity)
		require.Zero(t, s.RecordsDeadLettered)
		require.Equal(t, usgsRecords, jsonServerCount(t, api, "earthquakes"), "run %d: every record stored once", run)
		if run == 1 {
			require.EqualValues(t, usgsRecords, s.RecordsDelivered+s.DuplicatesAtSink, "a record is delivered, or a duplicate when the answer to its first attempt was lost")
			require.Equal(t, usgsRecords, statuses[http.StatusCreated], "the API stored each record once")
		} else {
			require.Zero(t, s.RecordsDelivered, "nothing stored for the first time")
			require.EqualValues(t, usgsRecords, s.DuplicatesAtSink)
			require.Equal(t, usgsRecords, statuses[http.StatusInternalServerError], "json-server's duplicate answer")
		}
		require.LessOrEqual(t, float64(busiest), 1.01*capacity, "a sliding second over capacity at the API")
	}
	require.Zero(t, e.dlqCount())
}

// Plain APIs sluice does not control: one that refuses the credentials
// (401 for every request) for 10 s pauses the workers — nothing
// dead-lettered, every record stored once it accepts them — and one that
// answers 200 {"ok":true} to everything is a sink whose every answer is a
// success: one request per record, all delivered.
func TestRESTSinkPlainAPIs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refuse  time.Duration // 401 for this long, then 200 {"ok":true}
		records int
	}{
		{"401 for 10 s", 10 * time.Second, 300},
		{"200 ok to everything", 0, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var began time.Time
			stored := map[string]int{}
			refused := 0
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				mu.Lock()
				defer mu.Unlock()
				if began.IsZero() {
					began = time.Now()
				}
				if time.Since(began) < tc.refuse {
					refused++
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusUnauthorized)
					_, _ = io.WriteString(w, `{"error":"invalid token"}`)
					return
				}
				stored[r.URL.Path+" "+string(body)]++
				_, _ = io.WriteString(w, `{"ok":true}`)
			}))
			defer api.Close()
			e := newEnv(t, 1000, 10, 5*time.Second)
			args, summary, _ := e.bulkLoadArgs("rest+"+api.URL+"/v1/items/{id}", head(t, tc.records), "--sink-method", "PUT")
			code, out := e.run(3*time.Minute, args...)
			require.Equal(t, 0, code, out)
			s := readSummaryFile(t, summary)
			t.Logf("summary: %+v", s)
			require.Zero(t, s.RecordsDeadLettered, "nothing dead-lettered")
			require.Zero(t, e.dlqCount())
			require.EqualValues(t, tc.records, s.RecordsDelivered)
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, stored, tc.records, "every record once")
			for k, n := range stored {
				require.Equal(t, 1, n, k)
				require.True(t, strings.HasPrefix(k, "/v1/items/"), k)
			}
			if tc.refuse > 0 {
				require.Positive(t, refused)
				require.Positive(t, s.SinkFailedWrites)
				paused := strings.Count(out, "sink paused")
				require.True(t, paused >= 1 && paused <= 2, "one WARN for the pause per worker (2), not one a record: %d", paused)
				require.Contains(t, out, "HTTP 401")
				require.Contains(t, out, "sink resumed")
			} else {
				require.EqualValues(t, tc.records, s.SinkRecordAttempts, "one attempt a record: no retries")
				require.Zero(t, s.SinkFailedWrites)
			}
			t.Logf("%s: %d refused, %d stored", fmt.Sprint(tc.name), refused, len(stored))
		})
	}
}

// keyedAPI is a REST API that applies each Idempotency-Key once: a
// request with a key it has applied is answered as the first was (201),
// without applying it again. It never looks at the record's ID, so a
// retry that came with another key would store the record twice. drop
// says, by how many requests of that key it has seen before, whether to
// drop the connection without an answer after applying (or replaying) a
// request — a server that stored a write and died before answering.
type keyedAPI struct {
	srv  *httptest.Server
	drop func(id string, seen int) bool

	mu       sync.Mutex
	applied  map[string]string   // key → the record ID its first request carried
	stored   map[string]int      // record ID → times applied
	keys     map[string][]string // record ID → the key of each request, in order
	requests int
	dropped  int
	noKey    int
}

func newKeyedAPI(t *testing.T, drop func(id string, seen int) bool) *keyedAPI {
	t.Helper()
	a := &keyedAPI{drop: drop, applied: map[string]string{}, stored: map[string]int{}, keys: map[string][]string{}}
	a.srv = httptest.NewServer(a)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *keyedAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rec struct {
		ID string `json:"id"`
	}
	body, err := io.ReadAll(r.Body)
	if err != nil || json.Unmarshal(body, &rec) != nil || rec.ID == "" {
		http.Error(w, `{"error":"a JSON object with an id"}`, http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	a.mu.Lock()
	a.requests++
	if key == "" {
		a.noKey++
		a.mu.Unlock()
		http.Error(w, `{"error":"Idempotency-Key required"}`, http.StatusBadRequest)
		return
	}
	seen := len(a.keys[rec.ID])
	a.keys[rec.ID] = append(a.keys[rec.ID], key)
	if _, done := a.applied[key]; !done {
		a.applied[key] = rec.ID
		a.stored[rec.ID]++
	}
	drop := a.drop(rec.ID, seen)
	if drop {
		a.dropped++
	}
	a.mu.Unlock()
	if drop {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// metric reads the value of the first sample of /metrics at addr whose
// line starts with name and holds every one of labels.
func metric(t *testing.T, addr, name string, labels ...string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && strings.Contains(line, l)
		}
		if !all {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(t, err, line)
		return v, true
	}
	return 0, false
}

// The Idempotency-Key through the whole pipeline: a `sluice worker`
// process drains 300 USGS records through the REST sink into an API that
// dedupes by that key alone and, after applying a request, drops the
// connection without an answer for every fourth record's first request
// (and for every tenth record's first two), so the worker retries them.
// Every request of a record carries the same key as its first, the API
// applies each key once, and every record is stored once and counted
// delivered once; the API sees no more requests than the pacer charged
// for (no layer below it sent one again on its own).
func TestIdempotencyKeyThroughThePipeline(t *testing.T) {
	t.Parallel()
	const records = 300
	var mu sync.Mutex
	order := map[string]int{} // record ID → its rank among the IDs the API saw
	api := newKeyedAPI(t, func(id string, seen int) bool {
		mu.Lock()
		defer mu.Unlock()
		n, ok := order[id]
		if !ok {
			n = len(order)
			order[id] = n
		}
		return (n%10 == 0 && seen < 2) || (n%4 == 1 && seen == 0)
	})
	e := newEnv(t, 1000, 10, 5*time.Second)
	e.produce(records)
	metricsAddr := freeAddr(t)
	args := append([]string{"worker", "--worker-id", "w1"}, e.common()...)
	for i, a := range args {
		if a == "--sink" {
			args[i+1] = "rest+" + api.srv.URL + "/v1/quakes"
		}
	}
	e.start("w1", append(args, "--metrics-addr", metricsAddr)...)
	require.Eventually(t, func() bool {
		v, _ := metric(t, metricsAddr, "sluice_records_total", `outcome="delivered"`)
		return v >= records
	}, 2*time.Minute, 100*time.Millisecond, "the worker did not deliver every record")

	api.mu.Lock()
	defer api.mu.Unlock()
	t.Logf("the API read %d requests for %d records and dropped %d connections after applying; %d keys applied",
		api.requests, records, api.dropped, len(api.applied))
	require.Zero(t, api.noKey, "every request carries an Idempotency-Key")
	require.Len(t, api.keys, records)
	retried := 0
	for id, keys := range api.keys {
		for _, k := range keys[1:] {
			require.Equal(t, keys[0], k, "record %s: a retry carries its first attempt's key", id)
		}
		if len(keys) > 1 {
			retried++
		}
		require.Equal(t, 1, api.stored[id], "record %s stored once", id)
	}
	require.Len(t, api.applied, records, "one key a record, each applied once")
	require.GreaterOrEqual(t, api.dropped, records/4+records/10, "the API dropped connections")
	require.GreaterOrEqual(t, retried, records/4, "the dropped records were sent again")
	delivered, _ := metric(t, metricsAddr, "sluice_records_total", `outcome="delivered"`)
	duplicates, _ := metric(t, metricsAddr, "sluice_records_total", `outcome="duplicate"`)
	dead, _ := metric(t, metricsAddr, "sluice_records_total", `outcome="dead_lettered"`)
	require.EqualValues(t, records, delivered, "each record counted delivered once")
	require.Zero(t, duplicates)
	require.Zero(t, dead)
	sent, ok := metric(t, metricsAddr, "sluice_slice_used_units_total")
	require.True(t, ok)
	t.Logf("the pacer charged %.0f record sends", sent)
	require.LessOrEqual(t, float64(api.requests), sent, "requests the API read beyond what the pacer charged for")
}
