//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/sinkwire"
)

// withFlag returns args with the value after flag replaced (appended when
// args do not have flag).
func withFlag(args []string, flag, value string) []string {
	out := append([]string(nil), args...)
	for i, a := range out {
		if a == flag && i+1 < len(out) {
			out[i+1] = value
			return out
		}
	}
	return append(out, flag, value)
}

// synthetic writes a CSV of n records with unique IDs (prefix-0, ...) shaped
// like the USGS file's rows, and returns its path.
func synthetic(t *testing.T, prefix string, n int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("id,time,mag,place\n")
	for i := range n {
		fmt.Fprintf(&b, "%s-%d,2025-05-01T00:%02d:%02d.000Z,%d.%d,\"%d km N of somewhere\"\n", prefix, i, i/60%60, i%60, i%7, i%10, i%97)
	}
	path := filepath.Join(t.TempDir(), prefix+".csv")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// poolCapacity is the pool's capacity in force, -1 while it is not
// defined.
func (e *env) poolCapacity() float64 {
	e.t.Helper()
	code, out := e.run(20*time.Second, "pool", "status", "--redis-addr", e.redis, "--pool", e.name, "--json")
	if code != 0 {
		return -1
	}
	var st lease.PoolStatus
	require.NoError(e.t, json.Unmarshal([]byte(out), &st), out)
	return st.Pool.Capacity
}

// busiestSince returns the most units the sink accepted in any sliding
// second (five consecutive 200 ms steps of its series) that starts at or
// after from.
func busiestSince(st sinkwire.Stats, from time.Time) int64 {
	first := 0
	if d := from.Sub(st.SeriesStart); d > 0 {
		first = int((d + 200*time.Millisecond - 1) / (200 * time.Millisecond))
	}
	var most int64
	for i := first; i+5 <= len(st.UnitsPer200ms); i++ {
		var sum int64
		for _, n := range st.UnitsPer200ms[i : i+5] {
			sum += n
		}
		most = max(most, sum)
	}
	return most
}

// Issue 29 (a): a rolling "upgrade" that changes the pool through the
// deployment's values. Three workers run with capacity 2,000 and
// --pool-definition apply, as the chart starts them; three new ones start
// with capacity 1,000, and the first of them applies it as a live change
// (a decrease: at once) instead of refusing to start; the old ones adopt
// it and are stopped one by one. No process exits non-zero, no sliding
// second at the sink after the switch holds more than 1,000, and every
// record is stored once.
func TestRollingUpgradeAppliesThePoolDefinition(t *testing.T) {
	t.Parallel()
	const n = 24000
	e := newEnv(t, 2000, 20, 6*time.Second)
	var old []*proc
	for i := range 3 {
		old = append(old, e.worker(fmt.Sprintf("old%d", i+1), "--pool-definition", "apply"))
	}
	e.awaitGroup(3)
	code, out := e.run(2*time.Minute, "produce", "--brokers", brokers, "--topic", e.name, "--id-field", "id", synthetic(t, "up", n))
	require.Equal(t, 0, code, out)
	e.awaitAccepted(6000, time.Minute)

	var fresh []*proc
	for i := range 3 {
		args := append(append([]string{"worker", "--worker-id", fmt.Sprintf("new%d", i+1)}, e.common()...), "--pool-definition", "apply")
		fresh = append(fresh, e.start(fmt.Sprintf("new%d", i+1), withFlag(args, "--capacity", "1000")...))
	}
	var st = e.pool()
	require.Eventually(t, func() bool { st = e.pool(); return st.Pool.Capacity == 1000 }, 20*time.Second, 100*time.Millisecond,
		"the new deployment's capacity was applied")
	require.NotNil(t, st.Pool.Switch)
	switchAt := st.Pool.Switch.At
	t.Logf("capacity 1,000 applied, switching at %s; changes: %v", switchAt.Format(time.RFC3339Nano), st.Pool.Changes)
	for _, p := range old {
		time.Sleep(2 * time.Second)
		p.signal(t, syscall.SIGTERM)
		code, ok := p.wait(30 * time.Second)
		require.True(t, ok, "%s did not stop", p.name)
		require.Zero(t, code, "%s exited non-zero", p.name)
	}
	sink := e.awaitAccepted(n, 2*time.Minute)
	for _, p := range fresh {
		p.signal(t, syscall.SIGTERM)
		code, ok := p.wait(30 * time.Second)
		require.True(t, ok, "%s did not stop", p.name)
		require.Zero(t, code, "%s exited non-zero", p.name)
	}
	after := busiestSince(sink, switchAt)
	t.Logf("sink: accepted %d, duplicates %d, throttled %d; busiest second before the switch %d, after it %d",
		sink.Accepted, sink.Duplicates, sink.Throttled, sink.MaxUnits1s, after)
	// Each record is stored once; the consumer group's rebalances as the
	// new pods join redeliver a few records in flight, which the sink
	// recognises by their IDs (Duplicates).
	require.EqualValues(t, n, sink.Accepted, "every record at the sink, once")
	require.LessOrEqual(t, after, int64(1000), "busiest second after the switch")
	require.Greater(t, after, int64(900), "the new capacity is used")
}

// Issue 29: two deployments that keep disagreeing about a pool. A applies
// 2,000, B applies 1,000, A again 2,000 (a rollback is allowed once); B
// again would change it back a second time: refused with exit 2 and an
// error naming both definitions and the workers that applied them.
func TestDisagreeingDeploymentsAreRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2000, 10, 6*time.Second)
	start := func(id, capacity string) *proc {
		args := append(append([]string{"worker", "--worker-id", id}, e.common()...), "--pool-definition", "apply")
		return e.start(id, withFlag(args, "--capacity", capacity)...)
	}
	capacityIs := func(c float64) {
		require.Eventually(t, func() bool { return e.poolCapacity() == c }, 20*time.Second, 100*time.Millisecond)
	}
	a1 := start("deploy-a-1", "2000")
	capacityIs(2000)
	b1 := start("deploy-b-1", "1000")
	capacityIs(1000)
	time.Sleep(1500 * time.Millisecond) // past the switch
	a2 := start("deploy-a-2", "2000")
	capacityIs(2000)
	time.Sleep(6 * time.Second) // past the raise's switch (a renewal interval)
	b2 := start("deploy-b-2", "1000")
	code, ok := b2.wait(30 * time.Second)
	require.True(t, ok, "the flapping deployment's worker did not exit")
	require.Equal(t, 2, code)
	data, err := os.ReadFile(b2.log)
	require.NoError(t, err)
	log := string(data)
	t.Logf("the refused worker said: %s", strings.TrimSpace(log[strings.LastIndex(strings.TrimSpace(log), "\n")+1:]))
	require.Contains(t, log, "definition flapping")
	for _, want := range []string{"capacity 2000 records/s", "capacity 1000 records/s", "deploy-a-1", "deploy-b-1", "deploy-a-2", "deploy-b-2"} {
		require.Contains(t, log, want)
	}
	require.EqualValues(t, 2000, e.pool().Pool.Capacity, "the pool stays as it was")
	for _, p := range []*proc{a1, b1, a2} {
		p.signal(t, syscall.SIGTERM)
		code, ok := p.wait(30 * time.Second)
		require.True(t, ok)
		require.Zero(t, code, "%s", p.name)
	}
}

// Issue 28: three worker processes find a sink's capacity that nobody told
// them (sink-sim --capacity 1500, its default bucket mode) by probing,
// on a backlog of 60,000 records in Kafka: the pool's capacity converges
// to at least 90 % of 1,500 within 30 s (and stays within 90-100 % from
// then on), throttled attempts are at most 2 % of the sends over the run,
// and from the convergence on no sliding second at the sink holds more
// than 1,500. Every record is stored once, none dead-lettered.
func TestProbeFindsTheSinksCapacity(t *testing.T) {
	t.Parallel()
	const n, capacity = 60000, 1500
	e := newEnv(t, capacity, 12, 6*time.Second)
	code, out := e.run(3*time.Minute, "produce", "--brokers", brokers, "--topic", e.name, "--id-field", "id", synthetic(t, "probe", n))
	require.Equal(t, 0, code, out)
	var ws []*proc
	began := time.Now()
	for i := range 3 {
		args := append([]string{"worker", "--worker-id", fmt.Sprintf("p%d", i+1)}, e.common()...)
		ws = append(ws, e.start(fmt.Sprintf("p%d", i+1), withFlag(args, "--capacity", "probe")...))
	}
	var (
		trace     []string
		converged time.Time
		st        sinkwire.Stats
	)
	for time.Since(began) < 3*time.Minute {
		time.Sleep(time.Second)
		c := e.poolCapacity()
		trace = append(trace, fmt.Sprint(c))
		switch in := c >= 0.9*capacity && c <= capacity; {
		case in && converged.IsZero():
			converged = time.Now()
		case !in:
			converged = time.Time{}
		}
		if st = e.stats(); st.Accepted >= n {
			break
		}
	}
	for _, p := range ws {
		p.signal(t, syscall.SIGTERM)
		code, ok := p.wait(30 * time.Second)
		require.True(t, ok, "%s did not stop", p.name)
		require.Zero(t, code, "%s exited non-zero", p.name)
	}
	st = e.stats()
	sends := st.Accepted + st.Duplicates + st.Throttled + st.Rejected
	t.Logf("capacity each second: %s", strings.Join(trace, " "))
	var after int64
	if !converged.IsZero() {
		after = busiestSince(st, converged)
		t.Logf("converged to 90-100 %% of %d after %s", capacity, converged.Sub(began).Round(100*time.Millisecond))
	}
	t.Logf("sink: accepted %d, duplicates %d, throttled %d of %d sends (%.2f %%), rejected %d; busiest second after convergence %d, over the run %d",
		st.Accepted, st.Duplicates, st.Throttled, sends, 100*float64(st.Throttled)/float64(sends), st.Rejected, after, st.MaxUnits1s)
	require.EqualValues(t, n, st.Accepted, "every record stored once")
	require.Zero(t, e.dlqCount(), "throttled records are never dead-lettered")
	require.False(t, converged.IsZero(), "the capacity converged to 90-100 %% of the sink's")
	require.LessOrEqual(t, converged.Sub(began), 30*time.Second, "within 30 s")
	require.LessOrEqual(t, float64(st.Throttled), 0.02*float64(sends), "throttled attempts ≤ 2 %% of the sends")
	require.LessOrEqual(t, after, int64(capacity), "no sliding second over 1,500 after convergence")
}
