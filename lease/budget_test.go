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
// A keep-alive that rewrites an unchanged announcement and refreshes the
// keys' TTLs every time (as before) costs an idle worker 5.0 commands/s
// and the busy three 11.9 per 1,000 records, and fails both.
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
