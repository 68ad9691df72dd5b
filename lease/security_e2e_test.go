//go:build e2e

// These tests need the secured Redis and its Sentinel, started with
//
//	SLUICE_REDIS_SECURE=1 scripts/redis.sh start
//
// and read the same variables as that script, with the same defaults:
// SLUICE_REDIS_PORT (16379; TLS on port + 1 and the Sentinel on port + 2
// unless SLUICE_REDIS_TLS_PORT and SLUICE_REDIS_SENTINEL_PORT say
// otherwise), SLUICE_REDIS_SENTINEL_MASTER (sluice), SLUICE_REDIS_USERNAME
// (sluice), SLUICE_REDIS_PASSWORD (sluice-test-password) and SLUICE_CACHE
// (the repository's .cache), where the script leaves the certificates. Run
// them with
//
//	go test -tags e2e -run Secure ./lease/

package lease

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// secureRedis is where the secured Redis listens and what it accepts.
type secureRedis struct {
	plain, tls, sentinel string // "127.0.0.1:port"
	master               string
	user, password       string
	tlsDir               string // ca.pem, client.crt, client.key
	admin                string // the file holding the default user's password
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func secureRedisEnv(t *testing.T) secureRedis {
	t.Helper()
	port, err := strconv.Atoi(envOr("SLUICE_REDIS_PORT", "16379"))
	require.NoError(t, err, "SLUICE_REDIS_PORT")
	addr := func(name string, offset int) string {
		return "127.0.0.1:" + envOr(name, strconv.Itoa(port+offset))
	}
	cache := envOr("SLUICE_CACHE", ".cache")
	if !filepath.IsAbs(cache) {
		cache = filepath.Join("..", cache) // the tests run in lease/
	}
	r := secureRedis{
		plain:    addr("SLUICE_REDIS_PORT", 0),
		tls:      addr("SLUICE_REDIS_TLS_PORT", 1),
		sentinel: addr("SLUICE_REDIS_SENTINEL_PORT", 2),
		master:   envOr("SLUICE_REDIS_SENTINEL_MASTER", "sluice"),
		user:     envOr("SLUICE_REDIS_USERNAME", "sluice"),
		password: envOr("SLUICE_REDIS_PASSWORD", "sluice-test-password"),
		tlsDir:   filepath.Join(cache, "redis", "tls"),
		admin:    filepath.Join(cache, "redis", "redis-"+strconv.Itoa(port)+".admin"),
	}
	_, err = os.Stat(r.file("ca.pem"))
	require.NoError(t, err, "no test CA: start Redis with SLUICE_REDIS_SECURE=1 scripts/redis.sh start")
	return r
}

func (r secureRedis) file(name string) string { return filepath.Join(r.tlsDir, name) }

// TestSecureChangeFeed: under the ACL user, which has the pools' channels,
// a worker learns of a peer's demand at once from the change feed; a user
// without channel rights (the ACL of earlier versions) still shares the
// pool, learning of it at its next keep-alive.
func TestSecureChangeFeed(t *testing.T) {
	r := secureRedisEnv(t)
	adminPassword, err := os.ReadFile(r.admin)
	require.NoError(t, err, "the default user's password (scripts/redis.sh keeps it)")
	admin := redis.NewClient(&redis.Options{Addr: r.plain, Password: strings.TrimSpace(string(adminPassword))})
	t.Cleanup(func() { _ = admin.Close() })
	const oldUser, oldPassword = "sluice-no-channels", "sluice-no-channels-password"
	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", oldUser, "reset", "on", ">"+oldPassword, "~sluice:*", "resetchannels",
		"-@all", "+@read", "+@write", "+@scripting", "+@transaction", "+@connection", "-@dangerous").Err())
	t.Cleanup(func() { _ = admin.Do(context.Background(), "ACL", "DELUSER", oldUser).Err() })

	for _, tc := range []struct {
		name, user, password string
		within               time.Duration
	}{
		{"ACL user with the channels", r.user, r.password, time.Second},
		{"user without channel rights", oldUser, oldPassword, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			client := func() redis.UniversalClient {
				return newRedisClients(t, RedisConfig{Addrs: []string{r.plain}, Username: tc.user, Password: tc.password})[0]
			}
			prefix := securePrefix(t)
			pool := Pool{Name: "feed", Capacity: 1000, Partitions: 10}
			a := start(t, Config{Pool: pool, Prefix: prefix, WorkerID: "a", Tick: 50 * time.Millisecond}, client())
			b := start(t, Config{Pool: pool, Prefix: prefix, WorkerID: "b", Tick: 50 * time.Millisecond}, client())
			a.SetDemand(ingest.Inf)
			poll(t, func() bool { return len(a.Held()) == 10 }, "a takes the pool")
			t0 := time.Now()
			b.SetDemand(ingest.Inf)
			require.Eventually(t, func() bool { return len(a.Held()) == 5 && len(b.Held()) == 5 }, tc.within, 2*time.Millisecond,
				"split within %v (keep-alive %v)", tc.within, a.cfg.KeepAlive)
			t.Logf("%s: split after %v", tc.name, time.Since(t0))
		})
	}
}

// securePrefix is a key prefix of the test's own inside the ACL user's
// key pattern (sluice:*).
func securePrefix(t *testing.T) string { return "sluice:" + uniquePrefix(t) }

func newRedisClients(t *testing.T, cfg RedisConfig) []redis.UniversalClient {
	t.Helper()
	clients, err := OpenRedis(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range clients {
			_ = c.Close()
		}
	})
	return clients
}

// TestSecureManagerAcquires runs a lease Manager through each way of
// connecting: it must take the whole pool, show in Status, and release
// every lease on stop.
func TestSecureManagerAcquires(t *testing.T) {
	r := secureRedisEnv(t)
	cases := []struct {
		name string
		cfg  RedisConfig
	}{
		{"ACL user, host:port", RedisConfig{Addrs: []string{r.plain}, Username: r.user, Password: r.password}},
		{"ACL user in a redis:// URL, password apart", RedisConfig{Addrs: []string{"redis://" + r.user + "@" + r.plain + "/0"}, Password: r.password}},
		{"ACL user and password in a redis:// URL", RedisConfig{Addrs: []string{"redis://" + r.user + ":" + r.password + "@" + r.plain}, Password: "not-used"}},
		{"rediss:// with the test CA", RedisConfig{Addrs: []string{"rediss://" + r.user + "@" + r.tls}, Password: r.password, CAFile: r.file("ca.pem")}},
		{"rediss:// by name with a client certificate", RedisConfig{
			Addrs: []string{"rediss://" + r.user + "@localhost:" + portOf(t, r.tls)}, Password: r.password,
			CAFile: r.file("ca.pem"), CertFile: r.file("client.crt"), KeyFile: r.file("client.key"),
		}},
		{"TLS for host:port", RedisConfig{Addrs: []string{r.tls}, Username: r.user, Password: r.password, TLS: true, CAFile: r.file("ca.pem")}},
		{"Sentinel", RedisConfig{SentinelMaster: r.master, SentinelAddrs: []string{r.sentinel}, Username: r.user, Password: r.password}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clients := newRedisClients(t, tc.cfg)
			require.Len(t, clients, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, PingRedis(ctx, clients...))

			prefix := securePrefix(t)
			pool := Pool{Name: "secure", Capacity: 300, Partitions: 3, TTL: 1500 * time.Millisecond}
			mustEnsurePool(t, clients[0], prefix, pool)
			m := start(t, testConfig(prefix, "w1", pool), clients...)
			m.SetDemand(ingest.Inf)
			poll(t, func() bool { return m.Rate(time.Now()) == 300 }, "the worker takes the whole pool")
			require.Len(t, m.Held(), 3)

			st, err := Status(ctx, clients[0], prefix, "secure")
			require.NoError(t, err)
			require.Len(t, st.Members, 1)
			held := 0
			for _, p := range st.Partitions {
				if p.Holder == "w1" {
					held++
				}
			}
			require.Equal(t, 3, held, "status shows the leases: %+v", st.Partitions)

			m.stop(t)
			k := keysFor(prefix, "secure")
			for i := range 3 {
				err := clients[0].Get(ctx, k.partition(i)).Err()
				require.ErrorIs(t, err, redis.Nil, "partition %d released on stop", i)
			}
		})
	}
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return port
}

// TestSecureRedisFailures: a wrong password, a refused key and an
// unverifiable certificate fail within seconds, naming the address and
// never the password.
func TestSecureRedisFailures(t *testing.T) {
	r := secureRedisEnv(t)
	const wrong = "not-the-password-x7"
	cases := []struct {
		name string
		cfg  RedisConfig
		want []string
	}{
		{"wrong password, host:port", RedisConfig{Addrs: []string{r.plain}, Username: r.user, Password: wrong},
			[]string{"redis redis://" + r.user + "@" + r.plain + "/0: authentication failed"}},
		{"wrong password in a URL", RedisConfig{Addrs: []string{"rediss://" + r.user + ":" + wrong + "@" + r.tls}, CAFile: r.file("ca.pem")},
			[]string{"redis rediss://" + r.user + "@" + r.tls + "/0: authentication failed"}},
		{"no password", RedisConfig{Addrs: []string{r.plain}},
			[]string{"redis redis://" + r.plain + "/0: authentication failed", "NOAUTH"}},
		{"wrong password via Sentinel", RedisConfig{SentinelMaster: r.master, SentinelAddrs: []string{r.sentinel}, Username: r.user, Password: wrong},
			[]string{`redis sentinel master "` + r.master + `" via ` + r.sentinel + ` (user "` + r.user + `"): authentication failed`}},
		{"unknown CA", RedisConfig{Addrs: []string{"rediss://" + r.user + "@" + r.tls}, Password: r.password},
			[]string{"redis rediss://" + r.user + "@" + r.tls + "/0: TLS handshake failed", "certificate"}},
		{"unknown Sentinel master", RedisConfig{SentinelMaster: "no-such-master", SentinelAddrs: []string{r.sentinel}, Username: r.user, Password: r.password},
			[]string{`redis sentinel master "no-such-master" via ` + r.sentinel, `no Sentinel names a master "no-such-master"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clients := newRedisClients(t, tc.cfg)
			begin := time.Now()
			err := PingRedis(context.Background(), clients...)
			require.Less(t, time.Since(begin), 6*time.Second)
			var re *RedisError
			require.ErrorAs(t, err, &re)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), wrong)
			require.NotContains(t, err.Error(), r.password)
			t.Log(err)
		})
	}

	t.Run("key outside the ACL user's pattern", func(t *testing.T) {
		t.Parallel()
		clients := newRedisClients(t, RedisConfig{Addrs: []string{r.plain}, Username: r.user, Password: r.password})
		_, err := EnsurePool(context.Background(), clients[0], "other-"+uniquePrefix(t), Pool{Name: "p", Capacity: 10, Partitions: 1})
		require.Error(t, err)
		require.True(t, redis.IsPermissionError(err), "%v", err)
		require.Contains(t, (&RedisError{Addr: r.plain, Err: err}).Error(), "permission denied")
	})

	t.Run("a quorum answers", func(t *testing.T) {
		t.Parallel()
		// Two masters answer, a third is down: a lease quorum (2 of 3)
		// still works, so the check passes; a wrong password on any is a
		// mistake and fails it.
		down := closedPort(t)
		ok := newRedisClients(t, RedisConfig{Addrs: []string{r.plain, "redis://" + r.plain, down}, Username: r.user, Password: r.password})
		require.NoError(t, PingRedis(context.Background(), ok...))
		twoDown := newRedisClients(t, RedisConfig{Addrs: []string{r.plain, down, closedPort(t)}, Username: r.user, Password: r.password})
		err := PingRedis(context.Background(), twoDown...)
		require.ErrorContains(t, err, "redis redis://"+r.user+"@"+down+"/0: ")
		bad := newRedisClients(t, RedisConfig{Addrs: []string{r.plain, "redis://" + r.user + ":" + wrong + "@" + r.plain, r.plain},
			Username: r.user, Password: r.password})
		err = PingRedis(context.Background(), bad...)
		require.ErrorContains(t, err, "authentication failed")
		require.NotContains(t, err.Error(), wrong)
	})
}

// closedPort returns a loopback "host:port" nobody listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
