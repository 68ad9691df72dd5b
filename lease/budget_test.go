package lease

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// Redis commands as the server counts them (a script's inner calls
// included, as INFO commandstats does), on miniredis over virtual time
// with the default timing, counted over whole lease periods (TTL 15 s)
// after start-up: three idle workers cost at most 2 commands/s each, and
// the same three draining backlogs from a pool of 2,000 records/s (20
// partitions) at most 10 commands per 1,000 records their leases allow.
// A keep-alive that rewrites the announcement and refreshes the keys'
// TTLs every time, idle or not (as before), costs an idle worker 5.6
// commands/s and the busy three 12.8 per 1,000 records, and fails both.
func TestBudgetRedisCommands(t *testing.T) {
	t.Parallel()
	const (
		idleBudget = 2.0  // commands/s per idle worker
		busyBudget = 10.0 // commands per 1,000 records, 3 workers
		periods    = 4    // lease periods counted
	)
	synctest.Test(t, func(t *testing.T) {
		mr, c := bubbleMiniredis(t)
		pool := Pool{Name: "budget", Capacity: 2000, Partitions: 20}
		mustEnsurePool(t, c, "", pool) // dials: the server exists from here
		count := countCommands(mr)
		ws := []*running{
			startIn(t, c, pool, "a", PriorityNormal, 1),
			startIn(t, c, pool, "b", PriorityNormal, 1),
			startIn(t, c, pool, "c", PriorityNormal, 1),
		}
		ttl := DefaultTTL
		time.Sleep(ttl) // start-up

		idle := count.over(periods * ttl)
		idlePerS := float64(idle.total) / (periods * ttl).Seconds() / float64(len(ws))

		for _, w := range ws {
			w.SetDemand(ingest.Inf)
		}
		waitUntil(t, 5*time.Second, func(now time.Time) bool {
			sum := 0.0
			for _, w := range ws {
				sum += w.Rate(now)
			}
			return sum == pool.Capacity
		}, "the pool shared among the three")
		time.Sleep(ttl)
		busy := count.over(periods * ttl)
		perK := float64(busy.total) / (pool.Capacity * (periods * ttl).Seconds() / 1000)

		t.Logf("idle: %.2f commands/s per worker (%s); busy: %.2f commands per 1,000 records, 3 workers (%s)",
			idlePerS, idle, perK, busy)
		require.LessOrEqual(t, idlePerS, idleBudget, "an idle worker's commands/s")
		require.LessOrEqual(t, perK, busyBudget, "commands per 1,000 records")
	})
}

// commandCount counts the commands a miniredis executes, by name.
type commandCount struct {
	mu     sync.Mutex
	byName map[string]int
}

// countCommands counts every command mr executes from now on.
func countCommands(mr *miniredis.Miniredis) *commandCount {
	c := &commandCount{byName: map[string]int{}}
	mr.Server().SetPreHook(func(_ *server.Peer, cmd string, _ ...string) bool {
		c.mu.Lock()
		c.byName[cmd]++
		c.mu.Unlock()
		return false
	})
	return c
}

// tally is the commands counted over a span.
type tally struct {
	total  int
	byName map[string]int
}

func (t tally) String() string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(t.byName)) {
		parts = append(parts, fmt.Sprintf("%s %d", name, t.byName[name]))
	}
	return fmt.Sprintf("%d commands: %s", t.total, strings.Join(parts, ", "))
}

// over sleeps d and returns the commands executed meanwhile.
func (c *commandCount) over(d time.Duration) tally {
	c.mu.Lock()
	before := maps.Clone(c.byName)
	c.mu.Unlock()
	time.Sleep(d)
	c.mu.Lock()
	defer c.mu.Unlock()
	out := tally{byName: map[string]int{}}
	for name, n := range c.byName {
		if d := n - before[name]; d > 0 {
			out.byName[name] = d
			out.total += d
		}
	}
	return out
}

// A keep-alive rewrites the announcement whole once per MemberTTL, so an
// announcement Redis lost or rolled back (a failover to a lagging
// replica) heals, and the rewrite that finds other fair-share fields
// stored counts as a change: a worker gone idle whose stale busy
// announcement reappears stops holding a share well before the peers'
// 30 s resync (1.7 s on virtual time; never, before the rewrite).
func TestLostAnnouncementHeals(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		_, c := bubbleMiniredis(t)
		pool := Pool{Name: "heal", Capacity: 2000, Partitions: 20}
		mustEnsurePool(t, c, "", pool)
		a := startIn(t, c, pool, "a", PriorityNormal, 1)
		a.SetDemand(ingest.Inf)
		waitUntil(t, 5*time.Second, func(now time.Time) bool { return a.Rate(now) == pool.Capacity }, "a holds the pool")
		k := keysOn(c, "", pool.Name)
		busy, err := c.HGet(t.Context(), k.announcements(), "a").Result()
		require.NoError(t, err)
		a.SetDemand(0)
		waitUntil(t, 5*time.Second, func(now time.Time) bool { return a.Rate(now) == 0 }, "a idle")
		time.Sleep(DefaultTTL)
		require.NoError(t, c.HSet(t.Context(), k.announcements(), "a", busy).Err()) // the write Redis lost
		b := startIn(t, c, pool, "b", PriorityNormal, 1)
		b.SetDemand(ingest.Inf)
		took := waitUntil(t, 10*time.Second, func(now time.Time) bool { return b.Rate(now) == pool.Capacity }, "b gets the whole pool before the 30 s resync")
		t.Logf("b holds the whole pool %v after the stale announcement came back", took)
	})
}
