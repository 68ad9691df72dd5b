package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sinksim"
)

// scenario10 is the lease's Redis cost at fleet scale: (a) the commands/s
// of an idle worker's lease manager, (b) the commands per 1,000 records of
// sluice workers draining a backlog at 2,000 records/s, 3 workers on 20
// partitions and 10 workers on 100, (c) a simulation of 200 lease managers
// on a 1,000-partition pool against miniredis and a real redis-server.
func (r *runner) scenario10(ctx context.Context) ([]Scenario, error) {
	realAddr, stop, err := r.realRedis(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	realClient := func() *redis.Client { return redis.NewClient(&redis.Options{Addr: realAddr, DisableIdentity: true}) }

	idle := Scenario{ID: "10a", Title: "Redis cost of an idle worker (lease manager, default settings)",
		Notes: []string{
			"one lease.Manager with demand 0 on a 2,000 records/s pool of 20 partitions, default settings (tick 100 ms, lease TTL 15 s, keep-alive 1.7 s, 5 s while idle), against the real redis-server, over 30 s after a 2 s start-up",
			"server: the commands the server executed, a script's inner calls included (INFO commandstats); client: what the worker's client sent (one per command, per command in a pipeline, per script call)",
			"the tick-rate row runs with a 20 ms tick: the cost does not follow the tick",
		}}
	for _, tick := range []time.Duration{100 * time.Millisecond, 20 * time.Millisecond} {
		server, client, err := r.idleCommands(ctx, realClient, tick)
		if err != nil {
			return nil, err
		}
		idle.Entries = append(idle.Entries, Entry{Alternative: fmt.Sprintf("sluice, tick %v", tick), Reps: 1, Cols: []Col{
			{Name: "redis_server_cmds_per_s_per_idle_worker", Ideal: "≤ 2 (target)", Value: server, Digits: 2},
			{Name: "redis_client_cmds_per_s", Value: client, Digits: 2},
		}})
	}

	busy := Scenario{ID: "10b", Title: "Redis cost of busy workers: 2,000 records/s, cost 1, each worker its own backlog",
		Notes: []string{
			"sluice workers (lease ahead, start together) on the benchmark's Redis (" + r.redisKind() + "), each draining its own 4-partition topic through the HTTP emulator, start-up and shutdown included, per 1,000 records",
			"server: the commands the server executed, a script's inner calls included (INFO commandstats on redis-server, the command count on miniredis); client: what the workers' clients sent (by command name in results.json)",
		}}
	for _, s := range []struct {
		workers, partitions int
		each                int64
		target              string
	}{{3, 20, 20_000, "≤ 10 at 3 workers (target)"}, {10, 100, 6_000, ""}} {
		e, err := r.busyCommands(ctx, s.workers, s.partitions, s.each, s.target)
		if err != nil {
			return nil, err
		}
		busy.Entries = append(busy.Entries, e)
	}

	fleet := Scenario{ID: "10c", Title: "200 lease managers on a 1,000-partition pool (10,000 units/s), one process",
		Notes: []string{
			"200 lease.Managers with a backlog, default settings, each with its own Redis client, started at once; then a 201st joins; then the first stops (unlocking and withdrawing)",
			"start_s, join_s, leave_s: until every manager counts ⌊P/N⌋ or ⌈P/N⌉ partitions and all 1,000 are counted",
			"redis_cmds_per_s: the whole fleet over 10 s at steady state (200 batched renewals per 5 s and 200 keep-alives per 1.7 s are 160/s); per_manager beside the idle target; commands by phase and by name in results.json",
			"max_counted: the most the managers' counted rates summed to at one sampled instant (every 2 ms), ÷ capacity",
		}}
	for _, v := range []struct {
		name   string
		client func() *redis.Client
	}{{"miniredis", nil}, {"redis-server", realClient}} {
		client := v.client
		if client == nil {
			mr, err := startMiniredis()
			if err != nil {
				return nil, err
			}
			defer mr.Close()
			client = func() *redis.Client { return redis.NewClient(&redis.Options{Addr: mr.Addr(), DisableIdentity: true}) }
		}
		tally := new(redisProbe)
		res, err := runFleet(ctx, fleetConfig{Prefix: r.env.name("s10"), Pool: "fleet", Client: client, Hook: tally})
		if err != nil {
			return nil, fmt.Errorf("fleet on %s: %w", v.name, err)
		}
		r.log.Info("fleet done", "redis", v.name, "result", fmt.Sprintf("%+v", res), "by_name", tally.names())
		fleet.Entries = append(fleet.Entries, Entry{Alternative: "sluice, " + v.name, Reps: 1, Cols: []Col{
			{Name: "managers", Value: float64(res.Managers)},
			{Name: "start_s", Value: res.StartConverge.Seconds(), Digits: 2},
			{Name: "join_s", Value: res.JoinConverge.Seconds(), Digits: 2},
			{Name: "leave_s", Value: res.LeaveConverge.Seconds(), Digits: 2},
			{Name: "redis_cmds_per_s", Value: res.CommandsPerS, Digits: 0},
			{Name: "redis_cmds_per_s_per_manager", Ideal: "≤ 2 (idle target)", Value: res.CommandsPerS / float64(res.Managers), Digits: 2},
			{Name: "max_counted", Ideal: "≤ 1.000", Value: res.MaxCounted, Digits: 3},
			{Name: "instants_checked", Value: float64(res.Samples)},
		}, Extra: map[string]any{"redis_cmds_by_phase": res.CommandsByPhase, "redis_cmds_by_name": tally.names()}})
	}
	return []Scenario{idle, busy, fleet}, nil
}

// idleCommands runs one idle lease manager with the default settings but
// tick and returns the commands/s the server executed for it and those its
// client sent, after start-up.
func (r *runner) idleCommands(ctx context.Context, client func() *redis.Client, tick time.Duration) (server, sent float64, err error) {
	probe := new(redisProbe)
	c := client()
	defer c.Close()
	c.AddHook(probe)
	pool := lease.Pool{Name: r.env.name("idle"), Capacity: scaleCapacity, Partitions: 20}
	if _, err := lease.EnsurePool(ctx, c, "", pool); err != nil {
		return 0, 0, err
	}
	m, err := lease.New(lease.Config{Pool: pool, WorkerID: r.env.name("idle-w"), Tick: tick}, c)
	if err != nil {
		return 0, 0, err
	}
	stats := client() // the server's count, on a client the probe does not see
	defer stats.Close()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(rctx) }()
	defer func() { cancel(); <-done }()
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(2 * time.Second); err != nil {
		return 0, 0, err
	}
	began, before := time.Now(), probe.commands.Load()
	serverBefore, err := serverCommands(ctx, stats)
	if err != nil {
		return 0, 0, err
	}
	if err := sleep(30 * time.Second); err != nil {
		return 0, 0, err
	}
	serverAfter, err := serverCommands(ctx, stats)
	if err != nil {
		return 0, 0, err
	}
	span := time.Since(began).Seconds()
	return float64(serverAfter-serverBefore-1) / span, float64(probe.commands.Load()-before) / span, nil
}

// serverCommands is the number of commands the Redis behind c has executed,
// a script's inner calls included: the sum of INFO commandstats' calls on
// redis-server, total_commands_processed on miniredis (which counts a
// script's inner calls there, and has no commandstats). The INFO call
// itself counts in the next reading.
func serverCommands(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		info = "" // miniredis refuses the section: read its total below
	}
	var total int64
	found := false
	for line := range strings.Lines(info) {
		_, stats, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(stats, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO commandstats: %q: %w", line, err)
		}
		total, found = total+n, true
	}
	if found {
		return total, nil
	}
	if info, err = c.Info(ctx, "stats").Result(); err != nil {
		return 0, fmt.Errorf("INFO stats: %w", err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO answered neither commandstats nor total_commands_processed")
}

// busyCommands runs workers sluice workers on a 2,000 records/s pool of
// partitions, each with its own backlog of each records, and returns their
// entry.
func (r *runner) busyCommands(ctx context.Context, workers, partitions int, each int64, target string) (Entry, error) {
	var specs []workerSpec
	for w := range workers {
		topic := r.env.name("s10", strconv.Itoa(workers), strconv.Itoa(w))
		if err := r.env.produce(ctx, topic, 4, int(each), smallRecord(topic)); err != nil {
			return Entry{}, err
		}
		specs = append(specs, workerSpec{topic: topic, records: each})
	}
	p := pool{capacity: scaleCapacity, unit: ingest.UnitRecords, partitions: partitions}
	ideal := secs(float64(int64(workers)*each) / scaleCapacity)
	simCfg := sinksim.Config{Capacity: scaleCapacity, Unit: ingest.UnitRecords}
	stats := r.env.redisClient(nil)
	defer stats.Close()
	serverBefore, err := serverCommands(ctx, stats)
	if err != nil {
		return Entry{}, err
	}
	t, err := r.trial(ctx, simCfg, 3*ideal+30*time.Second,
		r.sluiceMembers(ctx, r.withGroups(specs), p, ingest.Pricing{Unit: ingest.UnitRecords}))
	if err != nil {
		return Entry{}, err
	}
	serverAfter, err := serverCommands(ctx, stats)
	if err != nil {
		return Entry{}, err
	}
	server := serverAfter - serverBefore - 1
	per1000 := float64(t.out.commands) * 1000 / float64(max(t.out.records, 1))
	byName := map[string]int64{}
	for _, m := range t.members {
		if p := m.redis(); p != nil {
			for k, v := range p.names() {
				byName[k] += v
			}
		}
	}
	r.log.Info("run done", "workers", workers, "partitions", partitions, "records", t.out.records, "commands", t.out.commands, "by_name", byName)
	cols := []Col{
		{Name: "workers", Value: float64(workers)},
		{Name: "partitions", Value: float64(partitions)},
		{Name: "records", Value: float64(t.out.records)},
		{Name: "elapsed_s", Value: t.out.elapsed.Seconds(), Digits: 2},
		{Name: "utilization", Ideal: "1.000", Value: utilization(ideal, t.out.elapsed), Digits: 3},
		{Name: "redis_server_cmds", Value: float64(server)},
		{Name: "redis_server_cmds_per_1000_records", Ideal: target, Value: float64(server) * 1000 / float64(max(t.out.records, 1)), Digits: 2},
		{Name: "redis_client_cmds_per_1000_records", Value: per1000, Digits: 2},
	}
	cols = append(cols, rateCols(t, scaleCapacity)...)
	return Entry{Alternative: fmt.Sprintf("sluice %d×%d on %d partitions", workers, each, partitions), Reps: 1, Cols: cols,
		Extra: map[string]any{"redis_cmds_by_name": byName}}, nil
}

func (r *runner) redisKind() string {
	if r.cfg.Real {
		return "the real Redis at " + r.cfg.RedisAddr
	}
	return "embedded miniredis"
}

// realRedis returns the address of a real redis-server: --real's, else the
// one scripts/redis.sh runs on Config.RedisPort, started here (and stopped
// by stop) unless it was running.
func (r *runner) realRedis(ctx context.Context) (addr string, stop func(), err error) {
	if r.cfg.Real {
		return r.cfg.RedisAddr, func() {}, nil
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", nil, err
	}
	port := r.cfg.RedisPort
	script := func(cmd string) *exec.Cmd {
		c := exec.Command(filepath.Join(root, "scripts", "redis.sh"), cmd)
		c.Env = append(os.Environ(), "SLUICE_REDIS_PORT="+strconv.Itoa(port), "SLUICE_REDIS_SECURE=0")
		c.Stderr = os.Stderr
		return c
	}
	addr = "127.0.0.1:" + strconv.Itoa(port)
	if script("status").Run() == nil {
		r.log.Info("using the running redis-server", "addr", addr)
		return addr, func() {}, nil
	}
	r.log.Info("starting a redis-server with scripts/redis.sh", "port", port)
	if out, err := script("start").Output(); err != nil {
		return "", nil, fmt.Errorf("scripts/redis.sh start: %w\n%s", err, out)
	}
	return addr, func() {
		if err := script("stop").Run(); err != nil {
			r.log.Warn("scripts/redis.sh stop failed", "err", err)
		}
	}, nil
}

// startMiniredis serves a fresh miniredis whose key TTLs follow the real
// clock, as the embedded Redis does.
func startMiniredis() (*miniredis.Miniredis, error) {
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true)
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("start miniredis: %w", err)
	}
	return mr, nil
}
