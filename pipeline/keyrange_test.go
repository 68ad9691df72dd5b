package pipeline

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// The key range tracker on its own, with explicit instants: how it reads
// the sink's answers, what rate it gives a range and how it probes, what
// it holds back and for how long.

var t0 = time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC)

func newTestRanges() *keyRanges {
	k := new(keyRanges)
	k.init(ingest.DefaultSlice, t0, new(ingest.Counters), slog.New(slog.DiscardHandler))
	return k
}

// answer is one request's records and the sink's results, in request
// order: a key ending in "!" was throttled, any other accepted. Every
// record costs 1.
func answer(keys ...string) ([]*item, []ingest.Result) {
	items := make([]*item, len(keys))
	results := make([]ingest.Result, len(keys))
	for i, key := range keys {
		throttled := strings.HasSuffix(key, "!")
		items[i] = &item{rec: ingest.Record{ID: "id-" + key, SinkKey: strings.TrimSuffix(key, "!"), Cost: 1}}
		results[i] = ingest.Result{Outcome: ingest.Delivered}
		if throttled {
			results[i] = ingest.Result{Outcome: ingest.Retryable, Throttled: true, Reason: "HTTP 429"}
		}
	}
	return items, results
}

// layout lists the ranges as "[low,high)", "-" for an end without bound.
func (k *keyRanges) layout() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, r := range k.hot {
		low, high := r.low.key, r.high.key
		if r.low.unbounded {
			low = "-"
		}
		if r.high.unbounded {
			high = "-"
		}
		out = append(out, fmt.Sprintf("[%s,%s)", low, high))
	}
	return out
}

func TestRangeBoundsFollowTheCoolKeysPrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ hot, cool, low, high string }{
		{hot: "hot/00017", cool: "cold/00019", low: "d"},
		{hot: "07/2025-05-13T10:00:00.000Z/nc1", cool: "08/2025-05-13T09:00:00.000Z/nc2", high: "08"},
		{hot: "7e21/x", cool: "7fa0/y", high: "7f"},
		{hot: "7fa0/y", cool: "7e21/x", low: "7f"},
		{hot: "abc", cool: "ab", low: "ab\x00"},
		{hot: "ab", cool: "abc", high: "abc"},
	} {
		if tc.high != "" {
			b := highBelow(tc.hot, tc.cool)
			require.Equal(t, tc.high, b.key, "%s below %s", tc.hot, tc.cool)
			require.Less(t, tc.hot, b.key)
			require.LessOrEqual(t, b.key, tc.cool)
			continue
		}
		b := lowAbove(tc.cool, tc.hot)
		require.Equal(t, tc.low, b.key, "%s above %s", tc.hot, tc.cool)
		require.LessOrEqual(t, b.key, tc.hot)
		require.Less(t, tc.cool, b.key)
	}
}

func TestKeyRangesFoundFromAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		answers   [][]string
		layout    []string
		in, out   []string // keys inside a range, keys in none
		explained bool     // of the last answer
		refused   bool     // of the last answer: the sink's throttle, no range
	}{
		{
			name:    "nothing accepted after the throttle: the whole key space",
			answers: [][]string{{"a", "m!", "q!"}},
			layout:  []string{"[-,-)"},
			in:      []string{"a", "zzz"},
		},
		{
			name:    "a key accepted before the throttle bounds nothing",
			answers: [][]string{{"z", "m!"}},
			layout:  []string{"[-,-)"},
		},
		{
			name:    "a key accepted after the throttle bounds the range at its prefix",
			answers: [][]string{{"m!", "n5"}},
			layout:  []string{"[-,n)"},
			in:      []string{"m9"},
			out:     []string{"n", "n0"},
		},
		{
			name:    "the next keys of a cool sequence stay outside",
			answers: [][]string{{"cold/00018", "hot/00017!", "cold/00019"}},
			layout:  []string{"[d,-)"},
			in:      []string{"hot/00027"},
			out:     []string{"cold/00020", "cold/99999"},
		},
		{
			name:    "one shard throttled, the next one cool",
			answers: [][]string{{"07/2025-05-13T10:00:00.000Z/a!", "08/2025-05-13T09:00:00.000Z/b"}},
			layout:  []string{"[-,08)"},
			in:      []string{"07/2025-05-14T00:00:00.000Z/c", "00/x"},
			out:     []string{"08/2025-05-14T00:00:00.000Z/d"},
		},
		{
			name:    "throttled keys a cool key separates make two ranges",
			answers: [][]string{{"b!", "k", "x!"}},
			layout:  []string{"[-,k)", "[l,-)"},
			out:     []string{"k", "k5"},
		},
		{
			name:    "a cool key splits a range and its cold side is forgotten",
			answers: [][]string{{"m!"}, {"c!", "x"}},
			layout:  []string{"[-,x)"},
			out:     []string{"x", "y"},
		},
		{
			name:    "a new range stops at its neighbour",
			answers: [][]string{{"c!", "k"}, {"q!"}},
			layout:  []string{"[-,k)", "[k,-)"},
		},
		{
			name:      "every record throttled in a range known hot is the range's answer",
			answers:   [][]string{{"a", "m!"}, {"d!", "e!"}},
			layout:    []string{"[-,-)"},
			explained: true,
		},
		{
			name:    "every key throttled and none accepted is the sink's throttle, not a range's",
			answers: [][]string{{"m!", "q!"}},
			layout:  nil,
			refused: true,
		},
		{
			name:    "a cool key after the throttle bounds it: a range, not the sink",
			answers: [][]string{{"m!", "q"}},
			layout:  []string{"[-,q)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := newTestRanges()
			var explained, refused bool
			for i, keys := range tc.answers {
				now := t0.Add(time.Duration(i+1) * 100 * time.Millisecond)
				items, results := answer(keys...)
				explained, refused = k.observe(now, now.Add(-time.Millisecond), items, results)
			}
			require.Equal(t, tc.layout, k.layout())
			require.Equal(t, tc.explained, explained)
			require.Equal(t, tc.refused, refused)
			for _, key := range tc.in {
				require.NotNil(t, k.find(key), key)
			}
			for _, key := range tc.out {
				require.Nil(t, k.find(key), key)
			}
		})
	}
}

// accept makes the sink accept n keys key-0… at now.
func accept(k *keyRanges, now time.Time, prefix string, n int) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	items, results := answer(keys...)
	_, _ = k.observe(now, now, items, results)
}

func TestKeyRangeRateIsWhatItsKeysAccepted(t *testing.T) {
	t.Parallel()
	k := newTestRanges()
	accept(k, t0, "a", 200)
	accept(k, t0.Add(400*time.Millisecond), "b", 200)
	accept(k, t0.Add(400*time.Millisecond), "z", 300)

	// b1000 is throttled after z0000 was accepted: its range is below "z".
	now := t0.Add(500 * time.Millisecond)
	items, results := answer("b1000!", "z0000")
	_, _ = k.observe(now, now, items, results)
	require.Equal(t, []string{"[-,z)"}, k.layout())
	r := k.find("b")
	require.InDelta(t, 0.95*400, r.rate, 1, "rangeBackoff × the 400 its keys accepted in the last second")
	require.False(t, k.fits(now, r, 1, 0), "its second is full, as the sink's is")
	require.True(t, k.fits(t0.Add(1100*time.Millisecond), r, 1, 0), "room once the accepts of t0 are a second old")

	// Throttled again, sent after the range was found: cut to rangeBackoff
	// × what it accepted, and the hold doubles (the same ceiling).
	now = t0.Add(1500 * time.Millisecond)
	items, results = answer("b2000!")
	_, _ = k.observe(now, now.Add(-time.Millisecond), items, results)
	require.InDelta(t, 0.95*min(200, 0.95*400), r.rate, 1, "a second holding 200 of its keys")
	require.Equal(t, 2*rangeHold, r.hold)
	require.EqualValues(t, 1, k.c.Totals().RangeCuts)

	// A request sent before that cut is old news.
	items, results = answer("b2001!")
	_, _ = k.observe(now.Add(time.Millisecond), now.Add(-time.Millisecond), items, results)
	require.EqualValues(t, 1, k.c.Totals().RangeCuts)
}

func TestKeyRangeProbesUpWhileItHoldsRecordsBack(t *testing.T) {
	t.Parallel()
	k := newTestRanges()
	accept(k, t0, "k", 1000)
	now := t0.Add(10 * time.Millisecond)
	items, results := answer("k5000!")
	_, _ = k.observe(now, now, items, results)
	r := k.find("k")
	require.InDelta(t, 950, r.rate, 1)
	peak := r.peak

	// While its hold lasts, and while its rate is not what holds records
	// back, it does not rise.
	k.probe(now.Add(100*time.Millisecond), r, false)
	require.InDelta(t, 950, r.rate, 1)
	slice := k.slice
	at := now.Add(rangeHold)
	k.probe(at, r, false)
	require.InDelta(t, 950, r.rate, 1, "not limited: nothing to probe for")

	// Limited every slice: it creeps by rangeProbe of its ceiling up to
	// rangeGrowth × the ceiling, then the step doubles every slice.
	var rates []float64
	for range 8 {
		r.limited = at
		r.sent = ingest.NewWindow(time.Second)
		r.sent.Add(k.at(at), int64(r.rate)) // it sends at its rate
		r.last = k.at(at)
		k.probe(at, r, false)
		rates = append(rates, r.rate)
		at = at.Add(slice)
	}
	require.InDelta(t, 950+rangeProbe*peak, rates[0], 1)
	require.InDelta(t, 950+2*rangeProbe*peak, rates[1], 1)
	for i := 1; i < len(rates); i++ {
		require.Greater(t, rates[i], rates[i-1])
		require.LessOrEqual(t, rates[i], rangeLead*(rates[i-1]+rates[i-1]*slice.Seconds())+1, "never far above what it sent")
	}
	require.Greater(t, rates[7]-rates[6], 2*(rates[2]-rates[1]), "past rangeGrowth × the ceiling the steps grow")
}

func TestKeyRangesHoldBackOnlyTheirRecords(t *testing.T) {
	t.Parallel()
	k := newTestRanges()
	now := t0
	items, results := answer("h0!", "x0") // the range is [-, x)
	_, _ = k.observe(now, now, items, results)
	r := k.find("h")
	r.rate, r.peak = 50, 50 // 10 records a slice

	now = now.Add(rangeHold / 2) // holding: no probe
	fresh := func(key string) *item { return &item{rec: ingest.Record{ID: key, SinkKey: key, Cost: 1}} }
	var sent, held int
	for i := range 30 {
		switch k.admit(now, fresh(fmt.Sprintf("h%02d", i)), true, 15) {
		case rangeSend:
			sent++
		case rangeHeld:
			held++
		case rangeFull:
			t.Fatalf("record %d: full before 15 were held", i)
		}
		if held == 15 {
			break
		}
	}
	require.Equal(t, 10, sent, "a slice's share of its rate goes")
	require.Equal(t, 15, held)
	require.Equal(t, rangeFull, k.admit(now, fresh("h99"), true, 15), "beyond the limit a fresh record stays in line")
	require.Equal(t, rangeHeld, k.admit(now, fresh("h98"), false, 15), "a retried one is held anyway")
	require.Equal(t, rangeSend, k.admit(now, fresh("y1"), true, 15), "a key in no range goes")

	// A throttled record goes first in line, after the sink's Retry-After.
	throttled := fresh("h77")
	require.True(t, k.requeue(now, throttled, 300*time.Millisecond))
	out, spent := k.take(now.Add(100*time.Millisecond), 1000, nil, false)
	require.Empty(t, out, "the range waits out the Retry-After")
	require.Zero(t, spent)
	now = now.Add(time.Second)
	out, spent = k.take(now, 1000, nil, false)
	require.EqualValues(t, 10, spent, "a slice at its rate")
	require.Same(t, throttled, out[0], "the throttled record first")
	require.Equal(t, "h10", out[1].rec.ID, "then in order")
	require.EqualValues(t, 7, k.heldRecords())

	// Quiet for rangeQuiet with nothing held: forgotten.
	for range 10 {
		now = now.Add(time.Second)
		k.take(now, 1000, nil, false)
	}
	require.Empty(t, k.layout())
	require.False(t, k.active())
}

func TestKeyRangesForgetTheirRecordsWhenForgotten(t *testing.T) {
	t.Parallel()
	k := newTestRanges()
	for i := range maxHotRanges + 1 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		// Each answer throttles one key between two cool ones: one range each.
		items, results := answer(fmt.Sprintf("k%04d!", 2*i+1), fmt.Sprintf("k%04d", 2*i), fmt.Sprintf("k%04d", 2*i+2))
		_, _ = k.observe(now, now, items, results)
		if i == 0 {
			require.Equal(t, rangeHeld, k.admit(now, &item{rec: ingest.Record{ID: "k0001x", SinkKey: "k0001x", Cost: 1}}, false, 0))
		}
	}
	require.Len(t, k.layout(), maxHotRanges, "bounded: the range throttled least recently went")
	require.Nil(t, k.find("k0001"))
	out, _ := k.take(t0.Add(time.Second), 1000, nil, false)
	require.Len(t, out, 1, "its held record is sent")
	require.Equal(t, "k0001x", out[0].rec.ID)
}
