package lease

import (
	"context"
	"net"
	"regexp"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// These tests run lease managers with their default timing inside a
// testing/synctest bubble, over miniredis on in-memory connections, so
// every tick, slice, TTL and sliding window is virtual time: what they
// measure does not depend on the load of the machine running them.

// bubbleRedis returns a client of a miniredis that lives in the bubble.
func bubbleRedis(t *testing.T) redis.UniversalClient {
	t.Helper()
	_, c := bubbleMiniredis(t)
	return c
}

// bubbleMiniredis is bubbleRedis with its server, to count commands.
func bubbleMiniredis(t *testing.T) (*miniredis.Miniredis, redis.UniversalClient) {
	t.Helper()
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true)
	c := redis.NewClient(&redis.Options{
		Dialer:                   func(context.Context, string, string) (net.Conn, error) { return mr.Dial() },
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		// More connections than the managers ever use at once: go-redis
		// waits for a connection with a timer from a pool shared by the
		// whole process, which a bubble must never take from another.
		PoolSize: 512,
	})
	t.Cleanup(func() {
		_ = c.Close()
		mr.Close()
	})
	return mr, c
}

// startIn runs a manager with cfg (default timing) in the bubble; it stops
// at the test's cleanup.
func startIn(t *testing.T, c redis.UniversalClient, pool Pool, worker string, p Priority, weight int) *running {
	t.Helper()
	return start(t, Config{Pool: pool, WorkerID: worker, Priority: p, Weight: weight}, c)
}

// waitUntil sleeps in steps of 1 ms of virtual time until cond holds, at
// most limit, and returns how long it took.
func waitUntil(t *testing.T, limit time.Duration, cond func(now time.Time) bool, msg string) time.Duration {
	t.Helper()
	began := time.Now()
	for !cond(time.Now()) {
		require.Less(t, time.Since(began), limit, msg)
		time.Sleep(time.Millisecond)
	}
	return time.Since(began)
}

// A backfill in the low class holds the whole pool of 2,000 units/s (20
// partitions); live traffic in the high class announces 600, then its
// demand steps to 1,800. Each time, the backfill stops counting the
// partitions above its new share within one slice (200 ms) of the live
// worker's announcement, and the live worker has its demand within a
// second; the sum of both workers' credit never exceeds the pool in any
// sliding second, nor any sliding 200 ms its slice, across the
// hand-overs, and no partition is ever counted by both.
func TestLowerClassYieldsWithinASlice(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := bubbleRedis(t)
		pool := Pool{Name: "live", Capacity: 2000, Partitions: 20}
		mustEnsurePool(t, c, "", pool)
		bulk := startIn(t, c, pool, "bulk", PriorityLow, 0)
		bulk.SetDemand(ingest.Inf)
		waitUntil(t, 2*time.Second, func(now time.Time) bool { return bulk.Rate(now) == 2000 }, "the backfill alone takes the pool")
		stop := watchExclusive(t, c, keysFor(DefaultPrefix, "live"), bulk)
		began := time.Now()

		live := startIn(t, c, pool, "live", PriorityHigh, 0)
		live.SetDemand(600)
		yield := waitUntil(t, time.Second, func(now time.Time) bool { return bulk.Rate(now) <= 1400 }, "the backfill yields to the live worker's 600")
		served := waitUntil(t, time.Second, func(now time.Time) bool { return live.Rate(now) == 600 }, "the live worker gets its 600")
		t.Logf("live at 600: the backfill yielded in %v, the live worker had its rate %v later", yield, served)
		require.LessOrEqual(t, yield, ingest.DefaultSlice, "within a slice")
		require.Equal(t, 1400.0, bulk.Rate(time.Now()), "the backfill keeps the rest")
		time.Sleep(5 * time.Second) // steady

		live.SetDemand(1800) // the step: 30 % → 90 %
		yield = waitUntil(t, time.Second, func(now time.Time) bool { return bulk.Rate(now) <= 200 }, "the backfill yields to the step")
		served = waitUntil(t, time.Second, func(now time.Time) bool { return live.Rate(now) == 1800 }, "the live worker gets its 1,800")
		t.Logf("step to 1,800: the backfill yielded in %v, the live worker had its rate %v later", yield, served)
		require.LessOrEqual(t, yield, ingest.DefaultSlice, "within a slice")
		require.LessOrEqual(t, yield+served, time.Second, "the new shares within a second")
		require.Equal(t, 200.0, bulk.Rate(time.Now()), "the backfill keeps what the live worker leaves")
		time.Sleep(5 * time.Second)

		live.SetDemand(0) // live traffic stops: the backfill takes everything back
		waitUntil(t, 3*time.Second, func(now time.Time) bool { return bulk.Rate(now) == 2000 }, "nothing idle once live traffic stops")
		ended := time.Now()
		require.NoError(t, stop())
		// The pool's sliding second, and its sliding slice, across the
		// three hand-overs, from the counted leases' exact credit.
		requireCreditWithinCapacity(t, 2000, began.Add(-time.Second), ended, time.Second, time.Millisecond, bulk, live)
		requireCreditWithinCapacity(t, 2000, began.Add(-time.Second), ended, ingest.DefaultSlice, time.Millisecond, bulk, live)
		used := (bulk.Credit(began, ended) + live.Credit(began, ended)) / (2000 * ended.Sub(began).Seconds())
		t.Logf("pool use over %v of hand-overs: %.3f", ended.Sub(began), used)
		require.Greater(t, used, 0.95, "each hand-over idles the moved partitions for about a slice only")
		bulk.stop(t)
		live.stop(t)
	})
}

// A backfill gives partitions to a live step at once (its pacer says its
// sends do not lean on them), but a request it sent before is still
// unanswered: the sink may accept it any time until its answer, so the
// partitions are unlocked only once it is answered. The backfill stops
// counting them within a slice of the step all the same; the live worker
// gets them right after the answer, not before.
func TestReleaseAwaitsTheAnswers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := bubbleRedis(t)
		pool := Pool{Name: "answers", Capacity: 2000, Partitions: 20}
		mustEnsurePool(t, c, "", pool)
		var answeredAt atomic.Int64 // unix ns; 0: answered long ago
		bulk := start(t, Config{Pool: pool, WorkerID: "bulk", Priority: PriorityLow,
			Releasable: func(time.Time, float64, time.Duration) (time.Duration, bool) { return 0, true },
			Answered:   func(before time.Time) bool { return answeredAt.Load() <= time.Now().UnixNano() },
		}, c)
		bulk.SetDemand(ingest.Inf)
		waitUntil(t, 2*time.Second, func(now time.Time) bool { return bulk.Rate(now) == 2000 }, "the backfill alone takes the pool")
		live := startIn(t, c, pool, "live", PriorityHigh, 0)
		time.Sleep(2 * time.Second)

		step := time.Now()
		answeredAt.Store(step.Add(300 * time.Millisecond).UnixNano())
		live.SetDemand(1800)
		yield := waitUntil(t, time.Second, func(now time.Time) bool { return bulk.Rate(now) <= 200 }, "the backfill stops counting")
		served := waitUntil(t, time.Second, func(now time.Time) bool { return live.Rate(now) == 1800 }, "the live worker gets its 1,800")
		t.Logf("the backfill stopped counting %v after the step; the live worker had its rate %v after it, its request answered at 300 ms", yield, yield+served)
		require.LessOrEqual(t, yield, ingest.DefaultSlice, "stops counting within a slice")
		require.GreaterOrEqual(t, yield+served, 300*time.Millisecond, "unlocked only once the request is answered")
		require.LessOrEqual(t, yield+served, 400*time.Millisecond, "and soon after")
		bulk.stop(t)
		live.stop(t)
	})
}

// Two workers of the normal class with backlogs and weights 2 and 1 split
// a pool of 1,200 units/s (12 partitions) 2:1, and a low-class backfill
// waits; when the heavier stops, the other takes the class's share; when
// the class wants 300, the backfill gets the other 900. `sluice pool
// status` sums each class.
func TestWeightsSplitAClass(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := bubbleRedis(t)
		pool := Pool{Name: "weights", Capacity: 1200, Partitions: 12}
		mustEnsurePool(t, c, "", pool)
		a := startIn(t, c, pool, "a", PriorityNormal, 2)
		b := startIn(t, c, pool, "b", PriorityNormal, 1)
		bulk := startIn(t, c, pool, "bulk", PriorityLow, 1)
		for _, m := range []*running{a, b, bulk} {
			m.SetDemand(ingest.Inf)
		}
		rates := func(wa, wb, wbulk float64) func(time.Time) bool {
			return func(now time.Time) bool { return a.Rate(now) == wa && b.Rate(now) == wb && bulk.Rate(now) == wbulk }
		}
		waitUntil(t, 2*time.Second, rates(800, 400, 0), "2:1 inside the class, nothing for the lower class")

		st, err := Status(t.Context(), c, "", "weights")
		require.NoError(t, err)
		require.Len(t, st.Classes, 2)
		require.Equal(t, ClassStatus{Priority: PriorityNormal, Workers: 2, Demand: 1200, WantsAll: true, Holds: 12, Leased: 1200}, st.Classes[0])
		require.Equal(t, ClassStatus{Priority: PriorityLow, Workers: 1, Demand: 1200, WantsAll: true, Holds: 0, Leased: 0}, st.Classes[1])
		text := st.String()
		all := "demand: all it can get (a backlog)"
		require.Contains(t, text, "classes (served highest first):\n  normal  2 workers, "+all+", leased 1200 records/s (12 partitions)\n  low     1 worker, "+all+", leased 0 records/s (0 partitions)\n")
		require.Regexp(t, `\n  a  holds 8 of 12 partitions \([^)]*\), wants 12, `+regexp.QuoteMeta(all)+`.*, normal weight 2\n`, text)
		require.Regexp(t, `\n  bulk  holds 0 of 12 partitions, wants 12, `+regexp.QuoteMeta(all)+`.*, low\n`, text)

		a.SetDemand(0)
		waitUntil(t, 2*time.Second, rates(0, 1200, 0), "the class's share to the other member")
		b.SetDemand(300)
		// A fall in demand is announced at the next keep-alive.
		waitUntil(t, 3*time.Second, rates(0, 300, 900), "the rest to the lower class")
		for _, m := range []*running{a, b, bulk} {
			m.stop(t)
		}
	})
}
