package sink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/sinkwire"
)

// serve starts an httptest server for h and an HTTPSink pointed at it.
func serve(t *testing.T, h http.Handler, timeout time.Duration) *sink.HTTPSink {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	hs, err := sink.NewHTTP(sink.HTTPConfig{URL: srv.URL + "/", Timeout: timeout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = hs.Close() })
	return hs
}

func record(id, value string, cost int64) ingest.Record {
	return ingest.Record{ID: id, Value: []byte(value), Cost: cost}
}

func TestHTTPSinkRoundTrip(t *testing.T) {
	t.Parallel()
	frozen := time.Now() // the bucket never refills
	sim := newSim(t, sinksim.Config{Capacity: 4, RequiredFields: []string{"mag"}, Clock: func() time.Time { return frozen }})
	hs := serve(t, sim.Handler(), 0)
	ctx := t.Context()

	res, err := hs.Write(ctx, []ingest.Record{record("b", `{"mag":1}`, 1)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Result{{Outcome: ingest.Delivered, Charge: 1}}, res)

	// 3 units left: a and e are stored, b is a charged duplicate, c and d
	// are refused for good, f finds no capacity.
	res, err = hs.Write(ctx, []ingest.Record{
		record("a", `{"mag":2}`, 1),
		record("b", `{"mag":1}`, 1),
		record("c", `{"depth":3}`, 1),
		record("d", `not json`, 1),
		record("e", ` {"mag": 3} `, 1),
		record("f", `{"mag":4}`, 1),
	})
	require.NoError(t, err)
	require.Equal(t, []ingest.Result{
		{Outcome: ingest.Delivered, Charge: 1},
		{Outcome: ingest.Duplicate, Charge: 1},
		{Outcome: ingest.Permanent, Reason: `HTTP 400: missing required field "mag"`},
		{Outcome: ingest.Permanent, Reason: "HTTP 400: value is not a JSON object"},
		{Outcome: ingest.Delivered, Charge: 1},
		{Outcome: ingest.Retryable, Throttled: true, RetryAfter: 250 * time.Millisecond, Reason: "HTTP 429: throttled: capacity exhausted"},
	}, res)

	// A whole-request 429.
	res, err = hs.Write(ctx, []ingest.Record{record("g", `{"mag":1}`, 1), record("h", `{"mag":1}`, 1)})
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, ingest.Result{Outcome: ingest.Retryable, Throttled: true, RetryAfter: 250 * time.Millisecond,
			Reason: "HTTP 429: throttled: capacity exhausted"}, r)
	}

	st, err := hs.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, sim.Stats(), st)
	require.Equal(t, ingest.SinkStats{
		Requests: 3, Records: 9, Accepted: 3, Duplicates: 1, Throttled: 3, Rejected: 2,
		UnitsAccepted: 3, MaxUnits1s: 4, MaxUnits200ms: 4, CapacityPerSec: 4,
	}, st)

	res, err = hs.Write(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, res)
}

func TestHTTPSinkInjectedFailureIsRetryable(t *testing.T) {
	t.Parallel()
	sim := newSim(t, sinksim.Config{Capacity: 10, ErrorRate: 1})
	hs := serve(t, sim.Handler(), 0)
	res, err := hs.Write(t.Context(), []ingest.Record{record("a", `{}`, 1)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Result{{Outcome: ingest.Retryable, Reason: "HTTP 503: injected failure"}}, res)
}

func TestHTTPSinkWholeRequestStatuses(t *testing.T) {
	t.Parallel()
	batch := []ingest.Record{record("a", `{}`, 1), record("b", `{}`, 2)}
	tests := []struct {
		name     string
		status   int
		header   map[string]string
		body     string
		want     *ingest.SinkError // with Err's text
		protocol string            // an ErrProtocol naming this
	}{
		{name: "429 without results", status: 429, header: map[string]string{"Retry-After": "2"},
			want: &ingest.SinkError{Throttled: true, RetryAfter: 2 * time.Second, Err: errors.New("sink: HTTP 429: ")}},
		{name: "429 prefers ms header", status: 429, header: map[string]string{"Retry-After": "2", sinkwire.HeaderRetryAfterMs: "120"},
			want: &ingest.SinkError{Throttled: true, RetryAfter: 120 * time.Millisecond, Err: errors.New("sink: HTTP 429: ")}},
		{name: "503 with Retry-After is throttling", status: 503, header: map[string]string{"Retry-After": "1"}, body: "busy",
			want: &ingest.SinkError{Throttled: true, RetryAfter: time.Second, Err: errors.New("sink: HTTP 503: busy")}},
		{name: "503 text body", status: 503, body: "overloaded",
			want: &ingest.SinkError{Err: errors.New("sink: HTTP 503: overloaded")}},
		{name: "401", status: 401, body: `{"error":"invalid token"}`,
			want: &ingest.SinkError{Err: errors.New("sink: HTTP 401: invalid token")}},
		{name: "400 wire error: a format mismatch, not 2 bad records", status: 400, body: `{"results":[],"error":"request body must be a JSON array"}`,
			want: &ingest.SinkError{Err: errors.New("sink: HTTP 400: request body must be a JSON array")}},
		{name: "200 with too few results", status: 200, body: `{"results":[{"id":"a","status":201}]}`,
			protocol: "1 results for 2 records"},
		{name: "207 with a wrong id", status: 207, body: `{"results":[{"id":"a","status":201},{"id":"z","status":201}]}`,
			protocol: `result 1 is for id "z", want "b"`},
		{name: "200 with a body it cannot read", status: 200, body: `{"ok":true}`,
			protocol: "0 results for 2 records"},
		{name: "200 with garbage", status: 200, body: `<html>`,
			protocol: "undecodable body"},
		{name: "302", status: 302, header: map[string]string{"Location": "/elsewhere"},
			protocol: "unexpected HTTP 302"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			hs := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tt.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}), 0)
			res, err := hs.Write(t.Context(), batch)
			require.Nil(t, res)
			if tt.protocol != "" {
				require.ErrorIs(t, err, sink.ErrProtocol)
				require.ErrorContains(t, err, tt.protocol)
				return
			}
			var se *ingest.SinkError
			require.ErrorAs(t, err, &se)
			require.Equal(t, tt.want.Throttled, se.Throttled)
			require.Equal(t, tt.want.RetryAfter, se.RetryAfter)
			require.EqualError(t, se, tt.want.Err.Error())
		})
	}
}

func TestHTTPSinkTimeout(t *testing.T) {
	t.Parallel()
	// The timeout is long enough for the request to reach a server on a
	// loaded machine (a 50 ms one timed out before sending under the
	// parallel suite) and 60 times shorter than the sink's latency.
	sim := newSim(t, sinksim.Config{Capacity: 10, Latency: time.Minute})
	hs := serve(t, sim.Handler(), time.Second)
	_, err := hs.Write(t.Context(), []ingest.Record{record("a", `{}`, 1)})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "sink: write 1 records")
	require.Eventually(t, func() bool { return sim.Stats().Accepted == 1 }, 5*time.Second, 10*time.Millisecond,
		"admitted before the latency: a retry finds a duplicate")
}

func TestHTTPSinkHonoursCancellation(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	hs := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a gone client only after the body
		close(arrived)
		<-r.Context().Done()
	}), time.Minute)
	cause := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := hs.Write(ctx, []ingest.Record{record("a", `{}`, 1)})
		done <- err
	}()
	<-arrived
	cancel(cause)
	require.ErrorIs(t, <-done, cause)

	_, err := hs.Stats(ctx)
	require.ErrorIs(t, err, cause)
}

func TestHTTPSinkStatsErrors(t *testing.T) {
	t.Parallel()
	hs := serve(t, http.NotFoundHandler(), 0)
	_, err := hs.Stats(t.Context())
	require.ErrorIs(t, err, sink.ErrProtocol)
	require.ErrorContains(t, err, "HTTP 404")
}

func TestSimChargesByItsOwnRule(t *testing.T) {
	t.Parallel()
	rule, err := ingest.ParseCost(ingest.UnitCost, "5/KiB")
	require.NoError(t, err)
	sim := newSim(t, sinksim.Config{Capacity: 1000, Unit: ingest.UnitCost, Charge: &rule, ChargeFactor: 1.2})
	hs := serve(t, sim.Handler(), 0)
	big := `{"pad":"` + strings.Repeat("x", 1500) + `"}` // 2 KiB started: 10 units, ×1.2 = 12
	res, err := hs.Write(t.Context(), []ingest.Record{record("a", `{"n":1}`, 5), record("b", big, 10)})
	require.NoError(t, err)
	require.Equal(t, []int64{6, 12}, []int64{res[0].Charge, res[1].Charge}, "⌈1.2 × 5⌉ and ⌈1.2 × 10⌉")
	require.EqualValues(t, 18, sim.Snapshot(false).UnitsCharged)
}

func TestRequestChargeHeaderWithoutPerRecordCharges(t *testing.T) {
	t.Parallel()
	hs := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(sinkwire.HeaderRequestCharge, "30")
		_ = json.NewEncoder(w).Encode(sinkwire.Response{Results: []sinkwire.Result{{ID: "a", Status: sinkwire.StatusStored}, {ID: "b", Status: sinkwire.StatusDuplicate}}})
	}), 0)
	res, err := hs.Write(t.Context(), []ingest.Record{record("a", `{}`, 10), record("b", `{}`, 10)})
	require.NoError(t, err)
	require.Equal(t, []int64{20, 0}, []int64{res[0].Charge, res[1].Charge}, "the 10 units beyond the estimate go to the first record, once")
}

// BenchmarkHTTPSinkWrite measures unthrottled writes to the emulator (one
// client, one request at a time), by batch size:
// go test -run '^$' -bench HTTPSinkWrite ./sink/
func BenchmarkHTTPSinkWrite(b *testing.B) {
	for _, size := range []int{100, 500, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			sim, err := sinksim.New(sinksim.Config{Capacity: sinksim.MaxCapacity / 10})
			require.NoError(b, err)
			srv := httptest.NewServer(sim.Handler())
			b.Cleanup(srv.Close)
			hs, err := sink.NewHTTP(sink.HTTPConfig{URL: srv.URL})
			require.NoError(b, err)
			value := []byte(`{"mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`)
			n := 0
			for b.Loop() {
				batch := make([]ingest.Record, size)
				for i := range batch {
					n++
					batch[i] = ingest.Record{ID: fmt.Sprintf("r%09d", n), Value: value, Cost: 1}
				}
				if _, err := hs.Write(b.Context(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// newSim returns an emulator on the real clock.
func newSim(t *testing.T, cfg sinksim.Config) *sinksim.Sim {
	t.Helper()
	s, err := sinksim.New(cfg)
	require.NoError(t, err)
	return s
}

// A sink that stores a request and then drops the connection without an
// answer gets that request once: the transport does not re-send it on its
// own on another pooled connection (Go's transport does, for a request
// with an Idempotency-Key or a body it can rewind, when a reused
// connection drops), so every attempt the sink sees went through the pacer.
func TestSinksNeverResendOnTheirOwn(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	var drop atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var batch []sinkwire.Record
		body, _ := io.ReadAll(r.Body)
		if !drop.Load() {
			if r.Method == http.MethodPut { // REST: one record
				w.WriteHeader(http.StatusCreated)
				return
			}
			_ = json.Unmarshal(body, &batch)
			out := sinkwire.Response{Results: []sinkwire.Result{}}
			for _, rec := range batch {
				out.Results = append(out.Results, sinkwire.Result{ID: rec.ID, Status: sinkwire.StatusStored})
			}
			_ = json.NewEncoder(w).Encode(out)
			return
		}
		requests.Add(1) // applied
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = conn.Close() // and dropped without an answer
		}
	}))
	t.Cleanup(srv.Close)
	var batch []ingest.Record
	for i := range 20 {
		batch = append(batch, record(fmt.Sprint("r", i), `{"n":1}`, 1))
	}
	emulator, err := sink.NewHTTP(sink.HTTPConfig{URL: srv.URL, Timeout: 5 * time.Second})
	require.NoError(t, err)
	rest, err := sink.NewREST(sink.RESTConfig{URL: srv.URL + "/items/{$id}", Method: http.MethodPut})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		s    ingest.Sink
		want int64 // requests per write
	}{{"emulator protocol", emulator, 1}, {"REST", rest, 20}} {
		drop.Store(false)
		var wg sync.WaitGroup
		for range 8 { // several pooled connections, idle once answered
			wg.Go(func() {
				_, err := tc.s.Write(t.Context(), batch)
				require.NoError(t, err, tc.name)
			})
		}
		wg.Wait()
		drop.Store(true)
		requests.Store(0)
		_, err := tc.s.Write(t.Context(), batch)
		require.Error(t, err, "%s: a dropped connection is a failure of the request", tc.name)
		require.Equal(t, tc.want, requests.Load(), "%s: one request per attempt, never re-sent by the transport", tc.name)
	}
}
