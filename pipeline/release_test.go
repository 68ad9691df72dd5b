package pipeline_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/ingest/ingesttest"
	"github.com/sluicehq/sluice/pacing"
	"github.com/sluicehq/sluice/pipeline"
	"github.com/sluicehq/sluice/sink"
)

// releasingRate is a capacity of rate units/s that is given back the
// moment the worker asks for nothing, as a lease manager does once the
// pacer says the release is safe (Releasable, which then holds later sends
// to the new rate), and taken again when it asks for more. onRelease, when
// set, runs after each release.
type releasingRate struct {
	rate      float64
	pacer     *pacing.Pacer
	onRelease func()

	mu    sync.Mutex
	held  bool
	since time.Time      // when the current span of holding began
	spans [][2]time.Time // past spans of holding
}

func (c *releasingRate) Rate(time.Time) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		return c.rate
	}
	return 0
}

func (c *releasingRate) Credit(from, to time.Time) float64 {
	c.mu.Lock()
	spans := append([][2]time.Time(nil), c.spans...)
	if c.held {
		spans = append(spans, [2]time.Time{c.since, to})
	}
	c.mu.Unlock()
	var d time.Duration
	for _, s := range spans {
		if lo, hi := max(s[0].UnixNano(), from.UnixNano()), min(s[1].UnixNano(), to.UnixNano()); hi > lo {
			d += time.Duration(hi - lo)
		}
	}
	return d.Seconds() * c.rate
}

func (c *releasingRate) SetDemand(d float64) {
	now := time.Now()
	c.mu.Lock()
	held := c.held
	if d > 0 && !held {
		c.held, c.since = true, now
	}
	c.mu.Unlock()
	// Releasable reads Credit, which takes c.mu.
	if d != 0 || !held {
		return
	}
	if _, ok := c.pacer.Releasable(now, 0, ingest.DefaultSlice); !ok {
		return
	}
	c.mu.Lock()
	c.held = false
	c.spans = append(c.spans, [2]time.Time{c.since, now})
	c.mu.Unlock()
	if c.onRelease != nil {
		c.onRelease()
	}
}

// A record that arrives the moment a worker that drained its backlog gave
// its capacity back is sent within two slices: the worker asks for the
// capacity again before it sends. (A worker that said it wants nothing in
// the middle of a slice, and went on sending that slice's budget, held
// the record in the pacer for a rate nobody was asked for, its slice loop
// with it, and stood still for good: 950 of 951.)
func TestRecordAfterTheCapacityWentBackIsSent(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var values [][]byte
		for _, v := range records(950) { // a backlog (more than the prefetch) whose last slice is not full
			values = append(values, []byte(v))
		}
		// It reports its lag, so that the worker knows when it caught up.
		src, snk := ingesttest.NewQueue("t", values...), newFakeSink()
		capa := &releasingRate{rate: 1000, held: true, since: time.Now()}
		pacer, err := pacing.New(pacing.Config{}, capa)
		require.NoError(t, err)
		capa.pacer = pacer
		var once sync.Once
		var releasedAt time.Time
		released := make(chan struct{})
		capa.onRelease = func() {
			// The worker's next record arrives the moment its capacity
			// went back, in the slice that said it wants nothing.
			if src.Lag() > 0 {
				return // before the load was fetched
			}
			once.Do(func() {
				releasedAt = time.Now()
				src.Add([]byte(`{"id":"late"}`))
				close(released)
			})
		}
		p, err := pipeline.New(pipeline.Config{IDField: "id"}, pipeline.Ports{
			Source: src, DeadLetters: &fakeDLQ{reasons: map[string]string{}}, Sink: snk, Retry: sink.Policy{MaxAttempts: 3}, Pacer: pacer, Capacity: capa,
		})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		deadline := time.Now().Add(30 * time.Second)
		finished := func() bool {
			select {
			case <-released: // the late record was added: Finished waits for it too
			default:
				return false
			}
			select {
			case <-src.Finished():
				return true
			default:
				return false
			}
		}
		for !finished() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		doneAt := time.Now()
		cancel()
		require.NoError(t, <-done)
		require.False(t, releasedAt.IsZero(), "the worker never gave its capacity back")
		require.True(t, finished(), "951 records done; the last one arrived when the capacity went back at %v", releasedAt)
		// Two slices: the rest of the one that said it wants nothing, and
		// the one that asks again (this capacity comes back at once).
		require.LessOrEqual(t, doneAt.Sub(releasedAt), 2*ingest.DefaultSlice, "the last record waited")
	})
}
