package sinksim

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinkwire"
)

// Emulator modes (Config.Mode).
const (
	// ModeBucket is a token bucket holding one second of capacity, refilled
	// at Capacity units/s and full at start: a per-second budget like Cosmos
	// DB's provisioned RU/s. A sliding 1 s window can admit up to about
	// 2 × Capacity (a full bucket plus one second of refill); MaxUnits1s
	// shows whether a client let that happen.
	ModeBucket = "bucket"
	// ModeWindow admits a record only if the units admitted in the sliding
	// window (t−1 s, t] stay ≤ Capacity: never more than Capacity in any 1 s.
	ModeWindow = "window"
)

// Emulator limits.
const (
	// DefaultMaxBodyBytes is the default request body limit: 8 MiB, twice
	// the 4 MiB entity-group batch of the storage vendors.
	DefaultMaxBodyBytes = 8 << 20
	// MaxCapacity is the largest Capacity, in units/s (exact integer
	// accounting needs Capacity × 1e9 to fit in an int64).
	MaxCapacity = 1_000_000_000
	// maxSeries caps the 200 ms series at about 58 hours.
	maxSeries  = 1 << 20
	seriesStep = 200 * time.Millisecond
)

// Config configures the throttled sink emulator.
type Config struct {
	// Capacity is the provisioned rate in units/s; required, 1..MaxCapacity.
	Capacity int64
	// Mode is ModeBucket (default) or ModeWindow.
	Mode string
	// Unit is what Capacity counts; it sets the default cost of a record
	// sent without one (1, or len(value) for bytes). Default records.
	Unit ingest.Unit
	// Latency delays every /v1/records answer (after admission, so a
	// client that times out may find its records stored when it retries).
	// Default 0.
	Latency time.Duration
	// ErrorRate is the fraction (0..1) of valid records answered 503
	// instead of being admitted; they are not charged. Default 0.
	ErrorRate float64
	// RequiredFields are top-level fields every record value must have
	// (present and not null), else it is rejected with 400.
	RequiredFields []string
	// Seed seeds the error injection, so the same requests fail the same
	// way in every run (and again after a reset).
	Seed int64
	// MaxBodyBytes limits a request body; a larger one is answered 413.
	// Default DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Charge, when set, is the emulator's own cost rule (Unit must be
	// cost): every record is charged ⌈ChargeFactor × Charge.Price(value)⌉
	// units whatever cost the client sent, the way a real service charges
	// by its own rules. Nil: the client's cost. The charge of each stored or
	// duplicate record is reported in its result and the total in
	// x-ms-request-charge.
	Charge *ingest.Pricing
	// ChargeFactor scales the Charge rule, e.g. 1.2 for a service that
	// charges 20 % more than a client estimates. Default 1.
	ChargeFactor float64
	// PartitionLimit, when > 0, turns on range partitions: keys (a
	// record's "key", else its id) are ordered lexicographically and cut
	// into ranges, each admitting at most PartitionLimit operations
	// (records) in any sliding second, on top of Capacity; a record its
	// range refuses is answered 429 alone. 0 (default): no ranges.
	// DefaultPartitionLimit is the vendors' figure.
	PartitionLimit int64
	// SplitAfter is how long a range must stay hot (≥ 50 % of its limit
	// used, or throttling, in the last second) before it splits at the
	// median of its recent keys. Default DefaultSplitAfter.
	SplitAfter time.Duration
	// MaxPartitions caps the number of ranges. Default DefaultMaxPartitions.
	MaxPartitions int
	// Clock returns the current time. Default time.Now; tests inject a
	// fake clock. Readings that go backwards are treated as the last one.
	Clock func() time.Time
}

// Sim is the throttled sink emulator (`sluice sink-sim`). It serves the wire
// protocol of the package doc, enforces Capacity, dedupes by record ID and
// keeps exact statistics. Safe for concurrent use; every request is
// admitted atomically.
//
// The dedupe set keeps a fixed-size hash of each stored ID, IDHash (96 bits
// of its SHA-256), in a Go map: 18 to 30 bytes per record stored (measured
// by BenchmarkDedupeMemory; at most 40), so a rehearsal of 100 million
// records needs about 3 GiB. Two different IDs share a hash with
// probability about n²/2⁹⁷ over n stored records (6·10⁻¹⁴ for 100
// million); the second would be counted a duplicate and not stored.
type Sim struct {
	cfg   Config
	clock func() time.Time

	mu    sync.Mutex
	epoch time.Time // start or last reset; accounting times are offsets from it

	charged                 bool          // any units charged since epoch
	firstCharge, lastCharge time.Duration // offsets of the first and latest charge
	last                    time.Duration // latest accounting time (monotonic clamp)
	rng                     *rand.Rand
	stored                  map[IDHash]struct{}
	tokens                  int64         // bucket: units × 1e9
	filled                  time.Duration // bucket: time of the last refill
	admit                   ingest.Window // window mode: admitted units in the last 1 s
	win1s                   ingest.Window // stats: max units in any 1 s
	win200                  ingest.Window // stats: max units in any 200 ms
	stats                   sinkwire.Stats
	series                  []int64
	ranges                  *ranges // nil without PartitionLimit
}

// IDHash is the fixed-size hash the emulator keeps of each stored record
// ID: the first 96 bits of the ID's SHA-256.
type IDHash [12]byte

// HashID returns id's IDHash.
func HashID(id string) IDHash {
	sum := sha256.Sum256([]byte(id))
	return IDHash(sum[:12])
}

// New validates cfg, fills its defaults and returns an emulator whose
// bucket is full. It returns an error naming the first bad field.
func New(cfg Config) (*Sim, error) {
	switch {
	case cfg.Capacity <= 0 || cfg.Capacity > MaxCapacity:
		return nil, fmt.Errorf("sinksim: capacity %d units/s out of range 1..%d", cfg.Capacity, MaxCapacity)
	case !(cfg.ErrorRate >= 0 && cfg.ErrorRate <= 1):
		return nil, fmt.Errorf("sinksim: error rate %v out of range 0..1", cfg.ErrorRate)
	case cfg.Latency < 0:
		return nil, fmt.Errorf("sinksim: latency %v is negative", cfg.Latency)
	case cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("sinksim: max body bytes %d is negative", cfg.MaxBodyBytes)
	case cfg.ChargeFactor < 0 || math.IsNaN(cfg.ChargeFactor) || math.IsInf(cfg.ChargeFactor, 0):
		return nil, fmt.Errorf("sinksim: charge factor %v must be a finite number > 0", cfg.ChargeFactor)
	case cfg.PartitionLimit < 0 || cfg.PartitionLimit > MaxCapacity:
		return nil, fmt.Errorf("sinksim: partition limit %d ops/s out of range 0..%d", cfg.PartitionLimit, MaxCapacity)
	case cfg.SplitAfter < 0:
		return nil, fmt.Errorf("sinksim: split-after %v is negative", cfg.SplitAfter)
	case cfg.MaxPartitions < 0:
		return nil, fmt.Errorf("sinksim: max partitions %d is negative", cfg.MaxPartitions)
	}
	if cfg.SplitAfter == 0 {
		cfg.SplitAfter = DefaultSplitAfter
	}
	if cfg.MaxPartitions == 0 {
		cfg.MaxPartitions = DefaultMaxPartitions
	}
	if cfg.ChargeFactor == 0 {
		cfg.ChargeFactor = 1
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeBucket
	}
	if cfg.Mode != ModeBucket && cfg.Mode != ModeWindow {
		return nil, fmt.Errorf("sinksim: unknown mode %q (want %s or %s)", cfg.Mode, ModeBucket, ModeWindow)
	}
	if cfg.Unit == "" {
		cfg.Unit = ingest.UnitRecords
	}
	if _, err := ingest.ParseUnit(string(cfg.Unit)); err != nil {
		return nil, fmt.Errorf("sinksim: %w", err)
	}
	for i, f := range cfg.RequiredFields {
		if f == "" {
			return nil, fmt.Errorf("sinksim: required field %d is empty", i)
		}
	}
	cfg.RequiredFields = append([]string(nil), cfg.RequiredFields...)
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	s := &Sim{cfg: cfg, clock: cfg.Clock}
	if s.clock == nil {
		s.clock = time.Now
	}
	s.Reset()
	return s, nil
}

// Reset clears the stored IDs and the statistics, refills the bucket,
// reseeds the error injection and restarts the series at the current time.
func (s *Sim) Reset() {
	now := s.clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch, s.last = now, 0
	s.rng = rand.New(rand.NewPCG(uint64(s.cfg.Seed), 0x5151ce))
	s.stored = make(map[IDHash]struct{})
	s.tokens, s.filled = s.cfg.Capacity*int64(time.Second), 0
	s.admit, s.win1s, s.win200 = ingest.NewWindow(time.Second), ingest.NewWindow(time.Second), ingest.NewWindow(200*time.Millisecond)
	s.stats = sinkwire.Stats{Mode: s.cfg.Mode, Unit: s.cfg.Unit}
	s.stats.CapacityPerSec = s.cfg.Capacity
	s.series = nil
	s.charged = false
	s.ranges = nil
	if s.cfg.PartitionLimit > 0 {
		s.ranges = newRanges(s.cfg.PartitionLimit, s.cfg.SplitAfter, s.cfg.MaxPartitions)
	}
}

// Stats returns the statistics since the start or the last reset.
func (s *Sim) Stats() ingest.SinkStats {
	return s.Snapshot(false).SinkStats
}

// Snapshot returns the full statistics; with series, also the units charged
// per 200 ms bucket.
func (s *Sim) Snapshot(series bool) sinkwire.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.MaxUnits1s, st.MaxUnits200ms = s.win1s.Max(), s.win200.Max()
	if s.charged {
		st.FirstChargeAt, st.LastChargeAt = s.epoch.Add(s.firstCharge), s.epoch.Add(s.lastCharge)
	}
	if s.ranges != nil {
		st.Partitions, st.Splits = s.ranges.stats(), s.ranges.splits
	}
	if series {
		st.SeriesStart = s.epoch
		st.UnitsPer200ms = append([]int64{}, s.series...)
	}
	return st
}

// Handler serves the wire protocol: POST /v1/records, GET /v1/stats
// (?series=1 adds the 200 ms series) and POST /v1/reset.
func (s *Sim) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+sinkwire.PathRecords, s.serveRecords)
	mux.HandleFunc("GET "+sinkwire.PathStats, func(w http.ResponseWriter, r *http.Request) {
		httpserver.WriteJSON(w, http.StatusOK, s.Snapshot(r.URL.Query().Get("series") == "1"))
	})
	mux.HandleFunc("POST "+sinkwire.PathReset, func(w http.ResponseWriter, _ *http.Request) {
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// incoming is one parsed request element.
type incoming struct {
	id     string
	key    string // the range partitioning key: the record's key, else its id
	cost   int64
	reason string // non-empty: rejected with 400
}

func (s *Sim) serveRecords(w http.ResponseWriter, r *http.Request) {
	body, err := readAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), r.ContentLength, s.cfg.MaxBodyBytes)
	if err != nil {
		s.countMalformed()
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			httpserver.WriteJSON(w, http.StatusRequestEntityTooLarge, sinkwire.Response{Results: []sinkwire.Result{},
				Error: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)})
			return
		}
		httpserver.WriteJSON(w, http.StatusBadRequest, sinkwire.Response{Results: []sinkwire.Result{}, Error: "read request body: " + err.Error()})
		return
	}
	elems, err := readBody(body, len(s.cfg.RequiredFields) > 0 || s.cfg.Charge != nil)
	if err != nil {
		s.countMalformed()
		httpserver.WriteJSON(w, http.StatusBadRequest, sinkwire.Response{Results: []sinkwire.Result{},
			Error: "request body must be a JSON array of {id, cost, value} records: " + err.Error()})
		return
	}
	recs := make([]incoming, len(elems))
	for i := range elems {
		recs[i] = s.parse(i, &elems[i])
	}
	results, wait := s.admitBatch(recs)

	if d := s.cfg.Latency; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return // the client is gone
		}
	}
	code, stored, throttled := http.StatusOK, 0, 0
	for _, res := range results {
		switch res.Status {
		case sinkwire.StatusStored, sinkwire.StatusDuplicate:
			stored++
		case sinkwire.StatusThrottled:
			throttled++
		}
	}
	switch {
	case stored == len(results):
		code = http.StatusOK
	case throttled == len(results):
		code = http.StatusTooManyRequests
	default:
		code = http.StatusMultiStatus
	}
	var charge int64
	for _, res := range results {
		charge += res.Charge
	}
	w.Header().Set(sinkwire.HeaderRequestCharge, strconv.FormatInt(charge, 10))
	if throttled > 0 {
		w.Header().Set(sinkwire.HeaderRetryAfter, strconv.FormatInt(ceilDiv(int64(wait), int64(time.Second)), 10))
		w.Header().Set(sinkwire.HeaderRetryAfterMs, strconv.FormatInt(ceilDiv(int64(wait), int64(time.Millisecond)), 10))
	}
	httpserver.WriteJSON(w, code, sinkwire.Response{Results: results})
}

// parse validates element i of a request; the record is rejected (reason
// set) when it is not an object with a non-empty string id, an integer cost
// ≥ 1 and at most Capacity, and a JSON-object value with every required
// field.
func (s *Sim) parse(i int, el *element) incoming {
	wr := el.rec
	switch {
	case !el.object:
		return incoming{reason: fmt.Sprintf("record %d is not a {id, cost, value} object", i)}
	case el.typeErr != nil:
		return incoming{id: wr.ID, reason: fmt.Sprintf("record %d is not a {id, cost, value} object: %v", i, el.typeErr)}
	}
	in := incoming{id: wr.ID, key: cmp.Or(wr.Key, wr.ID)}
	switch {
	case wr.ID == "":
		in.reason = fmt.Sprintf("record %d has no id", i)
	case el.valueN == 0 || el.first == 'n':
		in.reason = "record has no value"
	case el.first != '{':
		in.reason = "value is not a JSON object"
	case wr.Cost != nil && *wr.Cost < 1:
		in.reason = fmt.Sprintf("cost %d is not ≥ 1", *wr.Cost)
	}
	if in.reason != "" {
		return in
	}
	wr.Value = el.value
	switch {
	case s.cfg.Charge != nil:
		in.cost = int64(math.Ceil(s.cfg.ChargeFactor*float64(s.cfg.Charge.Price(wr.Value)) - 1e-9))
	case wr.Cost != nil:
		in.cost = *wr.Cost
	case s.cfg.Unit == ingest.UnitBytes:
		in.cost = int64(el.valueN)
	default:
		in.cost = 1
	}
	if in.cost > s.cfg.Capacity {
		in.reason = fmt.Sprintf("cost %d units exceeds the sink's capacity of %d units/s", in.cost, s.cfg.Capacity)
		return in
	}
	if len(s.cfg.RequiredFields) > 0 {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(wr.Value, &obj); err != nil {
			in.reason = "value is not a JSON object: " + err.Error()
			return in
		}
		for _, f := range s.cfg.RequiredFields {
			if v, ok := obj[f]; !ok || string(v) == "null" {
				in.reason = fmt.Sprintf("missing required field %q", f)
				return in
			}
		}
	}
	return in
}

// admitBatch decides every record of one request at one instant, in order:
// a rejected record is answered 400; a record its key range refuses is
// throttled alone; once capacity throttles a record every later valid
// record is throttled too (records are admitted in order while capacity
// lasts);
// otherwise an injected failure (503, not charged), else the record is
// charged and stored (201) or found a duplicate (200). wait is the time
// until the first throttled record would fit, 0 if none was throttled.
func (s *Sim) admitBatch(recs []incoming) (results []sinkwire.Result, wait time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.now()
	s.refill(at)
	if s.cfg.Mode == ModeWindow {
		s.admit.Expire(at)
	}
	results = make([]sinkwire.Result, len(recs))
	var charged, acceptedUnits int64
	throttled := false    // capacity exhausted: the rest of the request is throttled
	anyThrottled := false // a record was throttled, by capacity or by its range
	for i, in := range recs {
		res := sinkwire.Result{ID: in.id}
		switch {
		case in.reason != "":
			res.Status, res.Error = sinkwire.StatusRejected, in.reason
			s.stats.Rejected++
		case throttled:
			res.Status, res.Error = sinkwire.StatusThrottled, "throttled: capacity exhausted"
			s.stats.Throttled++
		case s.cfg.ErrorRate > 0 && s.rng.Float64() < s.cfg.ErrorRate:
			res.Status, res.Error = sinkwire.StatusFailed, "injected failure"
			s.stats.Failed++
		default:
			part := -1
			if s.ranges != nil {
				part = s.ranges.find(in.key)
				if w := s.ranges.wait(at, part, 0); w > 0 {
					s.ranges.throttle(at, part)
					if !anyThrottled {
						wait = w
					}
					anyThrottled = true
					res.Status, res.Error = sinkwire.StatusThrottled, "throttled: the key's range partition is at its limit"
					s.stats.Throttled++
					break
				}
			}
			if w := s.take(at, charged, in.cost); w > 0 {
				if !anyThrottled {
					wait = w
				}
				throttled, anyThrottled = true, true
				res.Status, res.Error = sinkwire.StatusThrottled, "throttled: capacity exhausted"
				s.stats.Throttled++
				break
			}
			if part >= 0 {
				s.ranges.admit(at, part, in.key)
			}
			charged += in.cost
			res.Charge = in.cost
			h := HashID(in.id)
			if _, dup := s.stored[h]; dup {
				res.Status = sinkwire.StatusDuplicate
				s.stats.Duplicates++
				break
			}
			s.stored[h] = struct{}{}
			res.Status = sinkwire.StatusStored
			s.stats.Accepted++
			acceptedUnits += in.cost
		}
		results[i] = res
	}
	s.stats.Requests++
	s.stats.Records += int64(len(recs))
	s.stats.UnitsAccepted += acceptedUnits
	s.stats.UnitsCharged += charged
	if anyThrottled {
		s.stats.ThrottledRequests++
	}
	if s.ranges != nil {
		s.ranges.settle(at)
	}
	if charged > 0 {
		if !s.charged {
			s.charged, s.firstCharge = true, at
		}
		s.lastCharge = at
		if s.cfg.Mode == ModeWindow {
			s.admit.Add(at, charged)
		}
		s.win1s.Add(at, charged)
		s.win200.Add(at, charged)
		if i := int(at / seriesStep); i < maxSeries {
			for len(s.series) <= i {
				s.series = append(s.series, 0)
			}
			s.series[i] += charged
		}
	}
	return results, wait
}

// take charges cost units at at, on top of pending units already charged at
// at by the same request, and returns 0; or, if they do not fit, charges
// nothing and returns how long until they would (> 0).
func (s *Sim) take(at time.Duration, pending, cost int64) time.Duration {
	if s.cfg.Mode == ModeWindow {
		return s.admit.WaitFor(at, pending, cost, s.cfg.Capacity)
	}
	need := cost * int64(time.Second)
	if s.tokens >= need {
		s.tokens -= need
		return 0
	}
	return time.Duration(ceilDiv(need-s.tokens, s.cfg.Capacity))
}

// refill adds Capacity units/s to the bucket since the last refill, exactly:
// tokens are kept in units × 1e9, so one nanosecond adds Capacity of them.
func (s *Sim) refill(at time.Duration) {
	full := s.cfg.Capacity * int64(time.Second)
	elapsed := at - s.filled
	s.filled = at
	if elapsed >= time.Second {
		s.tokens = full
		return
	}
	s.tokens = min(full, s.tokens+int64(elapsed)*s.cfg.Capacity)
}

// now returns the accounting time: the offset of the clock from the epoch,
// never less than the previous one. Called with mu held.
func (s *Sim) now() time.Duration {
	at := s.clock().Sub(s.epoch)
	if at > s.last {
		s.last = at
	}
	return s.last
}

func (s *Sim) countMalformed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests++
	s.stats.Malformed++
}

// readAll reads r to its end into a buffer sized for the announced length
// (when known and within limit), so a large body is not copied as the
// buffer grows.
func readAll(r io.Reader, length, limit int64) ([]byte, error) {
	if length <= 0 || length > limit {
		return io.ReadAll(r)
	}
	buf := bytes.NewBuffer(make([]byte, 0, length+bytes.MinRead))
	_, err := buf.ReadFrom(r)
	return buf.Bytes(), err
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
