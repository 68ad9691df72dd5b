//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/sinkwire"
)

// Three worker processes find a sink's capacity that nobody told
// them (sink-sim --capacity 1500, its default bucket mode) by probing,
// on a backlog of 60,000 records in Kafka: the pool's capacity converges
// to at least 90 % of 1,500 within 30 s (and stays within 90-100 % from
// then on), throttled attempts are at most 2 % of the sends over the run,
// and from the convergence on no sliding second at the sink holds more
// than 1,500. Every record is stored once, none dead-lettered.
//
// The same on virtual time, against both of the emulator's modes, is
// worker/probe_test.go in make test. This case runs alone (not parallel):
// the probe's steps are judged on what the workers sent, and another
// case's processes on the same cores would slow the climb.
func TestProbeFindsTheSinksCapacity(t *testing.T) {
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
	for _, p := range ws { // the probe's decisions, whichever process made them
		data, err := os.ReadFile(p.log)
		require.NoError(t, err)
		for line := range strings.Lines(string(data)) {
			if strings.Contains(line, "pool capacity") {
				t.Logf("%s: %s", p.name, strings.TrimSpace(line))
			}
		}
	}
	st = e.stats()
	sends := st.Accepted + st.Duplicates + st.Throttled + st.Rejected
	t.Logf("capacity each second: %s", strings.Join(trace, " "))
	var after int64
	if !converged.IsZero() {
		after, _ = busiestSince(st, converged)
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
