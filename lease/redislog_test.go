package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Compiles only while go-redis takes a RedisLogger as its logger (the
// function is never called: SetLogger would change the process's logger).
var _ = func() { redis.SetLogger(RedisLogs(slog.Default())) }

func TestRedisLoggerWritesThroughSlog(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		l := RedisLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
		ctx := context.Background()
		dial := "redis: connection pool: failed to dial after %d attempts: %v\n"
		l.Printf(ctx, dial, 5, "dial tcp 127.0.0.1:1: connect: connection refused")
		l.Printf(ctx, "sentinel: new master=%q addr=%q", "sluice", "127.0.0.1:6379")
		l.Printf(ctx, dial, 5, "again") // within 5 s of the first warning: left out
		l.Printf(ctx, dial, 5, "and again")
		time.Sleep(redisLogEvery)
		l.Printf(ctx, dial, 5, "after 5 s")

		var lines []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &m), "a JSON line: %s", line)
			lines = append(lines, m)
		}
		require.Len(t, lines, 3, buf.String())
		require.Equal(t, "WARN", lines[0]["level"])
		require.Equal(t, "redis client", lines[0]["msg"])
		require.Equal(t, "redis: connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:1: connect: connection refused", lines[0]["detail"], "without the trailing newline")
		require.Equal(t, "INFO", lines[1]["level"], "a failover is news, not a failure")
		require.Contains(t, lines[1]["detail"], "new master")
		require.Contains(t, lines[2]["detail"], "after 5 s")
		require.EqualValues(t, 2, lines[2]["suppressed"], "the two warnings left out are counted")
	})
}

func TestRedisLoggerKeepsTheLevel(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := RedisLogs(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	l.Printf(context.Background(), "sentinel: selected addr=%s masterAddr=%s", "127.0.0.1:26379", "127.0.0.1:6379")
	require.Empty(t, buf.String(), "info is below --log-level warn")
	l.Printf(context.Background(), "sentinel: GetMasterAddrByName name=%q failed: %s", "sluice", "WRONGPASS")
	require.Contains(t, buf.String(), "level=WARN")
}
