package lease

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func miniClient(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return mr, c
}

func TestWaterFill(t *testing.T) {
	t.Parallel()
	m := func(w string, want int) member { return member{Worker: w, Want: want} }
	for _, tc := range []struct {
		name       string
		partitions int
		members    []member
		want       map[string]int
	}{
		{"alone with backlog takes all", 20, []member{m("a", 20)}, map[string]int{"a": 20}},
		{"two backlogs split evenly", 20, []member{m("a", 20), m("b", 20)}, map[string]int{"a": 10, "b": 10}},
		{"odd split goes to lowest IDs", 10, []member{m("c", 10), m("a", 10), m("b", 10)}, map[string]int{"a": 4, "b": 3, "c": 3}},
		{"small demand satisfied, rest shared", 10, []member{m("a", 2), m("b", 10), m("c", 10)}, map[string]int{"a": 2, "b": 4, "c": 4}},
		{"idle worker holds nothing", 10, []member{m("a", 0), m("b", 10)}, map[string]int{"a": 0, "b": 10}},
		{"wants below capacity leave partitions free", 10, []member{m("a", 3), m("b", 2)}, map[string]int{"a": 3, "b": 2}},
		{"more workers than partitions", 2, []member{m("c", 2), m("b", 2), m("a", 2)}, map[string]int{"a": 1, "b": 1, "c": 0}},
		{"negative want counts as zero", 4, []member{m("a", -3), m("b", 4)}, map[string]int{"a": 0, "b": 4}},
		{"cascading levels", 12, []member{m("a", 1), m("b", 3), m("c", 5), m("d", 12)}, map[string]int{"a": 1, "b": 3, "c": 4, "d": 4}},
		{"no members", 5, nil, map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := waterFill(tc.partitions, tc.members, nil)
			require.Equal(t, tc.want, got)
			// The answer does not depend on the order of the list.
			rev := make([]member, len(tc.members))
			for i, x := range tc.members {
				rev[len(rev)-1-i] = x
			}
			require.Equal(t, got, waterFill(tc.partitions, rev, nil))
			sum, wants := 0, 0
			for _, x := range tc.members {
				sum += got[x.Worker]
				wants += max(x.Want, 0)
			}
			require.Equal(t, min(tc.partitions, wants), sum)
		})
	}
}

func TestFairShareWithReserved(t *testing.T) {
	t.Parallel()
	m := func(w string, want, reserved int) member { return member{Worker: w, Want: want, Reserved: reserved} }
	for _, tc := range []struct {
		name       string
		partitions int
		members    []member
		want       map[string]int
	}{
		{"no reservations is the water fill", 20, []member{m("a", 20, 0), m("b", 20, 0)}, map[string]int{"a": 10, "b": 10}},
		{"reserved on top of an even share of the rest", 20, []member{m("a", 20, 4), m("b", 20, 0)}, map[string]int{"a": 12, "b": 8}},
		{"idle worker keeps its reservation", 20, []member{m("a", 0, 5), m("b", 20, 0)}, map[string]int{"a": 5, "b": 15}},
		{"want below reservation still holds it", 10, []member{m("a", 2, 3), m("b", 10, 0)}, map[string]int{"a": 3, "b": 7}},
		{"small demand beyond reservation", 10, []member{m("a", 4, 3), m("b", 10, 2)}, map[string]int{"a": 4, "b": 6}},
		{"over-reserved pool goes by worker ID", 6, []member{m("b", 6, 4), m("a", 6, 4)}, map[string]int{"a": 4, "b": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := fairShare(tc.partitions, tc.members)
			require.Equal(t, tc.want, got)
			sum := 0
			for _, n := range got {
				sum += n
			}
			require.LessOrEqual(t, sum, tc.partitions)
		})
	}
}

// A worker whose head record needs more partitions than its share gets
// them whole, longest-waiting first, or none while it waits its turn; the
// others share the rest.
func TestFairShareWithNeeds(t *testing.T) {
	t.Parallel()
	m := func(w string, want, need int, since int64) member {
		return member{Worker: w, Want: want, Need: need, NeedSince: since}
	}
	r := func(w string, want, reserved, need int, since int64) member {
		return member{Worker: w, Want: want, Reserved: reserved, Need: need, NeedSince: since}
	}
	for _, tc := range []struct {
		name       string
		partitions int
		members    []member
		want       map[string]int
	}{
		{"needs of one are any share", 3, []member{m("a", 3, 1, 5), m("b", 3, 1, 1), m("c", 3, 1, 3), m("d", 3, 1, 2)},
			map[string]int{"a": 1, "b": 1, "c": 1, "d": 0}},
		{"a need within the fair share changes nothing", 10, []member{m("a", 10, 3, 1), m("b", 10, 0, 0)},
			map[string]int{"a": 5, "b": 5}},
		{"two of four costly workers served, the others wait", 10,
			[]member{m("a", 10, 5, 4), m("b", 10, 5, 2), m("c", 10, 5, 1), m("d", 10, 5, 3)},
			map[string]int{"c": 5, "b": 5, "a": 0, "d": 0}},
		{"a served need, the rest shared with cheap workers", 10,
			[]member{m("a", 10, 6, 1), m("b", 10, 0, 0), m("c", 10, 0, 0)},
			map[string]int{"a": 6, "b": 2, "c": 2}},
		{"a need that does not fit waits; the rest is shared", 10,
			[]member{m("a", 10, 6, 1), m("b", 10, 6, 2), m("c", 10, 0, 0)},
			map[string]int{"a": 6, "b": 0, "c": 4}},
		{"a need never exceeds the want", 10, []member{m("a", 2, 8, 1), m("b", 10, 0, 0)},
			map[string]int{"a": 2, "b": 8}},
		{"a need counts the reservation", 10, []member{r("a", 10, 4, 6, 1), r("b", 10, 0, 6, 2)},
			map[string]int{"a": 10, "b": 0}},
		{"a reservation covers the need", 10, []member{r("a", 10, 6, 6, 1), r("b", 10, 0, 4, 2)},
			map[string]int{"a": 6, "b": 4}},
		{"the longest wait wins whatever the ID", 8, []member{m("z", 8, 5, 1), m("a", 8, 5, 9)},
			map[string]int{"z": 8, "a": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := fairShare(tc.partitions, tc.members)
			require.Equal(t, tc.want, got)
			sum := 0
			for _, n := range got {
				sum += n
			}
			require.LessOrEqual(t, sum, tc.partitions)
		})
	}
}

func TestAnnouncementRoundTrip(t *testing.T) {
	t.Parallel()
	for _, a := range []announcement{{Want: 3, Demand: 250, Backlog: -1}, {Want: 20, Demand: math.Inf(1), Reserved: 4, Backlog: 12000},
		{Want: 10, Demand: math.Inf(1), Backlog: 5e6, Need: 5, NeedSince: 1_795_000_000_123}, {}} {
		got, err := decodeAnnouncement(a.encode())
		require.NoError(t, err)
		require.Equal(t, a, got)
	}
	// An announcement from a worker that predates reservations.
	got, err := decodeAnnouncement("5 120")
	require.NoError(t, err)
	require.Equal(t, announcement{Want: 5, Demand: 120, Backlog: -1}, got)
	// One that predates needs.
	got, err = decodeAnnouncement("5 120 0 300")
	require.NoError(t, err)
	require.Equal(t, announcement{Want: 5, Demand: 120, Backlog: 300}, got)
	_, err = decodeAnnouncement("5 120 x")
	require.ErrorContains(t, err, `"5 120 x"`)
	_, err = decodeAnnouncement("")
	require.Error(t, err)
}

func TestWantPartitions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		demand float64
		want   int
	}{
		{0, 0}, {-5, 0}, {math.NaN(), 0}, {math.Inf(1), 20}, {ingest.Inf, 20},
		{1, 1}, {100, 1}, {100.5, 2}, {300, 3}, {250, 3}, {1e9, 20},
	} {
		require.Equal(t, tc.want, wantPartitions(tc.demand, 100, 20), "demand %v", tc.demand)
	}
}

func TestPoolValidate(t *testing.T) {
	t.Parallel()
	good := Pool{Name: "demo", Capacity: 1000, Unit: ingest.UnitRecords, Partitions: 20}
	require.NoError(t, good.Validate())
	for _, tc := range []struct {
		name    string
		change  func(*Pool)
		mention string
	}{
		{"empty name", func(p *Pool) { p.Name = "" }, "pool name"},
		{"name with colon", func(p *Pool) { p.Name = "a:b" }, "pool name"},
		{"zero capacity", func(p *Pool) { p.Capacity = 0 }, "capacity must be a finite number > 0"},
		{"negative capacity", func(p *Pool) { p.Capacity = -1 }, "capacity"},
		{"NaN capacity", func(p *Pool) { p.Capacity = math.NaN() }, "capacity"},
		{"infinite capacity", func(p *Pool) { p.Capacity = math.Inf(1) }, "capacity"},
		{"no partitions", func(p *Pool) { p.Partitions = 0 }, "partitions must be between 1 and 10000, got 0"},
		{"tiny TTL", func(p *Pool) { p.TTL = time.Millisecond }, "lease TTL must be ≥ 100ms, got 1ms"},
		{"unknown unit", func(p *Pool) { p.Unit = "parsecs" }, `unit: unknown unit "parsecs"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := good
			tc.change(&p)
			err := p.Validate()
			require.ErrorIs(t, err, ErrInvalidPool)
			require.ErrorContains(t, err, tc.mention)
			_, c := miniClient(t)
			require.ErrorIs(t, ensurePoolErr(context.Background(), c, "", p), ErrInvalidPool)
		})
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	_, c := miniClient(t)
	pool := Pool{Name: "demo", Capacity: 1000, Partitions: 20}
	for _, tc := range []struct {
		name    string
		cfg     Config
		mention string
	}{
		{"margin below its sum", Config{Pool: pool, Margin: time.Second},
			"Margin 1s must be ≥ RequestTimeout + Slice + Drift = 2s + 200ms + 152ms = 2.352s"},
		{"TTL too short for margin and renewal", Config{Pool: Pool{Name: "demo", Capacity: 1000, Partitions: 20, TTL: 3 * time.Second}},
			`Margin 2.232s + RenewEvery 1s must be ≤ 90% of the pool "demo" lease TTL 3s (2.7s)`},
		{"bad worker ID", Config{Pool: pool, WorkerID: "a b"}, `WorkerID "a b"`},
		{"negative tick", Config{Pool: pool, Tick: -time.Second}, "Tick must be > 0"},
		{"invalid pool", Config{Pool: Pool{Name: "demo", Partitions: 20}}, "capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tc.cfg, c)
			require.ErrorContains(t, err, tc.mention)
			require.True(t, errors.Is(err, ErrInvalidConfig) || errors.Is(err, ErrInvalidPool))
		})
	}
	_, err := New(Config{Pool: pool})
	require.ErrorContains(t, err, "at least one Redis client")

	m, err := New(Config{Pool: pool}, c)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second+200*time.Millisecond+152*time.Millisecond, m.Margin())
	require.Equal(t, 50.0, m.PartitionRate())
	require.NotEmpty(t, m.WorkerID())
}

func TestEnsurePool(t *testing.T) {
	t.Parallel()
	_, c := miniClient(t)
	ctx := context.Background()
	p := Pool{Name: "demo", Capacity: 2000, Unit: ingest.UnitRecords, Partitions: 20}
	mustEnsurePool(t, c, "", p)
	mustEnsurePool(t, c, "", p)
	p.TTL = DefaultTTL
	mustEnsurePool(t, c, "", p)

	other := Pool{Name: "demo", Capacity: 1000, Unit: ingest.UnitRecords, Partitions: 10}
	_, err := EnsurePool(ctx, c, "", other)
	require.ErrorIs(t, err, ErrPoolMismatch)
	require.EqualError(t, err, `lease: pool definition mismatch: pool "demo" is defined in Redis (sluice:demo:def) with capacity 2000 records/s, 20 partitions, ttl 15s; this worker was started with capacity 1000 records/s, 10 partitions, ttl 15s (apply it as a live change, or start the worker with the stored values)`)

	// Another prefix is another namespace.
	mustEnsurePool(t, c, "other", other)

	st, err := Status(ctx, c, "", "demo")
	require.NoError(t, err)
	require.Equal(t, 2000.0, st.Pool.Capacity)
	require.Equal(t, 100.0, st.PartitionRate)
	require.Len(t, st.Partitions, 20)
	_, err = Status(ctx, c, "", "missing")
	require.ErrorIs(t, err, ErrNoPool)

	// Changed live by `sluice pool set`: a worker restarted with its
	// original flags runs with the stored capacity and partitions...
	_, err = SetPool(ctx, c, "", "demo", 300, 5, time.Second, time.Now())
	require.NoError(t, err)
	inForce, err := EnsurePool(ctx, c, "", p)
	require.NoError(t, err)
	require.Equal(t, 300.0, inForce.Capacity)
	require.Equal(t, 5, inForce.Partitions)
	require.NotNil(t, inForce.Switch)
	// ...but a different unit is still a different pool.
	bytesPool := p
	bytesPool.Unit = ingest.UnitBytes
	_, err = EnsurePool(ctx, c, "", bytesPool)
	require.ErrorIs(t, err, ErrPoolMismatch)
}

// TestCreditExact checks the ledger arithmetic on hand-made leases: a
// running lease, an extend that returned late (a new span, the past
// unchanged), and a released one.
func TestCreditExact(t *testing.T) {
	t.Parallel()
	_, c := miniClient(t)
	m, err := New(testConfig("x", "w", Pool{Name: "p", Capacity: 100, Partitions: 4}), c)
	require.NoError(t, err)
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Partition 0: counted [0, 1000) then re-counted [1200, 2000).
	m.ledger.close(span{at(0), at(1000)}, at(5000))
	m.held[0] = &held{partition: 0, count: span{at(1200), at(2000)}}
	// Partition 1: released at 500 although valid until 900.
	m.ledger.close(span{at(100), at(900)}, at(500))

	require.Equal(t, 50.0, m.Rate(at(200)))
	require.Equal(t, 25.0, m.Rate(at(600)))
	require.Equal(t, 0.0, m.Rate(at(1100)))
	require.Equal(t, 25.0, m.Rate(at(1200)))
	require.Equal(t, 0.0, m.Rate(at(2000)))

	require.InDelta(t, 25*1.0+25*0.4+25*0.8, m.Credit(at(0), at(3000)), 1e-9)
	require.InDelta(t, 25*0.5+25*0.4, m.Credit(at(0), at(500)), 1e-9)
	require.InDelta(t, 0, m.Credit(at(1000), at(1200)), 1e-9)
	require.Equal(t, 0.0, m.Credit(at(10), at(10)))
	// Additivity: the integral of pieces is the integral of the whole.
	require.InDelta(t, m.Credit(at(0), at(3000)), m.Credit(at(0), at(700))+m.Credit(at(700), at(1500))+m.Credit(at(1500), at(3000)), 1e-9)

	m.ledger.prune(at(1001))
	require.Len(t, m.ledger.closed, 0, "both closed spans ended before the horizon")
}

// TestMiniredisClockTTL shows that the embedded setup (miniredis with
// ClockTTL) expires leases with the real clock, and that Status works on it.
func TestMiniredisClockTTL(t *testing.T) {
	t.Parallel()
	mr, c := miniClient(t)
	mr.ClockTTL(true)
	pool := Pool{Name: "emb", Capacity: 100, Partitions: 2, TTL: 1500 * time.Millisecond}
	mustEnsurePool(t, c, "emb", pool)
	cfg := testConfig("emb", "embedded-worker", pool)
	m := start(t, cfg, c)
	m.SetDemand(ingest.Inf)
	m.SetBacklog(450)
	require.Eventually(t, func() bool { return m.Rate(time.Now()) == 100 }, 2*time.Second, 5*time.Millisecond)

	var st PoolStatus
	require.Eventually(t, func() bool {
		var err error
		st, err = Status(context.Background(), c, "emb", "emb")
		return err == nil && st.Backlog == 450
	}, 2*time.Second, 5*time.Millisecond, "the backlog is announced at the next tick")
	require.Len(t, st.Members, 1)
	require.Equal(t, MemberStatus{Worker: "embedded-worker", Want: 2, Demand: 100, WantsAll: true, Holds: 2, Backlog: 450, Weight: 1}, st.Members[0])
	require.InDelta(t, 4.5, st.ETASeconds, 1e-9, "450 records at the pool's 100 records/s")
	require.Contains(t, st.String(), "backlog: 450 records, ETA 4.5s")
	for _, p := range st.Partitions {
		require.Equal(t, "embedded-worker", p.Holder)
		require.Positive(t, p.TTLLeft)
	}
	require.Contains(t, st.String(), "embedded-worker  holds 2 of 2 partitions (0-1; 100 records/s; leases ")
	require.Contains(t, st.String(), "wants 2, demand: all it can get (a backlog), backlog 450 records, normal\n")
	require.Contains(t, st.String(), "free partitions: 0 of 2\n")
	require.NotContains(t, st.String(), "Inf")
	js, err := json.Marshal(st)
	require.NoError(t, err)
	require.Contains(t, string(js), `"demand_units_per_s":100,"wants_all":true`)
	require.Contains(t, string(js), `"ttl":"1.5s"`)

	// Without renewals, the key's TTL runs down with the real clock.
	m.stop(t)
	require.NoError(t, c.Set(context.Background(), "emb:probe", "x", 300*time.Millisecond).Err())
	require.Eventually(t, func() bool { return !mr.Exists("emb:probe") }, 2*time.Second, 10*time.Millisecond)
}
