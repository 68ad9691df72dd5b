package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/httpserver"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/sinksim"
)

// env is the services one benchmark run uses: Kafka, Redis and a place to
// start sink emulators.
type env struct {
	brokers   []string
	redisAddr string
	real      bool
	log       *slog.Logger // the components' logs (warnings only)
	prefix    string       // makes topic, group and pool names unique per run

	closers []func()
	seq     atomic.Int64

	producerOnce sync.Once
	dlq          *queue.DeadLetterWriter
	producerErr  error

	binOnce sync.Once
	bin     string // the sluice binary (scenarios 6 and 7)
	binErr  error
	workDir string
}

// startEnv starts embedded Kafka and Redis, or connects to real ones when
// cfg.Real is set.
func startEnv(ctx context.Context, cfg Config) (_ *env, err error) {
	e := &env{real: cfg.Real, log: cfg.Logger, workDir: cfg.WorkDir,
		prefix: fmt.Sprintf("bench-%d", time.Now().Unix()%1_000_000)}
	if e.log == nil {
		e.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if cfg.Real {
		e.brokers, e.redisAddr = cfg.Brokers, cfg.RedisAddr
		if len(e.brokers) == 0 || e.redisAddr == "" {
			return nil, errors.New("bench: --real needs --brokers and --redis-addr")
		}
	} else {
		kafka, err := queue.StartEmbedded(ctx)
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, kafka.Close)
		e.brokers = kafka.Addrs()
		mr := miniredis.NewMiniRedis()
		mr.ClockTTL(true) // TTLs follow the real clock, so leases expire as in Redis
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("start embedded Redis: %w", err)
		}
		e.closers = append(e.closers, mr.Close)
		e.redisAddr = mr.Addr()
	}
	return e, nil
}

func (e *env) close() {
	if e.dlq != nil {
		_ = e.dlq.Close()
	}
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// name returns a name unique to this run: prefix-parts-sequence.
func (e *env) name(parts ...string) string {
	return fmt.Sprintf("%s-%s-%d", e.prefix, strings.Join(parts, "-"), e.seq.Add(1))
}

// deadLetters returns the shared dead-letter writer.
func (e *env) deadLetters() (*queue.DeadLetterWriter, error) {
	e.producerOnce.Do(func() {
		e.dlq, e.producerErr = queue.NewDeadLetterWriter(queue.ProducerConfig{Brokers: e.brokers, Logger: e.log})
	})
	return e.dlq, e.producerErr
}

// produce creates topic with the given Kafka partitions and writes n
// records to it, spread round-robin; record i is gen(i). Chunks are
// produced by a few goroutines at once.
func (e *env) produce(ctx context.Context, topic string, partitions, n int, gen func(i int) ingest.Record) error {
	for t, p := range map[string]int{topic: partitions, topic + ".dlq": 1} {
		if err := queue.EnsureTopic(ctx, e.brokers, t, p); err != nil {
			return err
		}
	}
	// A producer of its own: kafka-go's writer caches topic metadata, so a
	// shared one may not know a topic created a moment ago.
	p, err := queue.NewProducer(queue.ProducerConfig{Brokers: e.brokers, RoundRobin: true, Logger: e.log})
	if err != nil {
		return err
	}
	defer p.Close()
	const chunk = 2000
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
		next    atomic.Int64
	)
	for range 4 {
		wg.Go(func() {
			buf := make([]ingest.Record, 0, chunk)
			for {
				from := int(next.Add(chunk)) - chunk
				if from >= n || ctx.Err() != nil {
					return
				}
				buf = buf[:0]
				for i := from; i < min(from+chunk, n); i++ {
					buf = append(buf, gen(i))
				}
				if err := p.Produce(ctx, topic, buf); err != nil {
					errOnce.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = context.Cause(ctx)
	}
	return first
}

// smallRecord is the benchmarks' ordinary record: about 100 bytes of JSON
// with an explicit ID (the idempotency key).
func smallRecord(prefix string) func(i int) ingest.Record {
	return func(i int) ingest.Record {
		id := fmt.Sprintf("%s-%07d", prefix, i)
		return ingest.Record{ID: id, Value: fmt.Appendf(nil, `{"id":%q,"seq":%d,"mag":%.2f,"place":"10 km NE of somewhere"}`, id, i, float64(i%700)/100)}
	}
}

// simServer is a sink emulator served over HTTP on 127.0.0.1.
type simServer struct {
	sim  *sinksim.Sim
	url  string
	stop func()
}

// startSim serves a fresh emulator; stop it with stop.
func startSim(ctx context.Context, cfg sinksim.Config) (*simServer, error) {
	sim, err := sinksim.New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("start sink emulator: %w", err)
	}
	stop := httpserver.Background(ctx, ln, sim.Handler(), httpserver.DefaultDrain)
	return &simServer{sim: sim, url: "http://" + ln.Addr().String(), stop: func() { _ = stop() }}, nil
}

// errCut is what a cut Redis client answers (scenario 7).
var errCut = errors.New("bench: Redis unreachable (cut by the benchmark)")

// redisProbe is a go-redis hook that counts commands and lease attempts
// (redsync's SET … NX) and can cut the client off Redis, as a network
// partition would. lease.Manager does not count its failed lock attempts;
// the probe sees them as SET NX answered nil.
type redisProbe struct {
	commands     atomic.Int64
	byName       sync.Map // command name (a script call: "evalsha <first 8 of its SHA-1>") → *atomic.Int64
	lockAttempts atomic.Int64
	lockFailures atomic.Int64
	cut          atomic.Bool
}

var _ redis.Hook = (*redisProbe)(nil)

func (p *redisProbe) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p.cut.Load() {
			return nil, errCut
		}
		return next(ctx, network, addr)
	}
}

func (p *redisProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if p.cut.Load() {
			cmd.SetErr(errCut)
			return errCut
		}
		p.count(cmd)
		err := next(ctx, cmd)
		if isSetNX(cmd) {
			p.lockAttempts.Add(1)
			if errors.Is(err, redis.Nil) || (err == nil && !setSucceeded(cmd)) {
				p.lockFailures.Add(1)
			}
		}
		return err
	}
}

func (p *redisProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if p.cut.Load() {
			for _, c := range cmds {
				c.SetErr(errCut)
			}
			return errCut
		}
		for _, c := range cmds {
			p.count(c)
		}
		return next(ctx, cmds)
	}
}

// count counts one command sent.
func (p *redisProbe) count(cmd redis.Cmder) {
	p.commands.Add(1)
	name := cmd.Name()
	if args := cmd.Args(); (name == "evalsha" || name == "eval") && len(args) > 1 {
		if sha, ok := args[1].(string); ok && name == "evalsha" && len(sha) >= 8 {
			name += " " + sha[:8]
		}
	}
	n, _ := p.byName.LoadOrStore(name, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
}

// names returns the commands counted by name.
func (p *redisProbe) names() map[string]int64 {
	out := map[string]int64{}
	p.byName.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

func isSetNX(cmd redis.Cmder) bool {
	if !strings.EqualFold(cmd.Name(), "set") && !strings.EqualFold(cmd.Name(), "setnx") {
		return false
	}
	if strings.EqualFold(cmd.Name(), "setnx") {
		return true
	}
	for _, a := range cmd.Args()[1:] {
		if s, ok := a.(string); ok && strings.EqualFold(s, "nx") {
			return true
		}
	}
	return false
}

func setSucceeded(cmd redis.Cmder) bool {
	switch c := cmd.(type) {
	case *redis.BoolCmd:
		return c.Val()
	case *redis.StatusCmd:
		return c.Val() == "OK"
	}
	return true
}

// useBrokers points the environment at brokers until the returned func
// restores the ones it had (a scenario that needs a real Kafka in an
// embedded run). The dead-letter writer keeps the brokers it was made
// with.
func (e *env) useBrokers(brokers []string) (restore func()) {
	old := e.brokers
	e.brokers = brokers
	return func() { e.brokers = old }
}

// redisClient returns a new client of the run's Redis with probe hooked in.
func (e *env) redisClient(probe *redisProbe) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: e.redisAddr, DisableIdentity: true}) // as lease.OpenRedis
	if probe != nil {
		c.AddHook(probe)
	}
	return c
}
