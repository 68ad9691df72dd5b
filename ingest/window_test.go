package ingest

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// bruteMax is the most units in any half-open window (t−width, t], by
// checking the window that ends at every event.
func bruteMax(events []event, width time.Duration) int64 {
	var best int64
	for _, end := range events {
		var sum int64
		for _, e := range events {
			if e.at > end.at-width && e.at <= end.at {
				sum += e.units
			}
		}
		best = max(best, sum)
	}
	return best
}

func TestWindowMaxHandMade(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		name          string
		events        []event
		want1s, want2 int64 // want2: 200 ms window
	}{
		{"empty", nil, 0, 0},
		{"one", []event{{0, 7}}, 7, 7},
		{"same instant adds up", []event{{5 * ms, 3}, {5 * ms, 4}}, 7, 7},
		{"exactly one width apart is two windows", []event{{0, 10}, {1000 * ms, 10}}, 10, 10},
		{"one nanosecond inside", []event{{0, 10}, {1000*ms - 1, 10}}, 20, 10},
		{"200ms edge", []event{{0, 5}, {200 * ms, 5}, {399 * ms, 5}}, 15, 10},
		{"late cluster beats early peak", []event{{0, 50}, {1500 * ms, 20}, {1600 * ms, 20}, {1700 * ms, 20}}, 60, 50},
		{"slide drops then rises", []event{{0, 30}, {900 * ms, 30}, {1100 * ms, 30}, {1200 * ms, 30}, {1950 * ms, 1}}, 90, 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w1, w2 := NewWindow(time.Second), NewWindow(200*ms)
			for _, e := range tt.events {
				w1.Add(e.at, e.units)
				w2.Add(e.at, e.units)
			}
			require.Equal(t, tt.want1s, w1.max)
			require.Equal(t, tt.want2, w2.max)
			require.Equal(t, tt.want1s, bruteMax(tt.events, time.Second))
			require.Equal(t, tt.want2, bruteMax(tt.events, 200*ms))
		})
	}
}

func TestWindowMaxMatchesBruteForce(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 7))
	for run := range 20 {
		var events []event
		var at time.Duration
		w1, w2 := NewWindow(time.Second), NewWindow(200*time.Millisecond)
		for range 1500 {
			if rng.IntN(5) != 0 { // one event in five ties with the previous one
				at += time.Duration(rng.Int64N(int64(40 * time.Millisecond)))
			}
			u := 1 + rng.Int64N(20)
			events = append(events, event{at, u})
			w1.Add(at, u)
			w2.Add(at, u)
		}
		require.Equal(t, bruteMax(events, time.Second), w1.max, "run %d", run)
		require.Equal(t, bruteMax(events, 200*time.Millisecond), w2.max, "run %d", run)
	}
}

func TestWindowWaitFor(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	w := NewWindow(time.Second)
	w.Add(0, 40)
	w.Add(300*ms, 40)
	at := 500 * ms
	w.Expire(at)
	require.Equal(t, time.Duration(0), w.WaitFor(at, 0, 20, 100), "fits")
	require.Equal(t, 500*ms, w.WaitFor(at, 0, 21, 100), "needs the event at 0 to leave: at 1 s")
	require.Equal(t, 800*ms, w.WaitFor(at, 0, 61, 100), "needs both events gone: at 1.3 s")
	require.Equal(t, time.Second, w.WaitFor(at, 20, 100, 100), "needs this request's pending units gone too")
}

// Pipelines sharing Counters report their pacers' stamps slightly out of
// order; the send-side busiest second is the same as if they had come in
// order.
func TestCountersSendSideIgnoresArrivalOrder(t *testing.T) {
	t.Parallel()
	base := time.Unix(1_800_000_000, 0)
	type send struct {
		at    time.Duration
		units int64
	}
	sends := []send{{0, 100}, {150 * time.Millisecond, 100}, {990 * time.Millisecond, 100}, {1000 * time.Millisecond, 50},
		{1100 * time.Millisecond, 100}, {1200 * time.Millisecond, 100}, {2900 * time.Millisecond, 100}}
	want := func(ss []send) int64 {
		w := NewWindow(time.Second)
		sorted := slices.Clone(ss)
		slices.SortStableFunc(sorted, func(a, b send) int { return cmp.Compare(a.at, b.at) })
		for _, s := range sorted {
			w.Add(s.at, s.units)
		}
		return w.Max()
	}(sends)
	rng := rand.New(rand.NewPCG(7, 9))
	for range 50 {
		var c Counters
		shuffled := slices.Clone(sends)
		// Each arrives at most a few hundred milliseconds after a later one.
		for i := range shuffled {
			if j := i + rng.IntN(3); j < len(shuffled) && shuffled[j].at-shuffled[i].at < 400*time.Millisecond {
				shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
			}
		}
		// The first arrival sets the epoch: send the earliest first.
		c.NoteSent(base, 0)
		for _, s := range shuffled {
			c.NoteSent(base.Add(s.at), s.units)
		}
		require.Equal(t, want, c.Totals().MaxSent1s, "arrivals %v", shuffled)
	}
	require.Equal(t, int64(350), want)
}
