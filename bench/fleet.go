package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
)

// fleetConfig is a simulation of many lease managers sharing one pool in
// one process, each with its own Redis client, as separate pods would.
type fleetConfig struct {
	Managers   int           // managers at steady state before the join; default 200
	Partitions int           // pool partitions; default 1,000
	Capacity   float64       // pool capacity, units/s; default 10,000
	Steady     time.Duration // the window commands/s is measured over; default 10 s
	Converge   time.Duration // the longest a phase may take to converge; default 60 s
	// Prefix starts the pool's keys; Pool names it. Required.
	Prefix, Pool string
	// Client returns a new client of the Redis under test.
	Client func() *redis.Client
	// Hook, when set, is added to every manager's client.
	Hook redis.Hook
	// Logger receives the managers' warnings. Default: discard.
	Logger *slog.Logger
}

// fleetResult is what a fleet simulation measured.
type fleetResult struct {
	Managers        int
	StartConverge   time.Duration // every manager started at once, until each held its fair share
	CommandsPerS    float64       // all managers, at steady state
	JoinConverge    time.Duration // one more manager, until each held its fair share again
	LeaveConverge   time.Duration // one manager stopped (withdrawing), until each held its fair share again
	MaxCounted      float64       // the most the managers' counted leases summed to at one instant, ÷ capacity
	Samples         int64         // instants checked
	CommandsByPhase map[string]int64
}

// runFleet starts cfg.Managers lease managers with a backlog at once on a
// fresh pool and waits until each holds its fair share (⌊P/N⌋ or ⌈P/N⌉,
// all P held), measures the commands all of them send over cfg.Steady,
// adds one manager and waits for the shares again, then stops one and
// waits again. All along a sampler sums, at one instant at a time, the
// rate every manager counts; MaxCounted is the most it saw ÷ capacity.
// It returns an error when a phase does not converge within cfg.Converge
// or the sum ever exceeded the capacity.
func runFleet(ctx context.Context, cfg fleetConfig) (fleetResult, error) {
	cfg.Managers = cmp.Or(cfg.Managers, 200)
	cfg.Partitions = cmp.Or(cfg.Partitions, 1000)
	if cfg.Capacity == 0 {
		cfg.Capacity = 10_000
	}
	cfg.Steady = cmp.Or(cfg.Steady, 10*time.Second)
	cfg.Converge = cmp.Or(cfg.Converge, 60*time.Second)
	pool := lease.Pool{Name: cfg.Pool, Capacity: cfg.Capacity, Partitions: cfg.Partitions}
	res := fleetResult{Managers: cfg.Managers, CommandsByPhase: map[string]int64{}}

	var commands atomic.Int64
	type running struct {
		m      *lease.Manager
		client *redis.Client
		probe  *redisProbe
		cancel context.CancelFunc
		done   chan error
	}
	var (
		mu    sync.Mutex
		fleet []*running
	)
	setup := cfg.Client()
	defer setup.Close()
	if _, err := lease.EnsurePool(ctx, setup, cfg.Prefix, pool); err != nil {
		return res, err
	}
	stopOne := func(r *running) error {
		r.cancel()
		err := <-r.done
		_ = r.client.Close()
		commands.Add(r.probe.commands.Load())
		return err
	}
	startOne := func(i int) error {
		probe := new(redisProbe)
		c := cfg.Client()
		c.AddHook(probe)
		if cfg.Hook != nil {
			c.AddHook(cfg.Hook)
		}
		m, err := lease.New(lease.Config{Pool: pool, Prefix: cfg.Prefix, WorkerID: fmt.Sprintf("m%04d", i), Logger: cfg.Logger}, c)
		if err != nil {
			_ = c.Close()
			return err
		}
		m.SetDemand(ingest.Inf)
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r := &running{m: m, client: c, probe: probe, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- m.Run(rctx) }()
		mu.Lock()
		fleet = append(fleet, r)
		mu.Unlock()
		return nil
	}
	defer func() {
		mu.Lock()
		all := fleet
		fleet = nil
		mu.Unlock()
		var wg sync.WaitGroup
		for _, r := range all {
			wg.Go(func() { _ = stopOne(r) })
		}
		wg.Wait()
	}()
	sent := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		n := commands.Load()
		for _, r := range fleet {
			n += r.probe.commands.Load()
		}
		return n
	}

	// The sampler: the sum of the counted rates at one instant.
	sctx, stopSampler := context.WithCancel(ctx)
	var (
		samplerDone = make(chan struct{})
		maxSum      float64
		samples     atomic.Int64
	)
	go func() {
		defer close(samplerDone)
		for sctx.Err() == nil {
			now := time.Now()
			mu.Lock()
			ms := make([]*lease.Manager, len(fleet))
			for i, r := range fleet {
				ms[i] = r.m
			}
			mu.Unlock()
			var sum float64
			for _, m := range ms {
				sum += m.Rate(now)
			}
			maxSum = max(maxSum, sum)
			samples.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	finish := func() {
		stopSampler()
		<-samplerDone
		res.MaxCounted, res.Samples = maxSum/cfg.Capacity, samples.Load()
	}

	// converged reports whether every manager counts ⌊P/N⌋ or ⌈P/N⌉
	// partitions and all P are counted.
	converged := func() bool {
		mu.Lock()
		ms := make([]*lease.Manager, len(fleet))
		for i, r := range fleet {
			ms[i] = r.m
		}
		mu.Unlock()
		lo := cfg.Partitions / len(ms)
		now := time.Now()
		total := 0
		for _, m := range ms {
			n := int(math.Round(m.Rate(now) / m.PartitionRate()))
			if n < lo || n > lo+1 {
				return false
			}
			total += n
		}
		return total == cfg.Partitions
	}
	// spread describes how many managers count how many partitions.
	spread := func() string {
		mu.Lock()
		defer mu.Unlock()
		hist := map[int]int{}
		now := time.Now()
		for _, r := range fleet {
			hist[int(math.Round(r.m.Rate(now)/r.m.PartitionRate()))]++
		}
		return fmt.Sprintf("managers by partitions counted: %v", hist)
	}
	await := func(phase string, from time.Time, before int64) (time.Duration, error) {
		deadline := from.Add(cfg.Converge)
		for !converged() {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("fleet: %s: the shares did not converge within %v: %s", phase, cfg.Converge, spread())
			}
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			time.Sleep(5 * time.Millisecond)
		}
		res.CommandsByPhase[phase] = sent() - before
		return time.Since(from), nil
	}

	t0, before0 := time.Now(), sent()
	for i := range cfg.Managers {
		if err := startOne(i); err != nil {
			finish()
			return res, err
		}
	}
	var err error
	if res.StartConverge, err = await("start", t0, before0); err != nil {
		finish()
		return res, err
	}

	// Steady state: commands over the window.
	began, before := time.Now(), sent()
	select {
	case <-ctx.Done():
		finish()
		return res, ctx.Err()
	case <-time.After(cfg.Steady):
	}
	res.CommandsByPhase["steady"] = sent() - before
	res.CommandsPerS = float64(sent()-before) / time.Since(began).Seconds()

	// Join.
	t1, before1 := time.Now(), sent()
	if err := startOne(cfg.Managers); err != nil {
		finish()
		return res, err
	}
	if res.JoinConverge, err = await("join", t1, before1); err != nil {
		finish()
		return res, err
	}

	// Leave: the first manager stops, unlocking its leases and withdrawing.
	mu.Lock()
	leaver := fleet[0]
	mu.Unlock()
	t2, before2 := time.Now(), sent()
	leaver.cancel()
	if err := <-leaver.done; err != nil {
		finish()
		return res, err
	}
	mu.Lock()
	fleet = fleet[1:]
	mu.Unlock()
	commands.Add(leaver.probe.commands.Load())
	_ = leaver.client.Close()
	if res.LeaveConverge, err = await("leave", t2, before2); err != nil {
		finish()
		return res, err
	}
	finish()
	if res.MaxCounted > 1+1e-9 {
		return res, errors.New("fleet: the managers' counted leases exceeded the pool at some instant")
	}
	return res, nil
}
