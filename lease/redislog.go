package lease

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// redisLogEvery is how often RedisLogger lets a warning through: go-redis
// repeats a failed dial on every attempt while Redis is away.
const redisLogEvery = 5 * time.Second

// RedisLogger routes go-redis's own log lines (a pool that cannot dial, a
// Sentinel that does not answer, a failover to a new master) through a
// slog.Logger, so that they take the process's log format like every
// other line. It implements go-redis's logging interface: install it with
// redis.SetLogger(lease.NewRedisLogger(log)) before opening the clients
// (go-redis keeps one logger per process).
//
// Each line is logged with the message "redis client" and the go-redis
// text in the attribute detail: at warn level when it reports a failure,
// else at info level. Warnings are rate-limited to one per 5 s; the next
// one that passes carries suppressed, the number left out before it.
type RedisLogger struct {
	log *slog.Logger

	mu         sync.Mutex
	next       time.Time // the earliest instant the next warning may pass
	suppressed int       // warnings left out since the last that passed
}

// NewRedisLogger returns a RedisLogger writing to log.
func NewRedisLogger(log *slog.Logger) *RedisLogger { return &RedisLogger{log: log} }

// Printf logs one go-redis line; see RedisLogger.
func (l *RedisLogger) Printf(ctx context.Context, format string, v ...any) {
	detail := strings.TrimSpace(fmt.Sprintf(format, v...))
	level := slog.LevelInfo
	if redisFailure(detail) {
		level = slog.LevelWarn
	}
	if !l.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("detail", detail)}
	if level >= slog.LevelWarn {
		n, ok := l.allow(time.Now())
		if !ok {
			return
		}
		if n > 0 {
			attrs = append(attrs, slog.Int("suppressed", n))
		}
	}
	l.log.LogAttrs(context.WithoutCancel(ctx), level, "redis client", attrs...)
}

// allow reports whether a warning at now may pass, and how many were
// suppressed before it.
func (l *RedisLogger) allow(now time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return 0, false
	}
	l.next = now.Add(redisLogEvery)
	suppressed, l.suppressed = l.suppressed, 0
	return suppressed, true
}

// redisFailure reports whether a go-redis log line reports a failure.
func redisFailure(detail string) bool {
	d := strings.ToLower(detail)
	for _, w := range []string{"fail", "error", "unreachable", "panic", "refused", "timeout", "unexpected", "rejected", "wrongpass", "noauth"} {
		if strings.Contains(d, w) {
			return true
		}
	}
	return false
}
