package lease

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// commandCounter is a go-redis hook that counts the commands a client
// sends: one per command, one per command in a pipeline or transaction,
// one per script call (the commands a script runs inside Redis are not
// round trips and are not counted).
type commandCounter struct {
	n      atomic.Int64
	byName sync.Map // command name → *atomic.Int64
}

func (h *commandCounter) add(cmd redis.Cmder) {
	h.n.Add(1)
	name := cmd.Name()
	if name == "evalsha" || name == "eval" {
		name += "-" + strings.Fields(fmt.Sprint(cmd.Args()[1]))[0]
	}
	v, _ := h.byName.LoadOrStore(name, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (h *commandCounter) String() string {
	var b strings.Builder
	h.byName.Range(func(k, v any) bool { fmt.Fprintf(&b, "%s=%d ", k, v.(*atomic.Int64).Load()); return true })
	return b.String()
}

func (h *commandCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.add(cmd)
		return next(ctx, cmd)
	}
}

func (h *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.add(c)
		}
		return next(ctx, cmds)
	}
}

// countedClient is a client of the real Redis whose commands h counts.
func countedClient(t *testing.T, h *commandCounter) *redis.Client {
	c := newClient(t, realRedis(t))
	c.AddHook(h)
	return c
}

// defaultConfig is a Manager's production configuration (Tick 100 ms,
// lease TTL 15 s, renewal every 5 s, keep-alive every 5 s / 3).
func defaultConfig(prefix, worker string, pool Pool) Config {
	return Config{Pool: pool, Prefix: prefix, WorkerID: worker}
}

// TestIdleWorkerCommandBudget: an idle worker with the default settings
// sends at most 2 Redis commands per second (the target; a keep-alive
// every 1.7 s is about 0.6), whatever its tick.
func TestIdleWorkerCommandBudget(t *testing.T) {
	t.Parallel()
	for _, tick := range []time.Duration{100 * time.Millisecond, 20 * time.Millisecond} {
		t.Run(fmt.Sprintf("tick %v", tick), func(t *testing.T) {
			t.Parallel()
			var count commandCounter
			c := countedClient(t, &count)
			prefix := uniquePrefix(t)
			pool := Pool{Name: "idle", Capacity: 2000, Partitions: 20}
			mustEnsurePool(t, c, prefix, pool)
			cfg := defaultConfig(prefix, "idle-1", pool)
			cfg.Tick = tick
			m := start(t, cfg, c)
			poll(t, func() bool { return isMember(t, c, keysFor(prefix, "idle"), "idle-1") }, "announced")
			window := 6 * time.Second
			settled := time.Now().Add(time.Second)
			poll(t, func() bool { return time.Now().After(settled) }, "start-up passes")
			before := count.n.Load()
			require.Eventually(t, func() bool { return time.Since(settled) > window }, 2*window, 10*time.Millisecond)
			perS := float64(count.n.Load()-before) / time.Since(settled).Seconds()
			t.Logf("idle worker, tick %v: %.2f commands/s (target ≤ 2)", tick, perS)
			require.LessOrEqual(t, perS, 2.0)
			require.Zero(t, m.Rate(time.Now()))
		})
	}
}

// TestBusyPoolCommandBudget: workers with a backlog holding their fair
// share send commands for renewals (one per lease per RenewEvery) and
// keep-alives only, not per tick: with 3 workers on a 2,000 records/s
// pool of 20 partitions at most 5 commands per 1,000 records (10/s), and
// with 10 workers on 100 partitions at most 20 per 1,000 records at the
// same 2,000 records/s (40/s). The window covers two renewal rounds.
func TestBusyPoolCommandBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		workers, partitions int
		per1000             float64
	}{{3, 20, 5}, {10, 100, 20}} {
		t.Run(fmt.Sprintf("%d workers %d partitions", tc.workers, tc.partitions), func(t *testing.T) {
			t.Parallel()
			const capacity = 2000.0
			var count commandCounter
			prefix := uniquePrefix(t)
			pool := Pool{Name: "busy", Capacity: capacity, Partitions: tc.partitions}
			var ms []*running
			for i := range tc.workers {
				c := countedClient(t, &count)
				if i == 0 {
					mustEnsurePool(t, c, prefix, pool)
				}
				m := start(t, defaultConfig(prefix, fmt.Sprintf("w%02d", i), pool), c)
				m.SetDemand(ingest.Inf)
				ms = append(ms, m)
			}
			lo := tc.partitions / tc.workers
			poll(t, func() bool {
				total := 0
				for _, m := range ms {
					n := len(m.counting(time.Now()))
					if n < lo || n > lo+1 {
						return false
					}
					total += n
				}
				return total == tc.partitions
			}, "the pool is shared out")
			window := 10 * time.Second
			began, before := time.Now(), count.n.Load()
			require.Eventually(t, func() bool { return time.Since(began) > window }, 2*window, 10*time.Millisecond)
			perS := float64(count.n.Load()-before) / time.Since(began).Seconds()
			per1000 := perS / capacity * 1000
			t.Logf("%d workers on %d partitions, busy: %.1f commands/s, %.2f per 1,000 records at %.0f records/s (target ≤ %.0f)",
				tc.workers, tc.partitions, perS, per1000, capacity, tc.per1000)
			t.Logf("commands by name since the start: %v", &count)
			require.LessOrEqual(t, per1000, tc.per1000)
			var total float64
			for _, m := range ms {
				total += m.Rate(time.Now())
			}
			require.InDelta(t, capacity, total, 1e-6, "the leases stayed counted through their renewals")
		})
	}
}
