package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinksim"
	"github.com/sluicehq/sluice/sinkwire"
)

// Config configures a benchmark run.
type Config struct {
	// Real runs against the Kafka at Brokers and the Redis at RedisAddr
	// instead of embedded ones.
	Real      bool
	Brokers   []string
	RedisAddr string
	// Scenarios to run, by number 1..12. Default all.
	Scenarios []int
	// RedisPort is the port of the real redis-server scenario 10 starts
	// with scripts/redis.sh (or uses, when one runs there) without Real.
	// Default 16379.
	RedisPort int
	// KafkaPort is the port of the real Kafka broker scenario 9 starts
	// with scripts/kafka.sh (or uses, when one runs there) without Real.
	// Default 19092.
	KafkaPort int
	// Reps is the repetitions of every run shorter than 30 s; the tables
	// show the median. Default 3.
	Reps int
	// Out is the directory results.json and the charts are written to.
	// Default "bench".
	Out string
	// WorkDir holds the sluice binary built for scenarios 6 and 7.
	// Default a temporary directory.
	WorkDir string
	// Scale multiplies the big sizes of scenarios 5, 6 and 9 (1 = the
	// sizes the harness defaults to; see their notes). Default 1.
	Scale float64
	// Stdout receives the tables; Logger the progress and the components'
	// warnings.
	Stdout io.Writer
	Logger *slog.Logger
}

// runner carries what the scenarios share.
type runner struct {
	cfg    Config
	env    *env
	log    *slog.Logger
	charts map[string][]line // chart file → lines

	scale       []*scaleSetup // scenarios 3 and 4's topics, produced once
	scaleSluice []Entry       // scenario 3's entries, shown again in 4
}

// Run runs the scenarios, prints a markdown table per scenario to
// cfg.Stdout, and writes results.json and the charts to cfg.Out. It
// returns an error only when a scenario could not run.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if len(cfg.Scenarios) == 0 {
		cfg.Scenarios = []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	}
	if cfg.KafkaPort == 0 {
		cfg.KafkaPort = 19092
	}
	if cfg.RedisPort == 0 {
		cfg.RedisPort = 16379
	}
	cfg.Reps = max(cfg.Reps, 1)
	if cfg.Out == "" {
		cfg.Out = "bench"
	}
	if cfg.Scale <= 0 {
		cfg.Scale = 1
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if cfg.WorkDir == "" {
		dir, err := os.MkdirTemp("", "sluice-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.WorkDir = dir
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	// The components log warnings only; the harness logs its progress.
	compLog := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	envCfg := cfg
	envCfg.Logger = compLog
	e, err := startEnv(ctx, envCfg)
	if err != nil {
		return nil, err
	}
	defer e.close()
	r := &runner{cfg: cfg, env: e, log: cfg.Logger, charts: map[string][]line{}}

	started := time.Now()
	rep := &Report{Machine: machine(), GoVersion: runtime.Version(), Commit: gitCommit(), Started: started.UTC().Format(time.RFC3339)}
	rep.Services = "embedded: kfake (Kafka protocol), miniredis (ClockTTL); sink: in-process sinksim.Sim over HTTP"
	if cfg.Real {
		rep.Services = fmt.Sprintf("real: Kafka %s, Redis %s; sink: in-process sinksim.Sim over HTTP", strings.Join(cfg.Brokers, ","), cfg.RedisAddr)
	}
	fmt.Fprintf(cfg.Stdout, "## sluice benchmarks\n\nmachine: %s, %d cores, %s; %s; commit %s; %s\n\n",
		rep.Machine.CPU, rep.Machine.Cores, rep.Machine.OS, rep.GoVersion, rep.Commit, rep.Services)
	scenarios := map[int]func(context.Context) ([]Scenario, error){
		1: r.scenario1, 2: r.scenario2, 3: r.scenario3, 4: r.scenario4, 5: r.scenario5, 6: r.scenario6, 7: r.scenario7,
		8: r.scenario8, 9: r.scenario9, 10: r.scenario10, 11: r.scenario11, 12: r.scenario12,
	}
	for _, n := range cfg.Scenarios {
		f, ok := scenarios[n]
		if !ok {
			return nil, fmt.Errorf("bench: no scenario %d (want 1..12)", n)
		}
		t0 := time.Now()
		r.log.Info("scenario starting", "scenario", n)
		got, err := f(ctx)
		if err != nil {
			return rep, fmt.Errorf("scenario %d: %w", n, err)
		}
		for i := range got {
			got[i].Charts = r.drawCharts(got[i].ID)
			got[i].Commit, got[i].Started = rep.Commit, rep.Started
			got[i].WriteMarkdown(cfg.Stdout)
		}
		rep.Scenarios = append(rep.Scenarios, got...)
		r.log.Info("scenario done", "scenario", n, "seconds", time.Since(t0).Round(time.Second).Seconds())
	}
	rep.DurationS = time.Since(started).Round(time.Second).Seconds()
	path := filepath.Join(cfg.Out, "results.json")
	rep.keep(path)
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return rep, err
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return rep, err
	}
	fmt.Fprintf(cfg.Stdout, "total %.0f s; wrote %s\n", rep.DurationS, path)
	return rep, nil
}

// repsFor is the repetitions of a run whose ideal time is ideal: the
// configured number when it is shorter than 30 s, else one.
func (r *runner) repsFor(ideal time.Duration) int {
	if ideal < 30*time.Second {
		return max(r.cfg.Reps, 1)
	}
	return 1
}

// trial is one run of one alternative: what the workers counted, what the
// sink saw, and the members (for their timelines).
type trial struct {
	out     outcome
	snap    sinkwire.Stats
	members []member
}

// build creates the members of a trial against the emulator at url; start
// and groups are for runJob.
type build func(url string, epoch time.Time) (members []member, start chan struct{}, groups []string, err error)

// trial serves a fresh emulator, builds the members and runs them to
// completion.
func (r *runner) trial(ctx context.Context, simCfg sinksim.Config, timeout time.Duration, b build) (trial, error) {
	sim, err := startSim(ctx, simCfg)
	if err != nil {
		return trial{}, err
	}
	defer sim.stop()
	epoch := sim.sim.Snapshot(true).SeriesStart
	members, start, groups, err := b(sim.url, epoch)
	if err != nil {
		return trial{}, err
	}
	out, err := r.env.runJob(ctx, members, start, groups, timeout)
	if err != nil {
		return trial{}, err
	}
	return trial{out: out, snap: sim.sim.Snapshot(true), members: members}, nil
}

// rateCols are the rate promise from both sides: the most units sent in
// any sliding second (all members), the most the sink accepted in any
// sliding second and 200 ms (÷ capacity and ÷ one slice of it), and, for
// sluice, the guard in effect (least and latest over the workers).
func rateCols(t trial, capacity float64) []Col {
	cols := []Col{
		{Name: "send_max_1s", Ideal: "≤ 1.000", Value: float64(sendMax(t.members, time.Second)) / capacity, Digits: 3},
		{Name: "max_1s_window", Ideal: "≤ 1.000", Value: float64(t.snap.MaxUnits1s) / capacity, Digits: 3},
		{Name: "max_200ms_per_slice", Ideal: "≤ 1.1", Value: float64(t.snap.MaxUnits200ms) / (capacity * slice.Seconds()), Digits: 2},
	}
	var guardMin, guardFinal time.Duration
	sluice := false
	for i, p := range t.out.members {
		if _, ok := t.members[i].(*sluiceWorker); !ok {
			continue
		}
		if !sluice || p.guardMin < guardMin {
			guardMin = p.guardMin
		}
		sluice, guardFinal = true, max(guardFinal, p.guardFinal)
	}
	if sluice {
		cols = append(cols,
			Col{Name: "guard_min_ms", Value: guardMin.Seconds() * 1000, Digits: 1},
			Col{Name: "guard_final_ms", Value: guardFinal.Seconds() * 1000, Digits: 1})
	}
	return cols
}

// sluiceMembers builds one sluice worker per spec in one pool, leasing
// ahead and starting together once their groups are stable.
func (r *runner) sluiceMembers(ctx context.Context, specs []workerSpec, pool pool, pricing ingest.Pricing) build {
	return func(url string, epoch time.Time) ([]member, chan struct{}, []string, error) {
		start := make(chan struct{})
		var ms []member
		var groups []string
		p := pool.lease(r.env.name("pool"))
		for _, s := range specs {
			w, err := r.env.newSluiceWorker(ctx, s, p, pricing, url, epoch, start)
			if err != nil {
				return nil, nil, nil, err
			}
			ms = append(ms, w)
			groups = append(groups, s.group)
		}
		return ms, start, groups, nil
	}
}

// peerMembers builds one peer per spec; admit(i) is worker i's limiter.
func (r *runner) peerMembers(specs []workerSpec, pricing ingest.Pricing, admit func(i int) (func(context.Context, int64) error, *redisProbe)) build {
	return func(url string, epoch time.Time) ([]member, chan struct{}, []string, error) {
		var ms []member
		for i, s := range specs {
			var lim func(context.Context, int64) error
			var probe *redisProbe
			if admit != nil {
				lim, probe = admit(i)
			}
			p, err := r.env.newPeer(s, pricing, url, epoch, lim)
			if err != nil {
				return nil, nil, nil, err
			}
			p.probe = probe
			ms = append(ms, p)
		}
		return ms, nil, nil, nil
	}
}

// withGroups returns specs with fresh consumer groups, so each trial
// reads the same records from the start.
func (r *runner) withGroups(specs []workerSpec) []workerSpec {
	out := slices.Clone(specs)
	for i := range out {
		out[i].group = r.env.name("g")
	}
	return out
}

// utilization returns ideal ÷ elapsed.
func utilization(ideal, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return ideal.Seconds() / elapsed.Seconds()
}

func machine() Machine {
	m := Machine{CPU: "unknown", Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			m.CPU = strings.TrimSpace(v)
			break
		}
	}
	return m
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		c += "-dirty"
	}
	return c
}
