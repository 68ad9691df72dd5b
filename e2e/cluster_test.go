//go:build e2e

package e2e

// The Redis Cluster cases: make e2e starts a cluster of 3 masters and 3
// replicas, TLS only with the ACL user (SLUICE_REDIS_CLUSTER=1
// SLUICE_REDIS_SECURE=1 scripts/redis.sh start), and passes the seeds the
// script printed as SLUICE_E2E_REDIS_CLUSTER. The workers reach it as a
// managed cluster asks: --redis-cluster, the seeds, the ACL user, TLS
// with the test CA.

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/sinkwire"
)

// redisCluster is the test cluster and how to administer it.
type redisCluster struct {
	seeds string // host:port,...
	vars  []string
	admin *redis.ClusterClient // the default user, for CLUSTER FAILOVER
	tls   *tls.Config
	pass  string // the default user's password
}

func testCluster(t *testing.T) redisCluster {
	t.Helper()
	seeds := os.Getenv("SLUICE_E2E_REDIS_CLUSTER")
	require.NotEmpty(t, seeds, "SLUICE_E2E_REDIS_CLUSTER: the seeds SLUICE_REDIS_CLUSTER=1 SLUICE_REDIS_SECURE=1 scripts/redis.sh start prints (make e2e sets it)")
	s := secured(t)
	ca, err := filepath.Abs(filepath.Join(s.redisTLSDir, "ca.pem"))
	require.NoError(t, err)
	pem, err := os.ReadFile(ca)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pem))
	cache := cmp.Or(os.Getenv("SLUICE_CACHE"), ".cache")
	if !filepath.IsAbs(cache) {
		cache = filepath.Join("..", cache)
	}
	first := strings.Split(seeds, ",")[0]
	admin, err := os.ReadFile(filepath.Join(cache, "redis", "cluster-"+portOf(t, first), "admin"))
	require.NoError(t, err, "the cluster's admin password (scripts/redis.sh keeps it)")
	c := redisCluster{
		seeds: seeds,
		vars: []string{"SLUICE_REDIS_CLUSTER=1", "SLUICE_REDIS_USERNAME=" + s.redisUser, "SLUICE_REDIS_PASSWORD=" + s.redisPassword,
			"SLUICE_REDIS_TLS=1", "SLUICE_REDIS_CA_FILE=" + ca},
		tls:  &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		pass: strings.TrimSpace(string(admin)),
	}
	c.admin = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(seeds, ","), Password: c.pass, TLSConfig: c.tls})
	t.Cleanup(func() { _ = c.admin.Close() })
	return c
}

// env returns a test env whose sluice processes use the cluster.
func (c redisCluster) env(t *testing.T, capacity, partitions int) *env {
	e := newEnv(t, capacity, partitions, 15*time.Second)
	e.redis = c.seeds
	e.vars = append(e.vars, c.vars...)
	return e
}

func (c redisCluster) node(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Password: c.pass, TLSConfig: c.tls})
}

// failover makes the replica of the master serving key take over with
// CLUSTER FAILOVER and waits until the two have swapped roles and the new
// replica is in sync; it returns the two addresses and when the
// failover was asked for.
func (c redisCluster) failover(t *testing.T, key string) (from, to string, at time.Time, took time.Duration) {
	t.Helper()
	ctx := t.Context()
	master, err := c.admin.MasterForKey(ctx, key)
	require.NoError(t, err)
	from = master.Options().Addr
	id, err := master.ClusterMyID(ctx).Result()
	require.NoError(t, err)
	lines, err := master.Do(ctx, "CLUSTER", "REPLICAS", id).StringSlice()
	require.NoError(t, err)
	require.NotEmpty(t, lines, "the master %s has no replica", from)
	to, _, _ = strings.Cut(strings.Fields(lines[0])[1], "@")
	replica, old := c.node(to), c.node(from)
	defer replica.Close()
	defer old.Close()
	at = time.Now()
	require.NoError(t, replica.Do(ctx, "CLUSTER", "FAILOVER").Err())
	require.Eventually(t, func() bool {
		r1, err1 := replica.Do(ctx, "ROLE").Slice()
		r2, err2 := old.Do(ctx, "ROLE").Slice()
		return err1 == nil && err2 == nil && r1[0] == "master" && r2[0] == "slave" && len(r2) > 3 && r2[3] == "connected"
	}, 20*time.Second, 5*time.Millisecond, "%s did not take over from %s", to, from)
	return from, to, at, time.Since(at)
}

// poolKey is the pool's definition key: on a cluster its name is the hash
// tag of every key of the pool.
func poolKey(e *env) string { return "sluice:{" + e.name + "}:def" }

// TestRedisClusterBulkLoad: the USGS file bulk-loaded while three workers
// drain it, every lease on the cluster: every record once, no sliding
// second over capacity at the sink, the pool's keys under its hash tag.
func TestRedisClusterBulkLoad(t *testing.T) {
	c := testCluster(t)
	e := c.env(t, 1000, 24)
	for i := range 3 {
		e.worker(fmt.Sprintf("w%d", i+1), "--redis-cluster")
	}
	e.awaitGroup(3)
	code, out := e.run(3*time.Minute, append(append([]string{"bulk-load", "--workers", "0"}, e.common()...), usgs)...)
	require.Equal(t, 0, code, out)

	st := e.awaitAccepted(usgsRecords, 30*time.Second)
	e.report(st)
	require.EqualValues(t, usgsRecords, st.Accepted, "every record at the sink")
	require.Zero(t, st.Duplicates, "every record exactly once")
	require.Zero(t, st.Throttled)
	n, err := c.admin.Exists(t.Context(), poolKey(e)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the pool's definition is stored under its hash tag")
	require.Len(t, e.pool().Members, 3, "pool status reads the cluster's members")
}

// TestRedisClusterFailover: a coordinated failover of the master holding
// the pool (CLUSTER FAILOVER on its replica) while three workers drain
// the USGS file. The failover loses no acknowledged write, so the bound
// for it is the one without faults: no sliding second over capacity at
// the sink beyond the 1 % of send-to-accept jitter; and 0 records lost.
func TestRedisClusterFailover(t *testing.T) {
	c := testCluster(t)
	e := c.env(t, 1000, 24)
	ws := []*proc{e.worker("w1", "--redis-cluster"), e.worker("w2", "--redis-cluster"), e.worker("w3", "--redis-cluster")}
	e.awaitGroup(3)
	e.produce(0)
	e.awaitAccepted(int64(2*e.capacity), 30*time.Second)

	from, to, at, took := c.failover(t, poolKey(e))
	during := e.stats().Accepted
	t.Logf("failover of the pool's master %s to %s took %v, with %d of %d records stored", from, to, took.Round(time.Millisecond), during, usgsRecords)
	require.Less(t, during, int64(usgsRecords-2*e.capacity), "the load must go on for a while after the failover")

	st := e.awaitAccepted(usgsRecords, 2*time.Minute)
	e.report(st)
	require.EqualValues(t, usgsRecords, st.Accepted, "0 records lost")
	for _, w := range ws {
		select {
		case <-w.done:
			t.Fatalf("%s exited (code %d) during the failover", w.name, w.code)
		default:
		}
	}
	busiest, least := secondsAround(st, at.Add(-time.Second), at.Add(3*time.Second))
	t.Logf("around the failover (1 s before to 3 s after): busiest second %d, least %d records (capacity %d); overshoot %.1f %%",
		busiest, least, e.capacity, 100*(float64(st.MaxUnits1s)/float64(e.capacity)-1))
	require.LessOrEqual(t, float64(busiest), 1.01*float64(e.capacity))
	// The new master serves the pool's slot (a replica would answer
	// MOVED) and holds its definition.
	newMaster := c.node(to)
	defer newMaster.Close()
	n, err := newMaster.Exists(t.Context(), poolKey(e)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Len(t, e.pool().Members, 3, "the three workers are still members, on the new master")
}

// secondsAround returns the most and the fewest units the sink took in
// any second (five consecutive 200 ms buckets) that starts within [from,
// to).
func secondsAround(st sinkwire.Stats, from, to time.Time) (most, least int64) {
	least = -1
	b := st.UnitsPer200ms
	for i := range b {
		start := st.SeriesStart.Add(time.Duration(i) * 200 * time.Millisecond)
		if start.Before(from) || !start.Before(to) || i+5 > len(b) {
			continue
		}
		var sum int64
		for _, u := range b[i : i+5] {
			sum += u
		}
		most = max(most, sum)
		if least < 0 || sum < least {
			least = sum
		}
	}
	return most, least
}

// TestRedisClusterRefusesWrongCredentials: a wrong password or an
// untrusted server certificate fails at start-up, naming the cluster's
// seeds and the mechanism, never printing the password.
func TestRedisClusterRefusesWrongCredentials(t *testing.T) {
	c := testCluster(t)
	e := c.env(t, 1000, 10)
	const wrong = "not-the-cluster-password-7d2"
	seeds := "redis cluster rediss://sluice@" + c.seeds + ": "
	var noCA []string
	for _, v := range c.vars {
		if !strings.HasPrefix(v, "SLUICE_REDIS_CA_FILE=") {
			noCA = append(noCA, v)
		}
	}
	for _, tc := range []struct {
		name string
		vars []string
		want []string
	}{
		{"wrong password", append(append([]string(nil), c.vars...), "SLUICE_REDIS_PASSWORD="+wrong), []string{seeds + "authentication failed", "WRONGPASS"}},
		{"untrusted server", noCA, []string{seeds + "TLS handshake failed", "certificate signed by unknown authority"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.vars = tc.vars
			start := time.Now()
			code, out := e.run(20*time.Second, "pool", "status", "--redis-addr", c.seeds, "--pool", e.name)
			took := time.Since(start)
			t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(out))
			require.Equal(t, 1, code)
			require.Less(t, took, failFast)
			for _, w := range tc.want {
				require.Contains(t, out, w)
			}
			require.NotContains(t, out, wrong)
		})
	}
}
