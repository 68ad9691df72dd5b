package lease

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// The fair share with priority classes and weights, on hand-made member
// lists: a higher class's want is met first, max-min fair (weighted)
// inside it; lower classes share what is left; reservations come off the
// top whatever the class.
func TestFairShareWithClassesAndWeights(t *testing.T) {
	t.Parallel()
	type m = member
	hi, lo := PriorityHigh, PriorityLow
	for _, tc := range []struct {
		name       string
		partitions int
		members    []member
		want       map[string]int
	}{
		{"live at 70 % first, the backfill gets the rest", 20,
			[]m{{Worker: "live", Want: 14, Priority: hi}, {Worker: "bulk", Want: 20, Priority: lo}},
			map[string]int{"live": 14, "bulk": 6}},
		{"a higher class with a backlog takes the whole pool", 20,
			[]m{{Worker: "live", Want: 20, Priority: hi}, {Worker: "bulk", Want: 20, Priority: lo}},
			map[string]int{"live": 20, "bulk": 0}},
		{"an idle higher class leaves everything to a lower one", 20,
			[]m{{Worker: "live", Want: 0, Priority: hi}, {Worker: "bulk", Want: 20, Priority: lo}},
			map[string]int{"live": 0, "bulk": 20}},
		{"the worker ID does not outrank the class", 10,
			[]m{{Worker: "a", Want: 10, Priority: lo}, {Worker: "z", Want: 7, Priority: hi}},
			map[string]int{"a": 3, "z": 7}},
		{"three classes in order", 20,
			[]m{{Worker: "h", Want: 8, Priority: hi}, {Worker: "n", Want: 20}, {Worker: "l", Want: 20, Priority: lo}},
			map[string]int{"h": 8, "n": 12, "l": 0}},
		{"max-min inside a class, the rest to the next", 20,
			[]m{{Worker: "h1", Want: 20, Priority: hi}, {Worker: "h2", Want: 3, Priority: hi}, {Worker: "n", Want: 20}},
			map[string]int{"h1": 17, "h2": 3, "n": 0}},
		{"two classes below their wants: nothing idle", 20,
			[]m{{Worker: "h", Want: 5, Priority: hi}, {Worker: "n", Want: 6}, {Worker: "l1", Want: 20, Priority: lo}, {Worker: "l2", Want: 20, Priority: lo}},
			map[string]int{"h": 5, "n": 6, "l1": 5, "l2": 4}},
		{"weights 2:1", 12,
			[]m{{Worker: "a", Want: 12, Weight: 2}, {Worker: "b", Want: 12, Weight: 1}},
			map[string]int{"a": 8, "b": 4}},
		{"weights 2:1 round the odd partition to proportion", 3,
			[]m{{Worker: "b", Want: 3, Weight: 1}, {Worker: "a", Want: 3, Weight: 2}},
			map[string]int{"a": 2, "b": 1}},
		{"weights 1:2:3", 12,
			[]m{{Worker: "a", Want: 12, Weight: 1}, {Worker: "b", Want: 12, Weight: 2}, {Worker: "c", Want: 12, Weight: 3}},
			map[string]int{"a": 2, "b": 4, "c": 6}},
		{"a weighted member that wants little leaves the rest to the others", 12,
			[]m{{Worker: "a", Want: 2, Weight: 3}, {Worker: "b", Want: 12, Weight: 1}, {Worker: "c", Want: 12, Weight: 1}},
			map[string]int{"a": 2, "b": 5, "c": 5}},
		{"weights apply inside a class only", 12,
			[]m{{Worker: "h", Want: 6, Weight: 1, Priority: hi}, {Worker: "n", Want: 12, Weight: 5}},
			map[string]int{"h": 6, "n": 6}},
		{"weight 0 (an earlier version) counts as 1", 10,
			[]m{{Worker: "a", Want: 10}, {Worker: "b", Want: 10, Weight: 1}},
			map[string]int{"a": 5, "b": 5}},
		{"a low reservation is held against a high backlog", 20,
			[]m{{Worker: "bulk", Want: 20, Reserved: 4, Priority: lo}, {Worker: "live", Want: 20, Priority: hi}},
			map[string]int{"bulk": 4, "live": 16}},
		{"a high reservation counts inside its want", 20,
			[]m{{Worker: "live", Want: 10, Reserved: 4, Priority: hi}, {Worker: "bulk", Want: 20, Priority: lo}},
			map[string]int{"live": 10, "bulk": 10}},
		{"reservations then class order", 20,
			[]m{{Worker: "live", Want: 20, Reserved: 2, Priority: hi}, {Worker: "bulk", Want: 20, Reserved: 3, Priority: lo}},
			map[string]int{"live": 17, "bulk": 3}},
		{"a lower class's need waits for what the higher leaves", 10,
			[]m{{Worker: "h", Want: 7, Priority: hi}, {Worker: "l", Want: 10, Need: 5, NeedSince: 1, Priority: lo}},
			map[string]int{"h": 7, "l": 0}},
		{"a lower class's need that fits what is left is served", 10,
			[]m{{Worker: "h", Want: 4, Priority: hi}, {Worker: "l", Want: 10, Need: 5, NeedSince: 1, Priority: lo}},
			map[string]int{"h": 4, "l": 6}},
		{"a higher class's need comes before a longer-waiting lower one", 10,
			[]m{{Worker: "h", Want: 10, Need: 6, NeedSince: 9, Priority: hi}, {Worker: "l", Want: 10, Need: 6, NeedSince: 1, Priority: lo}},
			map[string]int{"h": 10, "l": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := fairShare(tc.partitions, tc.members)
			require.Equal(t, tc.want, got)
			rev := slices.Clone(tc.members)
			slices.Reverse(rev)
			require.Equal(t, got, fairShare(tc.partitions, rev), "the answer does not depend on the order of the list")
		})
	}
}

// TestFairShareProperties checks, on random member lists without needs,
// what the allocation promises whatever the numbers: shares sum to what is
// wanted as far as the pool goes (nothing idle while anyone wants more);
// every reservation is held while the pool has room for it; a class gets
// anything beyond reservations only once every higher class has its want;
// and inside a class no partition could move from one member to another
// and leave the pair closer to proportion with their weights (the
// Sainte-Laguë condition of a weighted max-min fill).
func TestFairShareProperties(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(27, 1))
	for trial := range 2000 {
		partitions := 1 + rng.IntN(40)
		n := 1 + rng.IntN(7)
		members := make([]member, n)
		for i := range members {
			want := rng.IntN(partitions + 1)
			if rng.IntN(4) == 0 {
				want = partitions // a backlog
			}
			members[i] = member{
				Worker:   fmt.Sprintf("w%02d", rng.IntN(100)*10+i),
				Want:     want,
				Priority: Priorities[rng.IntN(3)],
				Weight:   1 + rng.IntN(4),
			}
			if rng.IntN(5) == 0 {
				members[i].Reserved = rng.IntN(4)
			}
		}
		got := fairShare(partitions, members)
		msg := fmt.Sprintf("trial %d: %d partitions, members %+v, shares %v", trial, partitions, members, got)

		sum, wanted, reservedLeft := 0, 0, partitions
		held := map[string]int{} // the reservation each member holds
		sorted := slices.Clone(members)
		slices.SortFunc(sorted, func(a, b member) int { return compareWorker(a, b) })
		for _, m := range sorted {
			sum += got[m.Worker]
			wanted += max(m.Want, m.Reserved)
			held[m.Worker] = min(m.Reserved, reservedLeft)
			reservedLeft -= held[m.Worker]
			require.GreaterOrEqual(t, got[m.Worker], held[m.Worker], "a reservation is held: %s", msg)
		}
		require.Equal(t, min(partitions, wanted), sum, "nothing idle while anyone wants more: %s", msg)

		for _, a := range members {
			for _, b := range members {
				aShort := got[a.Worker] < max(a.Want, a.Reserved)
				bBeyond := got[b.Worker] - held[b.Worker]
				if !aShort || bBeyond <= 0 {
					continue
				}
				// a wants more while b has partitions beyond its reservation.
				require.GreaterOrEqual(t, b.Priority, a.Priority, "a lower class got more than its reservation while a higher one wants more: %s", msg)
				if a.Priority != b.Priority || a.Worker == b.Worker {
					continue
				}
				sa, sb := got[a.Worker]-held[a.Worker], bBeyond
				// Moving one partition from b to a must not bring a below
				// b's level: (2·sb − 1)/wb ≤ (2·sa + 1)/wa.
				require.LessOrEqual(t, (2*sb-1)*a.Weight, (2*sa+1)*b.Weight, "weighted max-min inside the class: %s", msg)
			}
		}
	}
}

func compareWorker(a, b member) int {
	switch {
	case a.Worker < b.Worker:
		return -1
	case a.Worker > b.Worker:
		return 1
	}
	return 0
}

func TestParsePriority(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Priority{"high": PriorityHigh, "normal": PriorityNormal, "low": PriorityLow, " High ": PriorityHigh} {
		got, err := ParsePriority(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		back, err := ParsePriority(got.String())
		require.NoError(t, err)
		require.Equal(t, got, back)
	}
	_, err := ParsePriority("urgent")
	require.EqualError(t, err, `unknown priority class "urgent" (want high, normal or low)`)
	require.Equal(t, "priority(7)", Priority(7).String())
	require.False(t, Priority(7).Valid())
	require.Equal(t, PriorityNormal, Priority(0), "the zero value is normal")
}

func TestAnnouncementCarriesClassAndWeight(t *testing.T) {
	t.Parallel()
	a := announcement{Want: 7, Demand: 1400, Backlog: 12, Priority: PriorityHigh, Weight: 3}
	got, err := decodeAnnouncement(a.encode())
	require.NoError(t, err)
	require.Equal(t, a, got)
	require.Equal(t, "7 1400 0 12 0 0 high 3", a.encode())
	require.False(t, a.sameShare(announcement{Want: 7, Demand: 1400, Backlog: 12, Priority: PriorityLow, Weight: 3}), "a class change changes the shares")
	require.False(t, a.sameShare(announcement{Want: 7, Demand: 1400, Backlog: 12, Priority: PriorityHigh, Weight: 1}), "so does a weight change")
	// An announcement of an earlier version, without class and weight:
	// normal, weight 0 (counted as 1).
	old, err := decodeAnnouncement("5 120 0 300 0 0")
	require.NoError(t, err)
	require.Equal(t, announcement{Want: 5, Demand: 120, Backlog: 300}, old)
	_, err = decodeAnnouncement("5 120 0 300 0 0 urgent 1")
	require.ErrorContains(t, err, "urgent")
}

func TestConfigValidatesClassAndWeight(t *testing.T) {
	t.Parallel()
	_, c := miniClient(t)
	pool := Pool{Name: "demo", Capacity: 1000, Partitions: 20}
	_, err := New(Config{Pool: pool, Weight: -1}, c)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "Weight -1 must be a positive integer")
	_, err = New(Config{Pool: pool, Priority: 2}, c)
	require.ErrorContains(t, err, "Priority 2 must be")
	m, err := New(Config{Pool: pool, Priority: PriorityLow}, c)
	require.NoError(t, err)
	require.Equal(t, PriorityLow, m.Priority())
	require.Equal(t, DefaultWeight, m.Weight(), "weight defaults to 1")
}

// The classes against a real redis-server with the fast test timing: a
// low-class worker with a backlog gives a high-class one its demand at
// once, and all of the pool back when it is done; no partition is ever
// counted by both, and their credit never exceeds the pool in any sliding
// second.
func TestClassesOnRedis(t *testing.T) {
	t.Parallel()
	pool := Pool{Name: "classes", Capacity: 1000, Partitions: 10}
	c, prefix := poolOnRedis(t, pool)
	lowCfg, highCfg := testConfig(prefix, "bulk", pool), testConfig(prefix, "live", pool)
	lowCfg.Priority, highCfg.Priority = PriorityLow, PriorityHigh
	low := start(t, lowCfg, c)
	low.SetDemand(ingest.Inf)
	poll(t, func() bool { return low.Rate(time.Now()) == 1000 }, "the backfill alone takes the pool")
	stop := watchExclusive(t, c, keysFor(prefix, "classes"), low)
	began := time.Now()

	high := start(t, highCfg, c)
	high.SetDemand(700)
	poll(t, func() bool { return high.Rate(time.Now()) == 700 && low.Rate(time.Now()) == 300 }, "high served first, low the rest")
	high.SetDemand(ingest.Inf)
	poll(t, func() bool { return high.Rate(time.Now()) == 1000 && low.Rate(time.Now()) == 0 }, "a high backlog takes the pool")
	high.SetDemand(0)
	poll(t, func() bool { return low.Rate(time.Now()) == 1000 }, "nothing idle once the high class is done")
	ended := time.Now()
	require.NoError(t, stop())
	requireCreditWithinCapacity(t, 1000, began.Add(-time.Second), ended, time.Second, 2*time.Millisecond, low, high)
}

// `sluice pool status --json` reads back into a PoolStatus, classes and
// weights included.
func TestStatusJSONRoundTrip(t *testing.T) {
	t.Parallel()
	in := PoolStatus{Classes: []ClassStatus{{Priority: PriorityHigh, Workers: 2, Demand: 1400, Holds: 70, Leased: 1400}, {Priority: PriorityLow, Workers: 1, Demand: 2000, WantsAll: true}},
		Members: []MemberStatus{{Worker: "a", Want: 3, Demand: 2000, WantsAll: true, Priority: PriorityLow, Weight: 2}, {Worker: "b", Demand: 250, Priority: PriorityHigh, Weight: 1}}}
	data, err := json.Marshal(in)
	require.NoError(t, err)
	require.Contains(t, string(data), `"priority":"high"`)
	var out PoolStatus
	require.NoError(t, json.Unmarshal(data, &out))
	require.Equal(t, in.Classes, out.Classes)
	require.Equal(t, in.Members, out.Members)
}
