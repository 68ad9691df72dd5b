package bulkload

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrLoadRunning is returned by Progress.Claim when another process is
// running the same load.
var ErrLoadRunning = errors.New("bulkload: the same load is running in another process")

// Progress keeps how far a load got, so that a rerun of the same command
// after a crash produces only what was not produced before.
type Progress interface {
	// Claim makes this process the one running load id until release is
	// called (or the process dies and the claim expires); it waits for the
	// claim of a process that just died to lapse, and fails with
	// ErrLoadRunning when another process holds it alive.
	Claim(ctx context.Context, id string) (release func(), err error)
	// Resume returns how far earlier runs of load id got: zero for a new
	// load.
	Resume(ctx context.Context, id string) (Resumed, error)
	// Save records that the first rows rows of the input are done.
	Save(ctx context.Context, id string, rows int64) error
	// Finish records that the load finished at at: every record
	// produced and done.
	Finish(ctx context.Context, id string, at time.Time) error
}

// Resumed is how far earlier runs of a load got.
type Resumed struct {
	// Rows is how many rows of the input an earlier run produced (or
	// dead-lettered).
	Rows int64
	// FinishedAt is when an earlier run finished the load; zero when
	// none did.
	FinishedAt time.Time
}

// LoadID names a load by what it loads where: the topic and the content of
// its input (its SHA-256 over the input's bytes, as digest gives them), so
// the same command on the same file resumes and any change starts anew.
func LoadID(topic string, digest []byte) string {
	h := sha256.New()
	h.Write([]byte(topic))
	h.Write([]byte{0})
	h.Write(digest)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// RedisProgress keeps load progress in Redis under "<Prefix>:load:<id>"
// (rows done, kept for KeepFor after the last save) and claims a load with
// "<Prefix>:load:<id>:owner" (a key with a ClaimTTL, refreshed while the
// process runs, so a crashed run's claim lapses within ClaimTTL; Claim
// waits up to twice that for it).
type RedisProgress struct {
	Client redis.UniversalClient
	// Prefix starts the keys. Default "sluice".
	Prefix string
	// KeepFor is how long progress is kept after the last save. Default 7
	// days.
	KeepFor time.Duration
	// ClaimTTL is how long a claim outlives its last refresh. Default 5 s.
	ClaimTTL time.Duration
}

var _ Progress = RedisProgress{}

func (r RedisProgress) key(id string) string {
	prefix := r.Prefix
	if prefix == "" {
		prefix = "sluice"
	}
	return prefix + ":load:" + id
}

// Claim implements Progress.
func (r RedisProgress) Claim(ctx context.Context, id string) (func(), error) {
	ttl := r.ClaimTTL
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	key := r.key(id) + ":owner"
	token := strconv.FormatInt(time.Now().UnixNano(), 36)
	// A run that crashed a moment ago still holds the claim: wait for it
	// to lapse; one that keeps refreshing it is alive.
	deadline := time.Now().Add(2 * ttl)
	for {
		ok, err := r.Client.SetNX(ctx, key, token, ttl).Result()
		if err != nil {
			return nil, fmt.Errorf("bulkload: claim load %s: %w", id, err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w (load %s)", ErrLoadRunning, id)
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(ttl / 10):
		}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(ttl / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl)
				defer cancel()
				if v, err := r.Client.Get(rctx, key).Result(); err == nil && v == token {
					r.Client.Del(rctx, key)
				}
				return
			case <-tick.C:
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl/3)
				r.Client.Expire(rctx, key, ttl)
				cancel()
			}
		}
	}()
	return func() { close(stop); <-done }, nil
}

// Resume implements Progress.
func (r RedisProgress) Resume(ctx context.Context, id string) (Resumed, error) {
	var out Resumed
	n, err := r.Client.Get(ctx, r.key(id)).Int64()
	if errors.Is(err, redis.Nil) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("bulkload: read the progress of load %s: %w", id, err)
	}
	out.Rows = n
	at, err := r.Client.Get(ctx, r.key(id)+":finished").Int64()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return out, fmt.Errorf("bulkload: read the progress of load %s: %w", id, err)
	default:
		out.FinishedAt = time.UnixMilli(at)
	}
	return out, nil
}

// Finish implements Progress: it keeps when the load finished beside its
// rows done, for as long.
func (r RedisProgress) Finish(ctx context.Context, id string, at time.Time) error {
	if err := r.Client.Set(ctx, r.key(id)+":finished", at.UnixMilli(), r.keepFor()).Err(); err != nil {
		return fmt.Errorf("bulkload: save that load %s finished: %w", id, err)
	}
	return nil
}

func (r RedisProgress) keepFor() time.Duration {
	if r.KeepFor <= 0 {
		return 7 * 24 * time.Hour
	}
	return r.KeepFor
}

// Save implements Progress.
func (r RedisProgress) Save(ctx context.Context, id string, rows int64) error {
	if err := r.Client.Set(ctx, r.key(id), rows, r.keepFor()).Err(); err != nil {
		return fmt.Errorf("bulkload: save the progress of load %s: %w", id, err)
	}
	return nil
}

// Identity names a load for resuming and its workers: loadID is LoadID of
// topic and the inputs' content, workerPrefix its first 8 characters, so
// that a rerun takes over its own workers' leases at once. Without resume
// (resume false, or an input read from standard input, which a rerun
// cannot read again: Digest's ErrNoIdentity, logged as a warning to log),
// loadID is "" and workerPrefix random. Other errors are reading the
// inputs.
func Identity(in *Input, topic string, resume bool, log *slog.Logger) (loadID, workerPrefix string, err error) {
	random := strings.ToLower(rand.Text()[:8])
	if !resume {
		return "", random, nil
	}
	digest, err := in.Digest()
	if errors.Is(err, ErrNoIdentity) {
		log.Warn("the input is read from standard input: a rerun of this load cannot resume, it produces every row again (the sink stores each ID once)")
		return "", random, nil
	}
	if err != nil {
		return "", "", err
	}
	id := LoadID(topic, digest)
	return id, id[:8], nil
}
