package lease

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func TestParseCapacity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want float64
		kind SourceKind
		bad  bool
	}{
		{"2000", 2000, SourceNumber, false},
		{"1_500", 1500, SourceNumber, false},
		{"sink", 0, SourceSink, false},
		{" Probe ", 0, SourceProbe, false},
		{"fast", 0, "", true},
		{"NaN", 0, "", true},
		{"", 0, "", true},
	} {
		c, kind, err := ParseCapacity(tc.in)
		if tc.bad {
			require.Error(t, err, tc.in)
			require.Contains(t, err.Error(), "sink (read it from the sink) or probe (find it)", "names what to use")
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, c, tc.in)
		require.Equal(t, tc.kind, kind, tc.in)
	}
}

func TestSourceValidate(t *testing.T) {
	t.Parallel()
	base := Pool{Name: "p", Capacity: 100, Partitions: 4}
	for _, tc := range []struct {
		src  Source
		want string
	}{
		{Source{Kind: "guess"}, "want a number, sink or probe"},
		{Source{Kind: SourceProbe, Every: 500 * time.Millisecond}, "interval must be ≥ 1s"},
		{Source{Kind: SourceProbe, Floor: 200, Ceiling: 100}, "ceiling 100 is below the floor 200"},
		{Source{Kind: SourceProbe, Margin: 0.7}, "margin must be within (0, 0.5]"},
		{Source{Kind: SourceProbe, Every: 10 * time.Second, Reprobe: 5 * time.Second}, "re-probe period 5s must be ≥ the interval 10s"},
	} {
		p := base
		p.Source = tc.src
		err := p.Validate()
		require.ErrorIs(t, err, ErrInvalidPool)
		var pe *PoolError
		require.True(t, errors.As(err, &pe))
		require.Equal(t, "Source", pe.Field)
		require.Contains(t, err.Error(), tc.want)
	}
	p := base
	p.Source = Source{Kind: SourceProbe}
	require.NoError(t, p.Validate())
	require.Equal(t, Source{Kind: SourceProbe, Every: DefaultProbeEvery, Floor: DefaultProbeFloor, Margin: DefaultProbeMargin, Reprobe: DefaultReprobe},
		p.withDefaults().Source)
}

func TestCapacityLine(t *testing.T) {
	t.Parallel()
	require.Equal(t, "capacity 1,840 records/s (probed)", Pool{Capacity: 1840, From: "probed"}.CapacityLine())
	require.Equal(t, "capacity 200 cost/s (from DynamoDB table quakes: 200 WCU)",
		Pool{Capacity: 200, Unit: ingest.UnitCost, From: "from DynamoDB table quakes: 200 WCU"}.CapacityLine())
	require.Equal(t, "capacity 2,000,000.5 bytes/s", Pool{Capacity: 2000000.5, Unit: ingest.UnitBytes}.CapacityLine())
}

// probeAt is a probing pool at capacity c whose level switched long ago.
func probeAt(c float64) Pool {
	return Pool{Name: "p", Capacity: c, Partitions: 10, Source: Source{Kind: SourceProbe}.withDefaults()}
}

func TestProbeStep(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	clean := func(rate float64) account {
		return account{span: time.Second, units: rate, openUnits: rate / 2, attempts: int64(rate), answers: 10, latency: 100 * time.Millisecond, backlogged: 2, buckets: 2}
	}
	throttled := func(sent float64, throttled int64) account {
		a := clean(sent)
		a.throttled = throttled
		return a
	}
	for _, tc := range []struct {
		name   string
		pool   Pool
		st     probeState
		a      account
		want   float64
		onset  float64
		reason string
	}{
		{"nothing observed yet", probeAt(100), probeState{}, account{}, 100, 0, "no observation"},
		{"clean with a backlog: up by half", probeAt(1000), probeState{}, clean(990), 1500, 0, "ran clean"},
		{"clean without a backlog: stays", probeAt(1000), probeState{}, account{span: time.Second, units: 990, attempts: 990, buckets: 2}, 1000, 0, "did not use"},
		{"clean but far below the level: stays", probeAt(1000), probeState{}, clean(500), 1000, 0, "did not use"},
		// Four buckets that ended at 950/s and one opened 50 ms ago: 780/s
		// over the five, but the level was used.
		{"a bucket still open does not hide a used level", probeAt(1000), probeState{},
			account{span: 2500 * time.Millisecond, units: 4*475 + 50, openUnits: 50, attempts: 1950, backlogged: 5, buckets: 5}, 1500, 0, "ran clean"},
		{"throttled: a margin below what was accepted", probeAt(1713), probeState{}, throttled(1713, 213), 1455, 1713, "213 of 1713 attempts throttled"},
		// The first onset, the workers held back by their own throttle
		// cuts: the sink took at least 1,254/s and less than 1,713/s, so
		// the level goes a margin below the middle.
		{"first onset while held back: a margin below the middle", probeAt(1713), probeState{}, throttled(1263, 9), 1439, 1713, "9 of 1263 attempts throttled"},
		// Right after an onset the workers are still held back by its
		// throttles: 1,200/s sent at 2,305 says little of the sink, so the
		// level is read once more; a second such reading lowers it.
		{"throttled while held back after an onset: read again", probeAt(2305), probeState{Onset: 2570, OnsetAt: now.Add(-2 * time.Second)},
			throttled(1200, 1), 2305, 2570, "read again"},
		{"held back twice: a margin below what was accepted", probeAt(2305), probeState{Onset: 2570, OnsetAt: now.Add(-4 * time.Second)},
			throttled(1200, 1), 1163, 2305, "1 of 1200 attempts throttled"},
		{"settled below an onset: stays", probeAt(1455), probeState{Onset: 1713, OnsetAt: now.Add(-time.Minute)}, clean(1450), 1455, 1713, "settled"},
		{"after the re-probe period: up by the margin", probeAt(1455), probeState{Onset: 1713, OnsetAt: now.Add(-11 * time.Minute)}, clean(1450), 1499, 0, "ran clean"},
		{"the ceiling bounds it", Pool{Name: "p", Capacity: 800, Partitions: 10, Source: Source{Kind: SourceProbe, Ceiling: 1000}.withDefaults()}, probeState{}, clean(800), 1000, 0, "ran clean"},
		{"the floor bounds it", probeAt(100), probeState{}, throttled(100, 90), 100, 100, "throttled"},
		{"latency tripled: an onset", probeAt(1000), probeState{BaseLatency: 20 * time.Millisecond},
			account{span: time.Second, units: 1000, attempts: 1000, answers: 10, latency: time.Second, backlogged: 2, buckets: 2}, 970, 1000, "answer latency"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, st, reason := probeStep(tc.pool, tc.st, tc.a, now)
			require.Equal(t, tc.want, next)
			require.Equal(t, tc.onset, st.Onset)
			require.Contains(t, reason, tc.reason)
		})
	}
}

// A decrease switches at once, a raise at now + lead; the next switch
// comes at least a second after the last.
func TestSetPoolLowersAtOnceRaisesAtTheSwitch(t *testing.T) {
	t.Parallel()
	_, c := miniClient(t)
	ctx := context.Background()
	_, err := EnsurePool(ctx, c, "", Pool{Name: "p", Capacity: 1000, Partitions: 10})
	require.NoError(t, err)
	t0 := time.Now()
	p, err := SetPool(ctx, c, "", "p", 500, 0, 5*time.Second, t0)
	require.NoError(t, err)
	require.WithinDuration(t, t0.Add(DecreaseLead), p.Switch.At, time.Millisecond, "a decrease at once")
	p, err = SetPool(ctx, c, "", "p", 800, 0, 5*time.Second, t0.Add(300*time.Millisecond))
	require.NoError(t, err)
	require.WithinDuration(t, t0.Add(5300*time.Millisecond), p.Switch.At, time.Millisecond, "a raise at the switch instant")
	p, err = SetPool(ctx, c, "", "p", 400, 0, 5*time.Second, t0.Add(5400*time.Millisecond))
	require.NoError(t, err)
	require.WithinDuration(t, t0.Add(6300*time.Millisecond), p.Switch.At, time.Millisecond, "a second after the last switch")
	_, err = SetPool(ctx, c, "", "p", 400, 0, 100*time.Millisecond, t0.Add(7*time.Second))
	require.ErrorIs(t, err, ErrInvalidPool, "a lead under MinLead")
}

func TestDefinePoolModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	stored := Pool{Name: "p", Capacity: 2000, Partitions: 20}
	given := Pool{Name: "p", Capacity: 1000, Partitions: 20}
	t.Run("adopt refuses a difference not made live", func(t *testing.T) {
		_, c := miniClient(t)
		_, out, err := DefinePool(ctx, c, "", stored, DefinitionAdopt, "a", time.Second, now)
		require.NoError(t, err)
		require.Equal(t, Created, out)
		_, _, err = DefinePool(ctx, c, "", given, DefinitionAdopt, "b", time.Second, now)
		require.ErrorIs(t, err, ErrPoolMismatch)
		_, out, err = DefinePool(ctx, c, "", stored, DefinitionRefuse, "c", time.Second, now)
		require.NoError(t, err)
		require.Equal(t, Same, out)
	})
	t.Run("adopt runs with a live change, refuse does not", func(t *testing.T) {
		_, c := miniClient(t)
		_, _, err := DefinePool(ctx, c, "", stored, DefinitionAdopt, "a", time.Second, now)
		require.NoError(t, err)
		_, err = SetPool(ctx, c, "", "p", 1500, 0, time.Second, now)
		require.NoError(t, err)
		p, out, err := DefinePool(ctx, c, "", stored, DefinitionAdopt, "b", time.Second, now.Add(time.Second))
		require.NoError(t, err)
		require.Equal(t, Adopted, out)
		require.Equal(t, 1500.0, p.Capacity)
		_, _, err = DefinePool(ctx, c, "", stored, DefinitionRefuse, "c", time.Second, now.Add(time.Second))
		require.ErrorIs(t, err, ErrPoolMismatch)
	})
	t.Run("apply changes the pool live by the rule", func(t *testing.T) {
		_, c := miniClient(t)
		_, _, err := DefinePool(ctx, c, "", stored, DefinitionApply, "a", time.Second, now)
		require.NoError(t, err)
		p, out, err := DefinePool(ctx, c, "", given, DefinitionApply, "b", 5*time.Second, now)
		require.NoError(t, err)
		require.Equal(t, Applied, out)
		require.Equal(t, 1000.0, p.Capacity)
		require.WithinDuration(t, now.Add(DecreaseLead), p.Switch.At, time.Millisecond, "lower at once")
		require.Len(t, p.Changes, 2)
		raised := given
		raised.Capacity = 3000
		p, _, err = DefinePool(ctx, c, "", raised, DefinitionApply, "c", 5*time.Second, now.Add(2*time.Second))
		require.NoError(t, err)
		require.WithinDuration(t, now.Add(7*time.Second), p.Switch.At, time.Millisecond, "raise at the switch instant")
		// What cannot change live is refused in every mode.
		other := given
		other.Unit = ingest.UnitBytes
		_, _, err = DefinePool(ctx, c, "", other, DefinitionApply, "d", time.Second, now.Add(9*time.Second))
		require.ErrorIs(t, err, ErrPoolMismatch)
		require.Contains(t, err.Error(), "cannot change while workers run")
	})
	t.Run("a probing pool's capacity is its own", func(t *testing.T) {
		_, c := miniClient(t)
		probe := Pool{Name: "p", Capacity: DefaultProbeFloor, Partitions: 20, Source: Source{Kind: SourceProbe}}
		_, _, err := DefinePool(ctx, c, "", probe, DefinitionRefuse, "a", time.Second, now)
		require.NoError(t, err)
		_, err = SetPool(ctx, c, "", "p", 1840, 0, time.Second, now)
		require.NoError(t, err)
		p, out, err := DefinePool(ctx, c, "", probe, DefinitionRefuse, "b", time.Second, now.Add(2*time.Second))
		require.NoError(t, err, "the same source, whatever capacity it decided")
		require.Equal(t, Same, out)
		require.Equal(t, 1840.0, p.Capacity)
	})
}

// Two deployments that keep disagreeing: A defines 2,000, B applies 1,000,
// A applies 2,000 again (a rollback, allowed), and B's second change back
// is refused with an error naming both definitions and the workers.
func TestDefinePoolRefusesAFlappingPool(t *testing.T) {
	t.Parallel()
	_, c := miniClient(t)
	ctx := context.Background()
	now := time.Now()
	a := Pool{Name: "p", Capacity: 2000, Partitions: 20}
	b := Pool{Name: "p", Capacity: 1000, Partitions: 20}
	apply := func(p Pool, by string, at time.Duration) error {
		_, _, err := DefinePool(ctx, c, "", p, DefinitionApply, by, time.Second, now.Add(at))
		return err
	}
	require.NoError(t, apply(a, "deploy-a-1", 0))
	require.NoError(t, apply(b, "deploy-b-1", time.Second))
	require.NoError(t, apply(a, "deploy-a-2", 3*time.Second), "a rollback is allowed")
	err := apply(b, "deploy-b-2", 6*time.Second)
	require.ErrorIs(t, err, ErrPoolFlapping)
	for _, want := range []string{"deploy-a-1", "deploy-b-1", "deploy-a-2", "deploy-b-2", "capacity 2000 records/s", "capacity 1000 records/s"} {
		require.Contains(t, err.Error(), want)
	}
	st, err := Status(ctx, c, "", "p")
	require.NoError(t, err)
	require.Equal(t, 2000.0, st.Pool.Capacity, "the pool stays as it was")
	// Past the flap window the same change is a change again.
	require.NoError(t, apply(b, "deploy-b-3", FlapWindow+7*time.Second))
}

// Workers of one rollout apply the same new definition at once: each
// reads the old one, and all but the first lose the compare-and-set. They
// judge again against what the first wrote, and start (Same) instead of
// exiting with "changed concurrently". On a real redis-server, with a
// peer's write placed between a worker's read and its write.
func TestDefinePoolRejudgesAPeersConcurrentWrite(t *testing.T) {
	t.Parallel()
	addr := realRedis(t)
	prefix := uniquePrefix(t)
	ctx := context.Background()
	now := time.Now()
	old := Pool{Name: "p", Capacity: 2000, Partitions: 20}
	given := Pool{Name: "p", Capacity: 1000, Partitions: 20}
	peer := newClient(t, addr)
	_, _, err := DefinePool(ctx, peer, prefix, old, DefinitionApply, "old1", time.Second, now)
	require.NoError(t, err)

	c := newClient(t, addr)
	key := keysOn(c, prefix, "p").def()
	var peerOut Defined
	hook := &afterWatchedRead{key: key, then: func() {
		_, peerOut, err = DefinePool(ctx, peer, prefix, given, DefinitionApply, "new1", time.Second, now)
		require.NoError(t, err)
	}}
	c.AddHook(hook)
	p, out, err := DefinePool(ctx, c, prefix, given, DefinitionApply, "new2", time.Second, now)
	require.NoError(t, err, "a peer applying the same definition meanwhile")
	require.True(t, hook.fired, "the peer wrote between the read and the write")
	require.Equal(t, Applied, peerOut)
	require.Equal(t, Same, out, "judged again: the peer applied this very definition")
	require.Equal(t, 1000.0, p.Capacity)
	require.Len(t, p.Changes, 2, "the change is recorded once")

	// A peer that wrote something else is judged too: a pending switch.
	other := given
	other.Capacity = 500
	hook.fired, hook.watched = false, false
	hook.then = func() {}
	_, _, err = DefinePool(ctx, c, prefix, other, DefinitionApply, "new3", time.Second, now)
	require.ErrorIs(t, err, ErrSwitchPending)
}

// afterWatchedRead is a go-redis hook that runs then once, right after
// the first GET of key that follows a WATCH: a peer's write placed inside
// a compare-and-set.
type afterWatchedRead struct {
	key            string
	then           func()
	watched, fired bool
}

func (h *afterWatchedRead) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *afterWatchedRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *afterWatchedRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		switch {
		case cmd.Name() == "watch":
			h.watched = true
		case cmd.Name() == "get" && h.watched && !h.fired && len(args) == 2 && args[1] == h.key:
			h.fired = true
			h.then()
		}
		return err
	}
}

// fakeReader is a sink whose capacity the test sets; fail makes it not
// answer.
type fakeReader struct {
	v    atomic.Int64
	fail atomic.Bool
}

func (r *fakeReader) SinkCapacity(context.Context) (float64, string, error) {
	if r.fail.Load() {
		return 0, "", errors.New("sink: the capacity query timed out")
	}
	return float64(r.v.Load()), "from the test sink", nil
}

// A pool whose capacity comes from the sink follows it; a sink that stops
// answering keeps the last value, and the pool and the log say so. Two
// controllers decide once per interval between them.
func TestControllerFollowsTheSink(t *testing.T) {
	t.Parallel()
	_, c := miniClient(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := Pool{Name: "p", Capacity: 200, Partitions: 4, From: "from the test sink", Source: Source{Kind: SourceSink, Every: time.Second}}
	_, _, err := DefinePool(ctx, c, "", pool, DefinitionAdopt, "a", time.Second, time.Now())
	require.NoError(t, err)
	r := &fakeReader{}
	r.v.Store(200)
	var lw syncWriter
	log := slog.New(slog.NewTextHandler(&lw, nil))
	var ctrls []*Controller
	for _, id := range []string{"a", "b"} {
		ctrl, err := NewController(ControllerConfig{Pool: pool, WorkerID: id, Reader: r, Logger: log, Tick: 50 * time.Millisecond}, c)
		require.NoError(t, err)
		ctrls = append(ctrls, ctrl)
	}
	done := make(chan struct{}, 2)
	for _, ctrl := range ctrls {
		go func() { _ = ctrl.Run(ctx); done <- struct{}{} }()
	}
	capacity := func() Pool {
		st, err := Status(ctx, c, "", "p")
		require.NoError(t, err)
		return st.Pool
	}
	r.v.Store(100)
	require.Eventually(t, func() bool { return capacity().Capacity == 100 }, 3*time.Second, 20*time.Millisecond)
	r.fail.Store(true)
	require.Eventually(t, func() bool { return ctrls[0].ReadFailures()+ctrls[1].ReadFailures() > 0 }, 3*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return strings.Contains(capacity().From, "the sink does not answer since") }, 3*time.Second, 20*time.Millisecond)
	require.Equal(t, 100.0, capacity().Capacity, "the last value is kept")
	r.fail.Store(false)
	r.v.Store(300)
	require.Eventually(t, func() bool { p := capacity(); return p.Capacity == 300 && p.From == "from the test sink" }, 3*time.Second, 20*time.Millisecond)
	cancel()
	<-done
	<-done
	require.Contains(t, lw.String(), "the sink does not answer its capacity query; the pool keeps its last value")
	// Once per interval for both: about one read a second, not two.
	reads := ctrls[0].ReadFailures() + ctrls[1].ReadFailures()
	require.LessOrEqual(t, reads, int64(4))
}

// syncWriter is a writer safe for the controllers' concurrent logs.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
