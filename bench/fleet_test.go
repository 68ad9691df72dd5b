package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestFleetOnMiniredis runs 200 lease managers with a backlog on a
// 1,000-partition pool against miniredis: the shares converge at the
// start, after a join and after a leave; the managers' counted leases
// never sum above the pool at any sampled instant; and the fleet's Redis
// commands at steady state are its renewal rounds (one call per manager
// per 5 s) and keep-alives (one per manager per 1.7 s), about 160/s, not
// its ticks (2,000/s across the fleet). Under the race detector (make
// test), which slows every manager and the in-process miniredis about
// tenfold, 50 managers share 250 partitions: 200 of them, each looping
// every 100 ms, outran two cores (start-up 4-7 s, and some runs never
// converged); bench scenario 10 runs the 200 against miniredis and
// redis-server without it (start-up 0.7-1.1 s).
func TestFleetOnMiniredis(t *testing.T) {
	mr, err := startMiniredis()
	require.NoError(t, err)
	t.Cleanup(mr.Close)
	managers, partitions := 200, 1000
	if raceEnabled {
		managers, partitions = 50, 250
	}
	tally := &nameTally{}
	res, err := runFleet(t.Context(), fleetConfig{
		Managers: managers, Partitions: partitions,
		Prefix: "sim", Pool: "fleet", Steady: 5 * time.Second, Converge: 2 * time.Minute,
		Client: func() *redis.Client { return redis.NewClient(&redis.Options{Addr: mr.Addr(), DisableIdentity: true}) },
		Hook:   tally,
	})
	t.Logf("commands by name: %v", tally)
	t.Logf("%+v", res)
	require.NoError(t, err)
	require.Positive(t, res.Samples)
	require.LessOrEqual(t, res.MaxCounted, 1.0)
	require.Less(t, res.CommandsPerS, 2.0*float64(res.Managers), "≤ 2 commands/s per manager at steady state")
}

// nameTally is a go-redis hook counting commands by name (a script call by
// the start of its SHA-1), for the test's log.
type nameTally struct{ m sync.Map }

func (h *nameTally) add(c redis.Cmder) {
	name := c.Name()
	if name == "evalsha" {
		name += fmt.Sprint(c.Args()[1])[:6]
	}
	v, _ := h.m.LoadOrStore(name, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}
func (h *nameTally) String() string {
	var b strings.Builder
	h.m.Range(func(k, v any) bool { fmt.Fprintf(&b, "%s=%d ", k, v.(*atomic.Int64).Load()); return true })
	return b.String()
}
func (h *nameTally) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *nameTally) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.add(cmd); return next(ctx, cmd) }
}
func (h *nameTally) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.add(c)
		}
		return next(ctx, cmds)
	}
}
