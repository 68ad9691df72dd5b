//go:build e2e

package e2e

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func writeFile(path, data string) error { return os.WriteFile(path, []byte(data), 0o600) }

// threeWorkersLoading starts three workers, waits for the group to settle,
// produces the USGS file and waits until the sink is busy.
func threeWorkersLoading(t *testing.T, e *env) []*proc {
	t.Helper()
	ws := []*proc{e.worker("w1"), e.worker("w2"), e.worker("w3")}
	e.awaitGroup(3)
	e.produce(0)
	e.awaitAccepted(int64(2*e.capacity), 30*time.Second) // two seconds in
	return ws
}

// Case 2: kill -9 of one of three workers mid-run: nothing is lost, and its
// partitions are in use by the survivors within lease TTL + 1 s.
func TestKilledWorkerLosesNothing(t *testing.T) {
	e := newEnv(t, 1000, 10, 5*time.Second)
	ws := threeWorkersLoading(t, e)
	held := holders(e.pool())["w3"]
	require.NotZero(t, held, "w3 held no partition before the kill")

	killed := time.Now()
	require.NoError(t, ws[2].cmd.Process.Kill())
	var reclaim time.Duration
	require.Eventually(t, func() bool {
		h := holders(e.pool())
		reclaim = time.Since(killed)
		return h["w3"] == 0 && h["w1"]+h["w2"] == e.parts
	}, e.ttl+time.Second, 50*time.Millisecond, "survivors did not take w3's %d partitions within TTL + 1 s", held)
	t.Logf("w3 held %d partitions; survivors hold all %d after %v (TTL %v)", held, e.parts, reclaim.Round(time.Millisecond), e.ttl)

	st := e.awaitAccepted(usgsRecords, 2*time.Minute)
	e.report(st)
	require.EqualValues(t, usgsRecords, st.Accepted, "0 records lost")
}

// A worker killed while the group rebalances (a fourth one joining): the
// rebalance waits for the killed member until its session times out, and
// every consumer of the group stops meanwhile. The pool's longest pause at
// the sink is the session timeout (6 s, the broker's floor) and the join,
// nothing more; nothing is lost.
func TestKillDuringRebalanceStallsForTheSessionOnly(t *testing.T) {
	e := newEnv(t, 1000, 10, 5*time.Second)
	ws := threeWorkersLoading(t, e)
	e.worker("w4") // the group rebalances to take it in
	require.NoError(t, ws[2].cmd.Process.Kill())

	st := e.awaitAccepted(usgsRecords, 2*time.Minute)
	e.report(st)
	require.EqualValues(t, usgsRecords, st.Accepted, "0 records lost")
	var gap, longest int // 200 ms buckets with nothing accepted, between the first and last accept
	for _, u := range st.UnitsPer200ms[slices.IndexFunc(st.UnitsPer200ms, func(u int64) bool { return u > 0 }):] {
		if u == 0 {
			gap++
			longest = max(longest, gap)
		} else {
			gap = 0
		}
	}
	stall := time.Duration(longest) * 200 * time.Millisecond
	t.Logf("the pool stood still for %v at most (session timeout 6 s)", stall)
	require.Less(t, stall, 8*time.Second, "the group stalled longer than the session timeout and a join")
}

// Case 3: SIGTERM of a worker mid-batch: it exits 0 within the grace period,
// commits what the sink acknowledged, releases its leases (peers take them
// within 1 s), and causes no duplicate at the sink.
func TestTerminatedWorkerHandsOverCleanly(t *testing.T) {
	e := newEnv(t, 1000, 10, 15*time.Second)
	ws := threeWorkersLoading(t, e)

	const grace = 10 * time.Second
	ws[2].signal(t, syscall.SIGTERM)
	term := time.Now()
	code, ok := ws[2].wait(grace + 2*time.Second)
	require.True(t, ok, "w3 did not exit within the grace period")
	require.Equal(t, 0, code)
	exited := time.Since(term)
	// Its last line says what it did.
	logged, err := os.ReadFile(ws[2].log)
	require.NoError(t, err)
	last := regexp.MustCompile(`msg="worker stopped" delivered=([0-9]+) .* slices=([0-9]+) `).FindSubmatch(logged)
	require.NotNil(t, last, "w3 logged no \"worker stopped\":\n%s", logged)
	require.NotEqual(t, "0", string(last[1]), "w3 stopped mid-batch, having delivered records")
	require.NotEqual(t, "0", string(last[2]), "and opened slices")

	var takeover time.Duration
	require.Eventually(t, func() bool {
		h := holders(e.pool())
		takeover = time.Since(term)
		return h["w3"] == 0 && h["w1"]+h["w2"] == e.parts
	}, exited+time.Second, 20*time.Millisecond, "peers did not take w3's partitions within 1 s of its exit")
	t.Logf("w3 exited %v after SIGTERM; peers held every partition %v after it", exited.Round(time.Millisecond), takeover.Round(time.Millisecond))

	st := e.awaitAccepted(usgsRecords, 2*time.Minute)
	e.report(st)
	require.EqualValues(t, usgsRecords, st.Accepted)
	require.Zero(t, st.Duplicates, "the hand-over caused duplicates")
}

// Case 4: Redis stopped mid-run: every worker stops writing before its
// leases' validity ends; Redis back: ingestion resumes; nothing is lost.
func TestRedisOutageStopsWritesAndResumes(t *testing.T) {
	port := portOf(t, freeAddr(t)) // a Redis of its own, on a free port
	cache := t.TempDir()
	redisCmd := func(action string) {
		cmd := exec.Command("../scripts/redis.sh", action)
		cmd.Env = append(os.Environ(), "SLUICE_REDIS_PORT="+port, "SLUICE_CACHE="+cache, "SLUICE_REDIS_SECURE=0") // the workers connect without credentials
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
	}
	redisCmd("start")
	t.Cleanup(func() { redisCmd("stop") })

	const ttl, readyAfter = 5 * time.Second, 3 * time.Second
	e := newEnv(t, 1000, 10, ttl)
	e.redis = "127.0.0.1:" + port
	metricsAddr := freeAddr(t)
	e.worker("w1", "--metrics-addr", metricsAddr, "--ready-after", readyAfter.String())
	e.worker("w2")
	e.awaitGroup(2)
	var lastReadyz string // the latest answer's body
	readyz := func() int {
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		lastReadyz = string(body)
		return resp.StatusCode
	}
	// awaitReadyz polls /readyz of the running worker process until it
	// answers want, and returns how long that took.
	awaitReadyz := func(want int, within time.Duration) time.Duration {
		t.Helper()
		began := time.Now()
		require.Eventually(t, func() bool { return readyz() == want }, within, 50*time.Millisecond, "/readyz %d", want)
		return time.Since(began)
	}
	awaitReadyz(http.StatusOK, 10*time.Second)
	e.produce(0)
	e.awaitAccepted(2000, 30*time.Second)

	stopped := time.Now()
	redisCmd("stop")
	// /readyz of the running worker turns not ready once Redis has been
	// unreachable for --ready-after (its announcements notice within a
	// keep-alive, under 2 s).
	awaitReadyz(http.StatusServiceUnavailable, readyAfter+5*time.Second)
	notReady := time.Since(stopped)
	t.Logf("/readyz not ready %v after Redis stopped (--ready-after %v): %s", notReady.Round(time.Millisecond), readyAfter, lastReadyz)
	require.Contains(t, lastReadyz, "Redis unreachable")
	require.GreaterOrEqual(t, notReady, readyAfter, "ready while the outage was shorter than --ready-after")
	// Leases were last renewed before the stop, so none is valid past
	// stopped + TTL; a worker must stop writing before that.
	time.Sleep(time.Until(stopped.Add(ttl + 2*time.Second)))
	during := e.stats()
	lastWrite := during.LastChargeAt.Sub(stopped)
	t.Logf("Redis stopped; last write accepted %v later (lease TTL %v); %d of %d stored so far",
		lastWrite.Round(time.Millisecond), ttl, during.Accepted, usgsRecords)
	require.Less(t, lastWrite, ttl, "a write was accepted after every lease had expired")
	require.Less(t, during.Accepted, int64(usgsRecords), "the load finished before the outage was tested")

	redisCmd("start")
	resumed := time.Now()
	back := awaitReadyz(http.StatusOK, 15*time.Second)
	t.Logf("/readyz ready again %v after Redis came back", back.Round(time.Millisecond))
	st := e.awaitAccepted(usgsRecords, 2*time.Minute)
	t.Logf("Redis back: the rest was stored within %v", time.Since(resumed).Round(time.Millisecond))
	e.report(st)
	require.EqualValues(t, usgsRecords, st.Accepted, "0 records lost")
}

// Case 5: the Kafka broker restarted mid-run: ingestion resumes; nothing is
// lost.
func TestKafkaRestartResumes(t *testing.T) {
	e := newEnv(t, 1000, 10, 15*time.Second)
	e.worker("w1")
	e.worker("w2")
	e.awaitGroup(2)
	e.produce(0)
	e.awaitAccepted(2000, 30*time.Second)

	kafkaCmd := func(action string) {
		out, err := exec.Command("../scripts/kafka.sh", action).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	kafkaCmd("stop")
	during := e.stats().Accepted
	kafkaCmd("start")
	restarted := time.Now()
	st := e.awaitAccepted(usgsRecords, 3*time.Minute)
	t.Logf("broker restarted with %d of %d stored; the rest within %v", during, usgsRecords, time.Since(restarted).Round(time.Millisecond))
	e.report(st)
	require.EqualValues(t, usgsRecords, st.Accepted, "0 records lost")
}
