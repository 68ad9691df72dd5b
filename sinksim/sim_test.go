package sinksim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinkwire"
)

// fakeClock is a settable clock for the emulator.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestSim(t *testing.T, cfg Config) (*Sim, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	cfg.Clock = clock.Now
	s, err := New(cfg)
	require.NoError(t, err)
	return s, clock
}

// rec is a valid wire record with the given id and cost (0: omitted).
func rec(id string, cost int64) sinkwire.Record {
	r := sinkwire.Record{ID: id, Value: json.RawMessage(`{"id":"` + id + `","mag":1.5}`)}
	if cost > 0 {
		r.Cost = &cost
	}
	return r
}

func recs(prefix string, n int) []sinkwire.Record {
	out := make([]sinkwire.Record, n)
	for i := range out {
		out[i] = rec(fmt.Sprintf("%s-%d", prefix, i), 0)
	}
	return out
}

// post sends records to the emulator's handler in-process.
func post(t *testing.T, s *Sim, body any) (*httptest.ResponseRecorder, sinkwire.Response) {
	t.Helper()
	var data []byte
	switch b := body.(type) {
	case string:
		data = []byte(b)
	default:
		var err error
		data, err = json.Marshal(b)
		require.NoError(t, err)
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, sinkwire.PathRecords, bytes.NewReader(data)))
	var resp sinkwire.Response
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &resp), w.Body.String())
	require.NotNil(t, resp.Results, "results is always present")
	return w, resp
}

func countStatus(results []sinkwire.Result) map[int]int {
	m := map[int]int{}
	for _, r := range results {
		m[r.Status]++
	}
	return m
}

func TestNewSimValidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "capacity 0 units/s out of range"},
		{Config{Capacity: -5}, "capacity -5"},
		{Config{Capacity: MaxCapacity + 1}, "out of range"},
		{Config{Capacity: 10, Mode: "leaky"}, `unknown mode "leaky"`},
		{Config{Capacity: 10, ErrorRate: 1.5}, "error rate 1.5"},
		{Config{Capacity: 10, ErrorRate: -0.1}, "error rate -0.1"},
		{Config{Capacity: 10, Latency: -time.Second}, "latency -1s"},
		{Config{Capacity: 10, Unit: "kg"}, `unknown unit "kg"`},
		{Config{Capacity: 10, RequiredFields: []string{"a", ""}}, "required field 1 is empty"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg)
		require.ErrorContains(t, err, tt.want)
	}
	s, err := New(Config{Capacity: 10})
	require.NoError(t, err)
	require.Equal(t, ModeBucket, s.Snapshot(false).Mode)
	require.Equal(t, ingest.UnitRecords, s.Snapshot(false).Unit)
}

func TestSimBucketAdmitsExactly(t *testing.T) {
	t.Parallel()
	s, clock := newTestSim(t, Config{Capacity: 100})

	// A full bucket holds one second of capacity: 100 of 150 records fit.
	w, resp := post(t, s, recs("a", 150))
	require.Equal(t, http.StatusMultiStatus, w.Code)
	require.Len(t, resp.Results, 150)
	for i, r := range resp.Results {
		want := sinkwire.StatusStored
		if i >= 100 {
			want = sinkwire.StatusThrottled
		}
		require.Equal(t, want, r.Status, "record %d", i)
		require.Equal(t, fmt.Sprintf("a-%d", i), r.ID)
	}
	// One unit comes back after 10 ms: Retry-After rounds up to 1 s.
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	require.Equal(t, "10", w.Header().Get(sinkwire.HeaderRetryAfterMs))

	// Nothing left at the same instant: the whole request is throttled.
	w, resp = post(t, s, recs("b", 3))
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, map[int]int{sinkwire.StatusThrottled: 3}, countStatus(resp.Results))
	require.Equal(t, "1", w.Header().Get("Retry-After"))

	// Half a second refills 50 units.
	clock.Advance(500 * time.Millisecond)
	w, resp = post(t, s, recs("c", 60))
	require.Equal(t, http.StatusMultiStatus, w.Code)
	require.Equal(t, map[int]int{sinkwire.StatusStored: 50, sinkwire.StatusThrottled: 10}, countStatus(resp.Results))

	// A cost-30 record needs 30 units: 300 ms of refill.
	w, _ = post(t, s, []sinkwire.Record{rec("d", 30)})
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "300", w.Header().Get(sinkwire.HeaderRetryAfterMs))
	clock.Advance(299 * time.Millisecond)
	w, _ = post(t, s, []sinkwire.Record{rec("d", 30)})
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "1", w.Header().Get(sinkwire.HeaderRetryAfterMs))
	clock.Advance(time.Millisecond)
	w, _ = post(t, s, []sinkwire.Record{rec("d", 30)})
	require.Equal(t, http.StatusOK, w.Code)

	// A long idle period refills to one second of capacity, no more.
	clock.Advance(time.Hour)
	_, resp = post(t, s, recs("e", 101))
	require.Equal(t, map[int]int{sinkwire.StatusStored: 100, sinkwire.StatusThrottled: 1}, countStatus(resp.Results))

	st := s.Stats()
	require.Equal(t, ingest.SinkStats{
		Requests: 7, Records: 150 + 3 + 60 + 3 + 101, Accepted: 100 + 50 + 1 + 100,
		Throttled: 50 + 3 + 10 + 2 + 1, UnitsAccepted: 100 + 50 + 30 + 100,
		MaxUnits1s: 180, MaxUnits200ms: 100, CapacityPerSec: 100,
	}, st)
}

func TestSimWindowModeNeverExceedsCapacity(t *testing.T) {
	t.Parallel()
	const capacity = 100
	s, clock := newTestSim(t, Config{Capacity: capacity, Mode: ModeWindow})
	rng := rand.New(rand.NewPCG(3, 4))
	// The reference: ingest.Window, itself checked against brute force.
	w1, w200 := ingest.NewWindow(time.Second), ingest.NewWindow(200*time.Millisecond)
	var at time.Duration
	id := 0
	for range 600 {
		step := time.Duration(rng.Int64N(int64(60 * time.Millisecond)))
		clock.Advance(step)
		at += step
		batch := make([]sinkwire.Record, 1+rng.IntN(30))
		for i := range batch {
			batch[i] = rec(fmt.Sprint(id), 1+rng.Int64N(5))
			id++
		}
		_, resp := post(t, s, batch)
		var units int64
		for i, r := range resp.Results {
			if r.Status == sinkwire.StatusStored {
				units += *batch[i].Cost
			}
		}
		w1.Add(at, units)
		w200.Add(at, units)
	}
	max1s := w1.Max()
	require.LessOrEqual(t, max1s, int64(capacity))
	require.Greater(t, max1s, int64(capacity*9/10), "the window mode still lets capacity through")
	st := s.Stats()
	require.Equal(t, max1s, st.MaxUnits1s)
	require.Equal(t, w200.Max(), st.MaxUnits200ms)
}

func TestSimWindowModeEdges(t *testing.T) {
	t.Parallel()
	s, clock := newTestSim(t, Config{Capacity: 100, Mode: ModeWindow})
	_, resp := post(t, s, []sinkwire.Record{rec("a", 60)})
	require.Equal(t, sinkwire.StatusStored, resp.Results[0].Status)
	clock.Advance(400 * time.Millisecond)
	_, resp = post(t, s, []sinkwire.Record{rec("b", 40)})
	require.Equal(t, sinkwire.StatusStored, resp.Results[0].Status)

	// Full until the 60 units at t0 leave the window (t0, t0+1s].
	clock.Advance(100 * time.Millisecond)
	w, _ := post(t, s, []sinkwire.Record{rec("c", 50)})
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	require.Equal(t, "500", w.Header().Get(sinkwire.HeaderRetryAfterMs))
	clock.Advance(500*time.Millisecond - 1)
	w, _ = post(t, s, []sinkwire.Record{rec("c", 50)})
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	clock.Advance(1)
	w, _ = post(t, s, []sinkwire.Record{rec("c", 50)})
	require.Equal(t, http.StatusOK, w.Code)

	// 10 units left now; a cost-50 record waits for the 40 at t0+400ms to leave,
	// a cost-51 one for the 50 admitted just now.
	w, _ = post(t, s, []sinkwire.Record{rec("d", 50)})
	require.Equal(t, "400", w.Header().Get(sinkwire.HeaderRetryAfterMs))
	w, _ = post(t, s, []sinkwire.Record{rec("d", 51)})
	require.Equal(t, "1000", w.Header().Get(sinkwire.HeaderRetryAfterMs))
	require.Equal(t, int64(100), s.Stats().MaxUnits1s)
}

func TestSimDedupe(t *testing.T) {
	t.Parallel()
	s, _ := newTestSim(t, Config{Capacity: 100})
	w, resp := post(t, s, []sinkwire.Record{rec("x", 2), rec("y", 3), rec("x", 2)})
	require.Equal(t, http.StatusOK, w.Code, "stored and duplicates only: 200")
	require.Equal(t, []int{sinkwire.StatusStored, sinkwire.StatusStored, sinkwire.StatusDuplicate},
		[]int{resp.Results[0].Status, resp.Results[1].Status, resp.Results[2].Status})
	w, resp = post(t, s, []sinkwire.Record{rec("y", 3)})
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, sinkwire.StatusDuplicate, resp.Results[0].Status)

	st := s.Snapshot(false)
	require.Equal(t, int64(2), st.Accepted)
	require.Equal(t, int64(2), st.Duplicates)
	require.Equal(t, int64(5), st.UnitsAccepted)
	require.Equal(t, int64(10), st.UnitsCharged, "duplicates are charged")
	require.Equal(t, int64(10), st.MaxUnits1s)

	// A duplicate with no capacity left is throttled, not answered 200.
	_, resp = post(t, s, append(recs("fill", 90), rec("x", 1)))
	require.Equal(t, sinkwire.StatusThrottled, resp.Results[90].Status)
}

func TestSimRejectsInvalidRecords(t *testing.T) {
	t.Parallel()
	s, _ := newTestSim(t, Config{Capacity: 50, RequiredFields: []string{"mag", "time"}})
	ok := sinkwire.Record{ID: "ok", Value: json.RawMessage(`{"mag":1,"time":"t"}`)}
	body := `[
		{"id":"ok","value":{"mag":1,"time":"t"}},
		{"id":"nomag","value":{"time":"t"}},
		{"id":"nullmag","value":{"mag":null,"time":"t"}},
		{"id":"arr","value":[1,2]},
		{"id":"str","value":"not json"},
		{"id":"novalue"},
		{"value":{"mag":1,"time":"t"}},
		{"id":7,"value":{"mag":1,"time":"t"}},
		{"id":"zero","cost":0,"value":{"mag":1,"time":"t"}},
		{"id":"big","cost":51,"value":{"mag":1,"time":"t"}},
		{"id":"frac","cost":1.5,"value":{"mag":1,"time":"t"}},
		"scalar",
		{"id":"ok2","value":{"mag":1,"time":"t"}}
	]`
	w, resp := post(t, s, body)
	require.Equal(t, http.StatusMultiStatus, w.Code)
	want := []struct {
		status int
		reason string
	}{
		{sinkwire.StatusStored, ""},
		{sinkwire.StatusRejected, `missing required field "mag"`},
		{sinkwire.StatusRejected, `missing required field "mag"`},
		{sinkwire.StatusRejected, "value is not a JSON object"},
		{sinkwire.StatusRejected, "value is not a JSON object"},
		{sinkwire.StatusRejected, "record has no value"},
		{sinkwire.StatusRejected, "record 6 has no id"},
		{sinkwire.StatusRejected, "record 7 is not a {id, cost, value} object"},
		{sinkwire.StatusRejected, "cost 0 is not ≥ 1"},
		{sinkwire.StatusRejected, "cost 51 units exceeds the sink's capacity of 50 units/s"},
		{sinkwire.StatusRejected, "record 10 is not a {id, cost, value} object"},
		{sinkwire.StatusRejected, "record 11 is not a {id, cost, value} object"},
		{sinkwire.StatusStored, ""},
	}
	require.Len(t, resp.Results, len(want))
	for i, wr := range want {
		require.Equal(t, wr.status, resp.Results[i].Status, "record %d", i)
		require.Contains(t, resp.Results[i].Error, wr.reason, "record %d", i)
	}
	require.Equal(t, "nomag", resp.Results[1].ID)
	require.Empty(t, w.Header().Get("Retry-After"), "nothing throttled")

	st := s.Stats()
	require.Equal(t, int64(11), st.Rejected)
	require.Equal(t, int64(2), st.Accepted)
	require.Equal(t, int64(2), st.UnitsAccepted, "rejected records are not charged")

	// All rejected is still 207.
	w, _ = post(t, s, []sinkwire.Record{{ID: "bad", Value: json.RawMessage(`{}`)}})
	require.Equal(t, http.StatusMultiStatus, w.Code)
	w, _ = post(t, s, []sinkwire.Record{ok})
	require.Equal(t, http.StatusOK, w.Code)
}

func TestSimMalformedRequests(t *testing.T) {
	t.Parallel()
	s, _ := newTestSim(t, Config{Capacity: 10, MaxBodyBytes: 1024})
	for _, body := range []string{"", "null", "{}", `{"id":"a"}`, "[1,", "not json", `[{"id":"a"}] trailing`} {
		w, resp := post(t, s, body)
		require.Equal(t, http.StatusBadRequest, w.Code, "%q", body)
		require.Contains(t, resp.Error, "request body must be a JSON array", "%q", body)
		require.Empty(t, resp.Results)
	}
	w, resp := post(t, s, "["+strings.Repeat(" ", 2000)+"]")
	require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	require.Contains(t, resp.Error, "exceeds 1024 bytes")

	w, resp = post(t, s, "[]")
	require.Equal(t, http.StatusOK, w.Code)
	require.Empty(t, resp.Results)

	st := s.Snapshot(false)
	require.Equal(t, int64(9), st.Requests)
	require.Equal(t, int64(8), st.Malformed)
	require.Equal(t, int64(0), st.Records)

	w2 := httptest.NewRecorder()
	s.Handler().ServeHTTP(w2, httptest.NewRequest(http.MethodGet, sinkwire.PathRecords, nil))
	require.Equal(t, http.StatusMethodNotAllowed, w2.Code)
}

func TestSimInjectedFailures(t *testing.T) {
	t.Parallel()
	run := func() []int {
		s, _ := newTestSim(t, Config{Capacity: 1000, ErrorRate: 0.3, Seed: 42})
		_, resp := post(t, s, recs("r", 200))
		out := make([]int, len(resp.Results))
		for i, r := range resp.Results {
			out[i] = r.Status
		}
		st := s.Stats()
		c := countStatus(resp.Results)
		require.Equal(t, int64(c[sinkwire.StatusFailed]), st.Failed)
		require.Equal(t, int64(c[sinkwire.StatusStored]), st.UnitsAccepted, "failed records are not charged")
		require.InDelta(t, 60, c[sinkwire.StatusFailed], 25)
		return out
	}
	require.Equal(t, run(), run(), "the same seed fails the same records")

	s, _ := newTestSim(t, Config{Capacity: 10, ErrorRate: 1})
	w, resp := post(t, s, recs("f", 3))
	require.Equal(t, http.StatusMultiStatus, w.Code)
	require.Equal(t, map[int]int{sinkwire.StatusFailed: 3}, countStatus(resp.Results))
	require.Equal(t, "injected failure", resp.Results[0].Error)
}

func TestSimBytesUnitDefaultCost(t *testing.T) {
	t.Parallel()
	s, _ := newTestSim(t, Config{Capacity: 100, Unit: ingest.UnitBytes})
	value := `{"a": "0123456789"}` // 19 bytes
	_, resp := post(t, s, `[{"id":"a","value":`+value+`},{"id":"b","cost":5,"value":{}}]`)
	require.Equal(t, map[int]int{sinkwire.StatusStored: 2}, countStatus(resp.Results))
	require.Equal(t, int64(len(value)+5), s.Stats().UnitsAccepted)
}

func TestSimStatsEndpointAndReset(t *testing.T) {
	t.Parallel()
	s, clock := newTestSim(t, Config{Capacity: 100})
	post(t, s, recs("a", 10))
	clock.Advance(450 * time.Millisecond)
	post(t, s, recs("b", 5))
	post(t, s, recs("a", 2))

	get := func(url string) sinkwire.Stats {
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, url, nil))
		require.Equal(t, http.StatusOK, w.Code)
		var st sinkwire.Stats
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &st))
		var plain ingest.SinkStats
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &plain))
		require.Equal(t, st.SinkStats, plain, "decodes as ingest.SinkStats")
		return st
	}
	st := get(sinkwire.PathStats)
	require.Equal(t, s.Stats(), st.SinkStats)
	require.Equal(t, int64(15), st.Accepted)
	require.Equal(t, int64(2), st.Duplicates)
	require.Equal(t, int64(17), st.UnitsCharged)
	require.Equal(t, int64(17), st.MaxUnits1s)
	require.Equal(t, int64(10), st.MaxUnits200ms)
	require.Nil(t, st.UnitsPer200ms)

	st = get(sinkwire.PathStats + "?series=1")
	require.Equal(t, []int64{10, 0, 7}, st.UnitsPer200ms)
	require.Equal(t, newFakeClock().Now(), st.SeriesStart.UTC())

	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, sinkwire.PathReset, nil))
	require.Equal(t, http.StatusNoContent, w.Code)
	require.Equal(t, ingest.SinkStats{CapacityPerSec: 100}, s.Stats())
	_, resp := post(t, s, recs("a", 100))
	require.Equal(t, map[int]int{sinkwire.StatusStored: 100}, countStatus(resp.Results), "ids forgotten, bucket full")
}

func TestSimClockGoingBackwardsIsClamped(t *testing.T) {
	t.Parallel()
	s, clock := newTestSim(t, Config{Capacity: 10})
	clock.Advance(time.Second)
	post(t, s, recs("a", 10))
	clock.Advance(-500 * time.Millisecond)
	w, _ := post(t, s, recs("b", 1))
	require.Equal(t, http.StatusTooManyRequests, w.Code, "no refill from a clock going back")
	require.Equal(t, "100", w.Header().Get(sinkwire.HeaderRetryAfterMs))
}
