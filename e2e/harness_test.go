//go:build e2e

package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sinkwire"
)

// The services under test, from the environment (make e2e starts them with
// these defaults).
var (
	brokers   = cmp.Or(os.Getenv("SLUICE_E2E_BROKERS"), "127.0.0.1:19092")
	redisAddr = cmp.Or(os.Getenv("SLUICE_E2E_REDIS_ADDR"), "127.0.0.1:16379")
	binary    = cmp.Or(os.Getenv("SLUICE_E2E_BIN"), "../bin/sluice")
	usgs      = "../testdata/usgs-earthquakes-2025-05.csv"
)

const usgsRecords = 9366

// env is one test's world: its own topic, group and pool on the shared
// broker and Redis, its own sink emulator.
type env struct {
	t        testing.TB
	name     string // topic and pool name
	redis    string
	capacity int
	parts    int
	ttl      time.Duration
	sim      string   // sink emulator base URL
	vars     []string // environment variables of its sluice processes, beyond the test's own
}

func newEnv(t testing.TB, capacity, partitions int, ttl time.Duration, simArgs ...string) *env {
	t.Helper()
	e := &env{
		t:        t,
		name:     fmt.Sprintf("e2e-%s-%d", resourceName(t.Name()), rand.IntN(1_000_000)),
		redis:    redisAddr,
		capacity: capacity,
		parts:    partitions,
		ttl:      ttl,
	}
	e.startSim(simArgs...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, queue.EnsureTopic(ctx, []string{brokers}, e.name, 6))
	require.NoError(t, queue.EnsureTopic(ctx, []string{brokers}, e.name+".dlq", 1))
	return e
}

// startSim starts the env's sink emulator, provisioned at its capacity.
func (e *env) startSim(args ...string) {
	e.t.Helper()
	addr := freeAddr(e.t)
	e.start("sim-"+e.name, append([]string{"sink-sim", "--listen", addr, "--capacity", fmt.Sprint(e.capacity)}, args...)...)
	e.sim = "http://" + addr
	require.Eventually(e.t, func() bool { _, err := e.simStats(); return err == nil }, 10*time.Second, 20*time.Millisecond, "sink emulator did not start")
}

// resourceName turns a test's name into one that is valid as a Kafka topic,
// a Redis key part and a file name: subtests' slashes and spaces become
// dashes.
func resourceName(test string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '-'
	}, test)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

// common are the flags every worker and bulk-load of this env shares.
func (e *env) common() []string {
	return []string{
		"--brokers", brokers, "--redis-addr", e.redis, "--sink", e.sim,
		"--pool", e.name, "--capacity", fmt.Sprint(e.capacity), "--partitions", fmt.Sprint(e.parts),
		"--lease-ttl", e.ttl.String(), "--topic", e.name, "--id-field", "id",
	}
}

// proc is a sluice process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	code int
}

// start runs the sluice binary with args; its output goes to a log file
// printed if the test fails. The process is killed at cleanup.
func (e *env) start(name string, args ...string) *proc {
	e.t.Helper()
	bin, err := filepath.Abs(binary)
	require.NoError(e.t, err)
	dir := e.t.TempDir()
	if keep := os.Getenv("SLUICE_E2E_KEEP_LOGS"); keep != "" {
		// The logs outlive the test there, one folder per test and run.
		dir = filepath.Join(keep, strings.NewReplacer("/", "_", " ", "_").Replace(e.t.Name()))
		require.NoError(e.t, os.MkdirAll(dir, 0o755))
	}
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	require.NoError(e.t, err)
	cmd := exec.Command(bin, args...)
	cmd.Env = e.environ()
	cmd.Stdout, cmd.Stderr = f, f
	require.NoError(e.t, cmd.Start(), "start %s (build it with make build)", bin)
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		f.Close()
		close(p.done)
	}()
	e.t.Cleanup(func() {
		if e.t.Failed() {
			// Stopped gracefully, a worker's last line says what it did
			// (see "worker stopped").
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
			}
		}
		_ = cmd.Process.Kill()
		<-p.done
		if e.t.Failed() {
			data, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			e.t.Logf("--- last lines of %s:\n%s", name, strings.Join(lines[max(0, len(lines)-25):], "\n"))
		}
	})
	return p
}

func (e *env) worker(id string, extra ...string) *proc {
	return e.start(id, append(append([]string{"worker", "--worker-id", id}, e.common()...), extra...)...)
}

// run runs sluice to completion and returns its exit code and output.
func (e *env) run(timeout time.Duration, args ...string) (int, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = e.environ()
	// A process still running at the timeout gets SIGQUIT, so that its
	// output ends with every goroutine's stack (where it waited), and is
	// killed 5 s later.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errorsAs(err, &exit) {
		require.NoError(e.t, err)
	}
	code := 0
	if exit != nil {
		code = exit.ExitCode()
	}
	return code, string(out)
}

// credentialVars are variables that both the scripts and the CLI read (the
// scripts' test user and password, the CLI's credentials): a process of a
// test gets them only through env.vars, so that a shell that exported them
// for scripts/ does not change what sluice connects with.
var credentialVars = []string{
	"SLUICE_KAFKA_SASL_USERNAME", "SLUICE_KAFKA_SASL_PASSWORD",
	"SLUICE_REDIS_USERNAME", "SLUICE_REDIS_PASSWORD", "SLUICE_REDIS_SENTINEL_MASTER", "SLUICE_REDIS_SENTINEL_PASSWORD",
	"SLUICE_REDIS_CLUSTER",
}

// environ is the environment of the env's sluice processes: the test's,
// less credentialVars, plus env.vars.
func (e *env) environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(credentialVars, name) {
			out = append(out, kv)
		}
	}
	return append(out, e.vars...)
}

func errorsAs(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*target = e
	}
	return ok
}

// signal sends sig to p.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// wait waits for p to exit, at most timeout; ok is false on timeout.
func (p *proc) wait(timeout time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
		return p.code, true
	case <-time.After(timeout):
		return 0, false
	}
}

func (e *env) simStats() (sinkwire.Stats, error) {
	var st sinkwire.Stats
	resp, err := http.Get(e.sim + "/v1/stats?series=1")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

func (e *env) stats() sinkwire.Stats {
	e.t.Helper()
	st, err := e.simStats()
	require.NoError(e.t, err)
	return st
}

// awaitAccepted waits until the sink has stored n distinct records.
func (e *env) awaitAccepted(n int64, timeout time.Duration) sinkwire.Stats {
	e.t.Helper()
	var st sinkwire.Stats
	require.Eventually(e.t, func() bool { st = e.stats(); return st.Accepted >= n }, timeout, 100*time.Millisecond,
		"sink stored %d of %d records", st.Accepted, n)
	return st
}

// awaitGroup waits until the consumer group has n members and is stable.
func (e *env) awaitGroup(n int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		ctx, cancel := context.WithTimeout(e.t.Context(), 5*time.Second)
		defer cancel()
		members, stable, err := queue.GroupMembers(ctx, []string{brokers}, "sluice-"+e.name)
		return err == nil && stable && members == n
	}, 60*time.Second, 100*time.Millisecond, "consumer group did not settle with %d members", n)
}

// pool returns the pool's status as sluice pool status reports it.
func (e *env) pool() lease.PoolStatus {
	e.t.Helper()
	code, out := e.run(20*time.Second, "pool", "status", "--redis-addr", e.redis, "--pool", e.name, "--json")
	require.Equal(e.t, 0, code, out)
	var st lease.PoolStatus
	require.NoError(e.t, json.Unmarshal([]byte(out), &st), out)
	return st
}

// holders counts the partitions each worker holds.
func holders(st lease.PoolStatus) map[string]int {
	out := map[string]int{}
	for _, p := range st.Partitions {
		if p.Holder != "" {
			out[p.Holder]++
		}
	}
	return out
}

// produce produces the first n USGS records (all when n ≤ 0) with sluice
// produce.
func (e *env) produce(n int) int {
	e.t.Helper()
	path := usgs
	if n > 0 {
		path = head(e.t, n)
	} else {
		n = usgsRecords
	}
	code, out := e.run(2*time.Minute, "produce", "--brokers", brokers, "--topic", e.name, "--id-field", "id", path)
	require.Equal(e.t, 0, code, out)
	return n
}

// head writes the first n rows of the USGS file to a temporary CSV.
func head(t testing.TB, n int) string {
	t.Helper()
	data, err := os.ReadFile(usgs)
	require.NoError(t, err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	path := filepath.Join(t.TempDir(), "head.csv")
	require.NoError(t, os.WriteFile(path, bytes.Join(lines[:n+1], nil), 0o600))
	return path
}

// report prints a case's figures and checks the ones every case shares:
// nothing over capacity in any sliding second at the sink (+1 % for jitter
// between send and accept).
func (e *env) report(st sinkwire.Stats) {
	e.t.Helper()
	e.t.Logf("sink: accepted %d, duplicates %d, throttled %d, rejected %d, requests %d, max 1 s window %d (%.3f of %d), max 200 ms window %d",
		st.Accepted, st.Duplicates, st.Throttled, st.Rejected, st.Requests,
		st.MaxUnits1s, float64(st.MaxUnits1s)/float64(e.capacity), e.capacity, st.MaxUnits200ms)
	e.t.Logf("sink: units per 200 ms: %v", st.UnitsPer200ms)
	require.LessOrEqual(e.t, float64(st.MaxUnits1s), 1.01*float64(e.capacity), "a sliding second over capacity")
}
