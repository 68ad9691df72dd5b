package lease

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// redisLogEvery is how often RedisLogger lets a warning through: go-redis
// repeats a failed dial on every attempt while Redis is away.
const redisLogEvery = 5 * time.Second

// RedisLogger routes go-redis's own log lines (a pool that cannot dial, a
// Sentinel that does not answer, a failover to a new master) through a
// slog.Logger, so that they take the process's log format like every
// other line. It implements go-redis's logging interface: install it with
// redis.SetLogger(lease.RedisLogs(log)) before opening the clients
// (go-redis keeps one logger per process).
//
// Each line is logged with the message "redis client" and the go-redis
// text in the attribute detail: at warn level when it reports a failure,
// else at info level. Warnings are rate-limited to one per 5 s; the next
// one that passes carries suppressed, the number left out before it.
type RedisLogger struct {
	log        *slog.Logger
	warn       rate.Sometimes // one warning per redisLogEvery
	suppressed atomic.Int64   // warnings left out since the last that passed
}

// RedisLogs returns a RedisLogger writing go-redis's lines to log.
func RedisLogs(log *slog.Logger) *RedisLogger {
	return &RedisLogger{log: log, warn: rate.Sometimes{Interval: redisLogEvery}}
}

// Printf logs one go-redis line; see RedisLogger.
func (l *RedisLogger) Printf(ctx context.Context, format string, v ...any) {
	detail := strings.TrimSpace(fmt.Sprintf(format, v...))
	ctx = context.WithoutCancel(ctx)
	if !redisFailure(detail) {
		l.log.LogAttrs(ctx, slog.LevelInfo, "redis client", slog.String("detail", detail))
		return
	}
	if !l.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	logged := false
	l.warn.Do(func() {
		logged = true
		attrs := []slog.Attr{slog.String("detail", detail)}
		if n := l.suppressed.Swap(0); n > 0 {
			attrs = append(attrs, slog.Int64("suppressed", n))
		}
		l.log.LogAttrs(ctx, slog.LevelWarn, "redis client", attrs...)
	})
	if !logged {
		l.suppressed.Add(1)
	}
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
