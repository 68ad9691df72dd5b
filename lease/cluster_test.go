package lease

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// The Redis Cluster the cluster tests share: SLUICE_TEST_REDIS_CLUSTER
// (seed addresses, comma-separated), or 3 masters and 3 replicas that the
// tests start with scripts/redis.sh (SLUICE_REDIS_CLUSTER=1) on free
// loopback ports, in a cache folder of their own, and stop when the
// package's tests end.
var (
	clusterOnce  sync.Once
	clusterSeeds []string
	clusterErr   error
	clusterEnv   []string // the environment the script started it with; nil if not started here
	clusterDir   string
)

// realCluster returns the seeds of a real Redis Cluster, failing the test
// (never skipping) when none can be started.
func realCluster(t testing.TB) []string {
	t.Helper()
	clusterOnce.Do(func() {
		if seeds := os.Getenv("SLUICE_TEST_REDIS_CLUSTER"); seeds != "" {
			clusterSeeds = strings.Split(seeds, ",")
			return
		}
		clusterSeeds, clusterErr = startRedisCluster()
	})
	require.NoError(t, clusterErr)
	return clusterSeeds
}

func startRedisCluster() ([]string, error) {
	base, err := freeClusterPorts()
	if err != nil {
		return nil, err
	}
	if clusterDir, err = os.MkdirTemp("", "sluice-lease-cluster-"); err != nil {
		return nil, err
	}
	clusterEnv = append(os.Environ(), "SLUICE_REDIS_CLUSTER=1", "SLUICE_REDIS_CLUSTER_PORT="+strconv.Itoa(base),
		"SLUICE_CACHE="+clusterDir, "SLUICE_REDIS_SECURE=0")
	cmd := exec.Command(filepath.Join("..", "scripts", "redis.sh"), "start")
	cmd.Env = clusterEnv
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("SLUICE_REDIS_CLUSTER=1 scripts/redis.sh start (ports %d-%d): %w\n%s", base, base+5, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Split(lines[len(lines)-1], ","), nil
}

func stopRedisCluster() {
	if clusterEnv == nil {
		return
	}
	cmd := exec.Command(filepath.Join("..", "scripts", "redis.sh"), "stop")
	cmd.Env = clusterEnv
	_ = cmd.Run()
	_ = os.RemoveAll(clusterDir)
}

// freeClusterPorts finds six consecutive free loopback ports whose cluster
// buses (+ 10000) are free too, below the kernel's ephemeral range.
func freeClusterPorts() (int, error) {
	free := func(port int) bool {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return false
		}
		_ = l.Close()
		return true
	}
	for range 100 {
		base := 21000 + rand.IntN(1700)
		ok := true
		for p := base; p < base+6 && ok; p++ {
			ok = free(p) && free(p+10000)
		}
		if ok {
			return base, nil
		}
	}
	return 0, fmt.Errorf("no six free ports (and their cluster buses) between 21000 and 22705")
}

// clusterClient opens a cluster client on the test cluster the way a
// worker does (OpenRedis with Cluster), with cfg's credentials.
func clusterClient(t testing.TB, cfg RedisConfig) *redis.ClusterClient {
	t.Helper()
	cfg.Addrs, cfg.Cluster = realCluster(t), true
	clients, err := OpenRedis(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = clients[0].Close() })
	require.Len(t, clients, 1)
	return clients[0].(*redis.ClusterClient)
}

// clusterPool returns a cluster client and a key prefix of the test's own,
// with pool created under it.
func clusterPool(t *testing.T, pool Pool) (*redis.ClusterClient, string) {
	t.Helper()
	c := clusterClient(t, RedisConfig{})
	prefix := uniquePrefix(t)
	mustEnsurePool(t, c, prefix, pool)
	return c, prefix
}

// roleOf returns a node's role ("master" or "slave") and, for a replica,
// its link state ("connected" once in sync).
func roleOf(ctx context.Context, c *redis.Client) (role, link string, err error) {
	v, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return "", "", err
	}
	role, _ = v[0].(string)
	if role == "slave" && len(v) > 3 {
		link, _ = v[3].(string)
	}
	return role, link, nil
}

// failover makes the replica of the master serving key's slot take over
// with CLUSTER FAILOVER (the coordinated, lossless kind) and waits until
// the two have swapped roles and the new replica is in sync. It returns
// the old and the new master's addresses and how long the swap took.
func failover(t *testing.T, admin *redis.ClusterClient, key string) (from, to string, took time.Duration) {
	t.Helper()
	ctx := t.Context()
	master, err := admin.MasterForKey(ctx, key)
	require.NoError(t, err)
	from = master.Options().Addr
	id, err := master.ClusterMyID(ctx).Result()
	require.NoError(t, err)
	lines, err := master.Do(ctx, "CLUSTER", "REPLICAS", id).StringSlice()
	require.NoError(t, err)
	require.NotEmpty(t, lines, "the master %s of %s has no replica", from, key)
	addr, _, _ := strings.Cut(strings.Fields(lines[0])[1], "@")
	replica := redis.NewClient(&redis.Options{Addr: addr})
	defer replica.Close()
	old := redis.NewClient(&redis.Options{Addr: from})
	defer old.Close()

	start := time.Now()
	require.NoError(t, replica.Do(ctx, "CLUSTER", "FAILOVER").Err())
	require.Eventually(t, func() bool {
		r1, _, err1 := roleOf(ctx, replica)
		r2, link, err2 := roleOf(ctx, old)
		return err1 == nil && err2 == nil && r1 == "master" && r2 == "slave" && link == "connected"
	}, 20*time.Second, 5*time.Millisecond, "%s did not take over from %s", addr, from)
	return from, addr, time.Since(start)
}

// cmdLog records the arguments of every command a cluster client's nodes
// run, and the errors that name a slot problem.
type cmdLog struct {
	mu       sync.Mutex
	cmds     [][]any
	slotErrs []string
}

func (l *cmdLog) record(cmds ...redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cmds {
		l.cmds = append(l.cmds, append([]any(nil), c.Args()...))
		if err := c.Err(); err != nil && (strings.Contains(err.Error(), "CROSSSLOT") || strings.Contains(err.Error(), "same slot")) {
			l.slotErrs = append(l.slotErrs, fmt.Sprint(c.Args()...)+": "+err.Error())
		}
	}
}

func (l *cmdLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		l.record(cmd)
		return err
	}
}

func (l *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		l.record(cmds...)
		return err
	}
}

// TestClusterKeysShareOneSlot is the slot audit: every command a pool's
// workers, EnsurePool, SetPool and Status send on a cluster (scripts,
// MGET, the definition's transaction, the ramp epoch, reclaiming, expiry
// reads, announcements, releases) is recorded at the nodes, and every key
// any of them touches hashes to the one slot of the pool's tag. The
// multi-key kinds must each have been seen, so a path left unexercised
// fails the test instead of passing it unchecked.
func TestClusterKeysShareOneSlot(t *testing.T) {
	t.Parallel()
	var log cmdLog
	c := clusterClient(t, RedisConfig{})
	c.OnNewNode(func(n *redis.Client) { n.AddHook(&log) })
	ctx := t.Context()
	prefix := uniquePrefix(t)
	pool := Pool{Name: "audit", Capacity: 800, Partitions: 8, TTL: 1500 * time.Millisecond,
		Ramp: Ramp{Start: 400, Factor: 2, Period: time.Second, IdleReset: time.Minute}}
	mustEnsurePool(t, c, prefix, pool)
	k := keysOn(c, prefix, pool.Name)
	require.Equal(t, prefix+":{audit}:p:3", k.partition(3))

	// A crashed run of worker "a" left partition 0 held; a vanished
	// worker holds the others for a moment.
	require.NoError(t, c.Set(ctx, k.partition(0), "a/old-token", time.Hour).Err())
	for p := 1; p < pool.Partitions; p++ {
		require.NoError(t, c.Set(ctx, k.partition(p), "gone/token", 800*time.Millisecond).Err())
	}
	a := start(t, testConfig(prefix, "a", pool), c)
	a.SetDemand(ingest.Inf)
	poll(t, func() bool { return len(a.Held()) == pool.Partitions }, "a takes back its own lease, then the vanished worker's")
	b := start(t, testConfig(prefix, "b", pool), c)
	b.SetDemand(ingest.Inf)
	poll(t, func() bool { return len(a.Held()) == 4 && len(b.Held()) == 4 }, "a and b share the pool")
	_, err := SetPool(ctx, c, prefix, pool.Name, 600, 6, time.Second, time.Now())
	require.NoError(t, err)
	poll(t, func() bool { return len(a.Held())+len(b.Held()) == 6 }, "the live change applies")
	b.SetDemand(0)
	poll(t, func() bool { return len(b.Held()) == 0 && len(a.Held()) == 6 }, "b releases, a takes its partitions")
	st, err := Status(ctx, c, prefix, pool.Name)
	require.NoError(t, err)
	require.Len(t, st.Members, 2)
	a.stop(t)
	b.stop(t)

	log.mu.Lock()
	cmds := log.cmds
	require.Empty(t, log.slotErrs)
	log.mu.Unlock()

	// Ask the cluster which keys each command touches and their slots.
	tag := prefix + ":{" + pool.Name + "}:"
	want, err := c.ClusterKeySlot(ctx, tag).Result()
	require.NoError(t, err)
	seen := map[string]bool{}
	multi := map[string]bool{}
	names := map[string]bool{}
	for _, args := range cmds {
		name := strings.ToLower(fmt.Sprint(args[0]))
		names[name] = true
		if name == "multi" || name == "exec" {
			multi[name] = true
			continue
		}
		keys, err := c.CommandGetKeys(ctx, args...).Result()
		if err != nil {
			continue // no key arguments: PING, CLUSTER SLOTS, PUBLISH, ...
		}
		ours := 0
		for _, key := range keys {
			if !strings.HasPrefix(key, prefix) {
				continue
			}
			ours++
			require.True(t, strings.HasPrefix(key, tag), "%s touches %s, outside the pool's tag", name, key)
			slot, err := c.ClusterKeySlot(ctx, key).Result()
			require.NoError(t, err)
			require.Equal(t, want, slot, "%s touches %s in another slot", name, key)
			kind := strings.TrimPrefix(key, tag)
			if strings.HasPrefix(kind, "p:") {
				kind = "p"
			}
			seen[kind] = true
		}
		if ours > 1 {
			multi[name] = true
		}
	}
	t.Logf("%d commands; keys seen %v; multi-key commands %v; slot %d", len(cmds), seen, multi, want)
	for _, kind := range []string{"def", "dver", "ramp", "p", "live", "ann", "mver"} {
		require.True(t, seen[kind], "no command touched the %s key", kind)
	}
	for _, name := range []string{"evalsha", "mget", "multi", "exec"} {
		require.True(t, multi[name], "no multi-key %s was seen", name)
	}
	for _, name := range []string{"watch", "pttl", "publish", "set", "get"} {
		require.True(t, names[name], "no %s was seen", name)
	}
}

// feed subscribes to a pool's change channel as a Manager does, on the
// same cluster client; next returns the next message's payload.
func feed(t *testing.T, c *redis.ClusterClient, k keys) (next func(within time.Duration) (string, bool)) {
	t.Helper()
	ps := c.Subscribe(t.Context(), k.changes())
	t.Cleanup(func() { _ = ps.Close() })
	_, err := ps.Receive(t.Context()) // the subscription's confirmation
	require.NoError(t, err)
	ch := ps.Channel()
	return func(within time.Duration) (string, bool) {
		select {
		case msg := <-ch:
			return msg.Payload, true
		case <-time.After(within):
			return "", false
		}
	}
}

// awaitMessage waits, at most within, for payload on the feed.
func awaitMessage(t *testing.T, next func(time.Duration) (string, bool), payload string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got, ok := next(time.Until(deadline))
		require.True(t, ok, "no %q on the change feed within %v", payload, within)
		if got == payload {
			return
		}
	}
}

// TestClusterWorkersShareThePool: three workers on a cluster share the
// pool, never count a partition twice, and learn of a peer's demand from
// the change feed (classic pub/sub across the cluster) well before their
// next keep-alive (1.7 s with the 15 s TTL).
func TestClusterWorkersShareThePool(t *testing.T) {
	t.Parallel()
	pool := Pool{Name: "share", Capacity: 1200, Partitions: 12, TTL: 15 * time.Second}
	c, prefix := clusterPool(t, pool)
	k := keysOn(c, prefix, pool.Name)
	next := feed(t, c, k)
	a := start(t, testConfig(prefix, "a", pool), c)
	b := start(t, testConfig(prefix, "b", pool), c)
	w := start(t, testConfig(prefix, "c", pool), c)
	stop := watchExclusive(t, c, k, a, b, w)
	t0 := time.Now()
	a.SetDemand(ingest.Inf)
	poll(t, func() bool { return len(a.Held()) == 12 }, "a takes the pool")
	split := time.Now()
	b.SetDemand(ingest.Inf)
	w.SetDemand(ingest.Inf)
	awaitMessage(t, next, "m b", time.Second)
	require.Eventually(t, func() bool { return len(a.Held()) == 4 && len(b.Held()) == 4 && len(w.Held()) == 4 }, time.Second, 2*time.Millisecond,
		"split three ways within 1 s (keep-alive %v)", a.cfg.KeepAlive)
	t.Logf("split after %v (keep-alive %v)", time.Since(split), a.cfg.KeepAlive)
	require.NoError(t, stop())
	requireCreditWithinCapacity(t, pool.Capacity, t0, time.Now(), time.Second, 10*time.Millisecond, a, b, w)
}

// TestClusterFailoverKeepsLeases: a coordinated failover of the master that
// holds the pool (CLUSTER FAILOVER on its replica) in the middle of three
// workers' run. No acknowledged write is lost, so no partition is ever
// counted by two workers, no second holds more than the capacity, the
// workers keep (or take back) the whole pool on the new master, and a
// subscription made before the failover still gets the change feed.
func TestClusterFailoverKeepsLeases(t *testing.T) {
	pool := Pool{Name: "failover", Capacity: 1200, Partitions: 12, TTL: 3 * time.Second}
	c, prefix := clusterPool(t, pool)
	k := keysOn(c, prefix, pool.Name)
	cfg := func(w string) Config {
		cfg := testConfig(prefix, w, pool)
		cfg.RequestTimeout = 500 * time.Millisecond
		return cfg
	}
	next := feed(t, c, k)
	a, b, w := start(t, cfg("a"), c), start(t, cfg("b"), c), start(t, cfg("c"), c)
	for _, m := range []*running{a, b, w} {
		m.SetDemand(ingest.Inf)
	}
	poll(t, func() bool { return len(a.Held())+len(b.Held())+len(w.Held()) == 12 }, "the pool is shared out")
	stop := watchExclusive(t, c, k, a, b, w)
	t0 := time.Now()
	events := func() (renewed, lost int64) {
		for _, m := range []*running{a, b, w} {
			e := m.Events()
			renewed, lost = renewed+e.Renewed, lost+e.Lost
		}
		return renewed, lost
	}
	renewed0, lost0 := events()

	from, to, took := failover(t, c, k.def())
	t.Logf("failover of the pool's master %s to %s took %v", from, to, took)

	// Two renewal intervals on the new master: every lease is extended
	// there.
	poll(t, func() bool { return time.Since(t0) > took+2*a.cfg.RenewEvery }, "time passes")
	poll(t, func() bool { return len(a.Held())+len(b.Held())+len(w.Held()) == 12 }, "the whole pool is held after the failover")
	renewed, lost := events()
	t.Logf("after the failover: %d extends, %d leases lost", renewed-renewed0, lost-lost0)
	require.GreaterOrEqual(t, renewed-renewed0, int64(12), "every lease was extended on the new master")
	require.NoError(t, stop())
	requireCreditWithinCapacity(t, pool.Capacity, t0.Add(-time.Second), time.Now(), time.Second, 10*time.Millisecond, a, b, w)
	// The new master serves the pool's slot (a replica would answer
	// MOVED) and holds its definition and every lease.
	newMaster := redis.NewClient(&redis.Options{Addr: to})
	defer newMaster.Close()
	n, err := newMaster.Exists(t.Context(), k.def()).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	for _, m := range []*running{a, b, w} {
		for _, p := range m.Held() {
			v, err := newMaster.Get(t.Context(), k.partition(p)).Result()
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(v, m.WorkerID()+"/"), "partition %d of %s is %q on the new master", p, m.WorkerID(), v)
		}
	}

	// The change feed after the failover: c leaves; its announcement,
	// published by a script on the new master, reaches the subscription
	// made before the failover, and a and b take c's partitions.
	w.SetDemand(0)
	awaitMessage(t, next, "m c", time.Second)
	require.Eventually(t, func() bool { return len(w.Held()) == 0 && len(a.Held())+len(b.Held()) == 12 }, time.Second, 2*time.Millisecond,
		"the others take c's partitions within 1 s of its release")
}

// TestClusterACL: an ACL user limited to sluice's keys and channels and
// the documented command groups, plus CLUSTER SLOTS (which a cluster
// client reads the slots with), runs a worker; without CLUSTER SLOTS the
// start-up check fails, naming the refusal.
func TestClusterACL(t *testing.T) {
	t.Parallel()
	admin := clusterClient(t, RedisConfig{})
	ctx := t.Context()
	user, limited := "sluice-"+randomHex(4), "sluice-noslots-"+randomHex(4)
	const password = "cluster-acl-password"
	rules := []any{"reset", "on", ">" + password, "~sluice:*", "resetchannels", "&sluice:*",
		"-@all", "+@read", "+@write", "+@scripting", "+@transaction", "+@connection", "+@pubsub", "-@dangerous"}
	// ACL SETUSER is per node: set it on every node the cluster knows
	// (CLUSTER NODES; the slots a client reads may leave out a node whose
	// new role after a failover has not spread yet).
	nodes, err := admin.ClusterNodes(ctx).Result()
	require.NoError(t, err)
	var addrs []string
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		addr, _, _ := strings.Cut(strings.Fields(line)[1], "@")
		addrs = append(addrs, addr)
	}
	require.GreaterOrEqual(t, len(addrs), 6, "3 masters and 3 replicas")
	each := func(ctx context.Context, args ...any) error {
		for _, addr := range addrs {
			n := redis.NewClient(&redis.Options{Addr: addr})
			err := n.Do(ctx, args...).Err()
			_ = n.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", addr, err)
			}
		}
		return nil
	}
	require.NoError(t, each(ctx, append([]any{"ACL", "SETUSER", user}, append(rules, "+cluster|slots")...)...))
	require.NoError(t, each(ctx, append([]any{"ACL", "SETUSER", limited}, rules...)...))
	t.Cleanup(func() { _ = each(context.Background(), "ACL", "DELUSER", user, limited) })

	err = PingRedis(ctx, clusterClient(t, RedisConfig{Username: limited, Password: password}))
	require.ErrorContains(t, err, "permission denied")
	require.ErrorContains(t, err, "cluster|slots")
	require.ErrorContains(t, err, "redis cluster redis://"+limited+"@")
	require.NotContains(t, err.Error(), password)

	c := clusterClient(t, RedisConfig{Username: user, Password: password})
	require.NoError(t, PingRedis(ctx, c))
	prefix := "sluice:" + uniquePrefix(t)
	pool := Pool{Name: "acl", Capacity: 400, Partitions: 4}
	mustEnsurePool(t, c, prefix, pool)
	a := start(t, testConfig(prefix, "a", pool), c)
	b := start(t, testConfig(prefix, "b", pool), c)
	a.SetDemand(ingest.Inf)
	poll(t, func() bool { return len(a.Held()) == 4 }, "a takes the pool as the ACL user")
	b.SetDemand(ingest.Inf)
	require.Eventually(t, func() bool { return len(a.Held()) == 2 && len(b.Held()) == 2 }, time.Second, 2*time.Millisecond,
		"the change feed reaches the ACL user")
	st, err := Status(ctx, c, prefix, pool.Name)
	require.NoError(t, err)
	require.Len(t, st.Members, 2)
}

// TestClusterConfig checks what OpenRedis builds for a cluster and what it
// refuses, without a server.
func TestClusterConfig(t *testing.T) {
	t.Parallel()
	cert, key := writeCert(t, t.TempDir())
	for _, tc := range []struct {
		name string
		cfg  RedisConfig
		want string
	}{
		{"database", RedisConfig{Addrs: []string{"h:1"}, DB: 2}, "database 2: a Redis Cluster has database 0 only"},
		{"URL database", RedisConfig{Addrs: []string{"h:1", "redis://u:" + secret + "@h:2/3"}}, "seed 2 of 2 (redis://u:xxxxx@h:2/3): database 3"},
		{"users differ", RedisConfig{Addrs: []string{"redis://a@h:1", "redis://b:" + secret + "@h:2"}}, "seed 2 of 2 (redis://b:xxxxx@h:2): the seed nodes of one cluster need the same user, password and TLS"},
		{"TLS differs", RedisConfig{Addrs: []string{"rediss://h:1", "redis://h:2"}}, "seed 2 of 2"},
		{"Sentinel", RedisConfig{SentinelMaster: "m", SentinelAddrs: []string{"s:1"}}, "a Redis Cluster or Sentinel, not both"},
		{"no port", RedisConfig{Addrs: []string{"h"}}, `seed 1 of 1 (h): want "host:port"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Cluster = true
			_, err := OpenRedis(tc.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), secret)
		})
	}

	clients, err := OpenRedis(RedisConfig{Cluster: true, Addrs: []string{"rediss://sluice@n1:6379", " rediss://sluice@n2:6379"},
		Password: secret, CAFile: cert, CertFile: cert, KeyFile: key})
	require.NoError(t, err)
	closeAll(t, clients)
	require.Len(t, clients, 1)
	o := clients[0].(*redis.ClusterClient).Options()
	require.Equal(t, []string{"n1:6379", "n2:6379"}, o.Addrs)
	require.Equal(t, []string{"sluice", secret}, []string{o.Username, o.Password})
	require.NotNil(t, o.TLSConfig.RootCAs, "trusts the CA file")
	require.Len(t, o.TLSConfig.Certificates, 1, "sends the client certificate")
	require.Empty(t, o.TLSConfig.ServerName, "each node is verified against its own address, not the first seed's")
	require.Equal(t, "cluster rediss://sluice@n1:6379,n2:6379", describeClient(clients[0]))

	clients, err = OpenRedis(RedisConfig{Cluster: true, Addrs: []string{"n1:6379"}, TLS: true, ServerName: "cache.example.com", Username: "u", Password: secret})
	require.NoError(t, err)
	closeAll(t, clients)
	o = clients[0].(*redis.ClusterClient).Options()
	require.Equal(t, "cache.example.com", o.TLSConfig.ServerName)
	require.Equal(t, "u", o.Username)

	cfg := RedisConfig{Cluster: true, Addrs: []string{"n1:6379", "redis://u:" + secret + "@n2:6379"}, Password: secret}
	require.Equal(t, "redis cluster n1:6379,redis://u:xxxxx@n2:6379, password set", cfg.String())

	// A pool's keys on a cluster carry its hash tag; elsewhere they keep
	// the layout of earlier versions. Clusters and single servers cannot
	// be mixed.
	require.Equal(t, "sluice:{orders}:def", keysOn(clients[0], "", "orders").def())
	single := redis.NewClient(&redis.Options{Addr: "h:1"})
	defer single.Close()
	require.Equal(t, "sluice:orders:def", keysOn(single, "", "orders").def())
	_, err = New(Config{Pool: Pool{Name: "orders", Capacity: 10, Partitions: 1}, WorkerID: "w"}, clients[0], single)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "1 of 2 Redis clients are Redis Cluster clients")
}

// TestClusterRefusesASingleServer: --redis-cluster against a Redis that is
// not a cluster fails the start-up check with the server's own words.
func TestClusterRefusesASingleServer(t *testing.T) {
	t.Parallel()
	clients, err := OpenRedis(RedisConfig{Cluster: true, Addrs: []string{realRedis(t)}})
	require.NoError(t, err)
	closeAll(t, clients)
	err = PingRedis(t.Context(), clients...)
	require.ErrorContains(t, err, "redis cluster redis://"+realRedis(t)+": ")
	require.ErrorContains(t, err, "cluster support disabled")
}
