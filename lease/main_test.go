package lease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		stopRedisServer()
		stopRedisCluster()
		os.Exit(code)
	}))
}

// The real Redis the integration tests share: SLUICE_TEST_REDIS_ADDR, or a
// redis-server the tests start on a free loopback port.
var (
	redisOnce sync.Once
	redisAddr string
	redisErr  error
	redisCmd  *exec.Cmd
	redisDir  string
)

func stopRedisServer() {
	if redisCmd != nil && redisCmd.Process != nil {
		_ = redisCmd.Process.Kill()
		_ = redisCmd.Wait()
	}
	if redisDir != "" {
		_ = os.RemoveAll(redisDir)
	}
}

// realRedis returns the address of a real Redis, failing the test (never
// skipping) when none can be started.
func realRedis(t *testing.T) string {
	t.Helper()
	redisOnce.Do(func() {
		if addr := os.Getenv("SLUICE_TEST_REDIS_ADDR"); addr != "" {
			redisAddr = addr
			return
		}
		redisAddr, redisErr = startRedisServer()
	})
	require.NoError(t, redisErr)
	return redisAddr
}

func startRedisServer() (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server is not installed: install it (apt-get install -y redis-server, or scripts/redis.sh start) or set SLUICE_TEST_REDIS_ADDR to a Redis to use: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	if redisDir, err = os.MkdirTemp("", "sluice-lease-redis-"); err != nil {
		return "", err
	}
	log, err := os.Create(filepath.Join(redisDir, "redis.log"))
	if err != nil {
		return "", err
	}
	defer log.Close()
	redisCmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", redisDir)
	redisCmd.Stdout, redisCmd.Stderr = log, log
	if err := redisCmd.Start(); err != nil {
		return "", fmt.Errorf("start redis-server: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return addr, nil
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(redisDir, "redis.log"))
			return "", fmt.Errorf("redis-server on %s did not answer PING: %w\n%s", addr, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func newClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func uniquePrefix(t *testing.T) string {
	return "test-" + strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + "-" + randomHex(4)
}

// testConfig is a fast configuration: TTL as given (1.5 s by default), tick
// 50 ms, margin 150 + 50 + 2 ms + TTL/100.
func testConfig(prefix, worker string, pool Pool) Config {
	if pool.TTL == 0 {
		pool.TTL = 1500 * time.Millisecond
	}
	return Config{
		Pool:           pool,
		Prefix:         prefix,
		WorkerID:       worker,
		RequestTimeout: 150 * time.Millisecond,
		Slice:          50 * time.Millisecond,
		Tick:           50 * time.Millisecond,
	}
}

// running is a Manager whose Run loop the test owns.
type running struct {
	*Manager
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop cancels Run and waits for it to return (idempotent).
func (r *running) stop(t *testing.T) {
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of cancel")
		}
	})
}

func start(t *testing.T, cfg Config, clients ...redis.UniversalClient) *running {
	t.Helper()
	m, err := New(cfg, clients...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Manager: m, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// counting returns the leases that count at now, by partition.
func (m *Manager) counting(now time.Time) map[int]*held {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[int]*held{}
	for p, h := range m.held {
		if h.count.contains(now) {
			out[p] = h
		}
	}
	return out
}

// faultHook makes a client fail (every command errors) or hang (every
// command blocks until its context is done) on demand.
type faultHook struct{ mode atomic.Int32 }

const (
	healthy int32 = iota
	failing
	hanging
)

var errInjected = errors.New("injected Redis outage")

func (h *faultHook) fault(ctx context.Context) error {
	switch h.mode.Load() {
	case failing:
		return errInjected
	case hanging:
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.fault(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.fault(ctx); err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// watchExclusive checks, until stopped, that the managers never count the
// same partition at one instant and that every counted partition's key in
// Redis names its holder; it returns the first violation.
func watchExclusive(t *testing.T, c redis.UniversalClient, k keys, ms ...*running) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			for ctx.Err() == nil {
				now := time.Now()
				owner := map[int]string{}
				sets := make([]map[int]*held, len(ms))
				for i, m := range ms {
					sets[i] = m.counting(now)
					for p := range sets[i] {
						if o, ok := owner[p]; ok {
							return fmt.Errorf("partition %d counted by %s and %s at %v", p, o, m.WorkerID(), now)
						}
						owner[p] = m.WorkerID()
					}
				}
				for p, w := range owner {
					v, err := c.Get(ctx, k.partition(p)).Result()
					if ctx.Err() != nil {
						return nil
					}
					after := time.Now()
					for i, m := range ms {
						// Only a lease counted before and after the GET (the
						// same lease, not a new one on the same partition)
						// was certainly held while Redis answered.
						if h := sets[i][p]; m.WorkerID() == w && h != nil && m.counting(after)[p] == h {
							if want := h.mutex.Value(); err != nil || v != want {
								return fmt.Errorf("partition %d counted by %s with lock value %q but its key holds %q (err %v)", p, w, want, v, err)
							}
						}
					}
				}
				time.Sleep(3 * time.Millisecond)
			}
			return nil
		}()
	}()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
}

// requireCreditWithinCapacity checks, for sliding windows of the given
// length stepped by step over [from, to), that the managers' credits sum to
// at most capacity × window.
func requireCreditWithinCapacity(t *testing.T, capacity float64, from, to time.Time, window, step time.Duration, ms ...*running) {
	t.Helper()
	for s := from; !s.Add(window).After(to); s = s.Add(step) {
		var sum float64
		for _, m := range ms {
			sum += m.Credit(s, s.Add(window))
		}
		limit := capacity * window.Seconds()
		require.LessOrEqual(t, sum, limit+1e-6, "credit over [%v, +%v) is %.3f > %.3f", s.Format(time.StampMilli), window, sum, limit)
	}
}

// mustEnsurePool stores p (EnsurePool) or fails the test.
func mustEnsurePool(t testing.TB, c redis.UniversalClient, prefix string, p Pool) {
	t.Helper()
	_, err := EnsurePool(context.Background(), c, prefix, p)
	require.NoError(t, err)
}

// poolOnRedis returns a client of the real Redis and a key prefix of the
// test's own, with pool created under it.
func poolOnRedis(t *testing.T, pool Pool) (*redis.Client, string) {
	t.Helper()
	c := newClient(t, realRedis(t))
	prefix := uniquePrefix(t)
	mustEnsurePool(t, c, prefix, pool)
	return c, prefix
}

// ensurePoolErr is EnsurePool's error.
func ensurePoolErr(ctx context.Context, c redis.UniversalClient, prefix string, p Pool) error {
	_, err := EnsurePool(ctx, c, prefix, p)
	return err
}

// isMember reports whether worker has a live announcement in the pool.
func isMember(t *testing.T, c redis.UniversalClient, k keys, worker string) bool {
	t.Helper()
	members, _, err := readMembers(context.Background(), c, k)
	require.NoError(t, err)
	_, ok := members[worker]
	return ok
}
