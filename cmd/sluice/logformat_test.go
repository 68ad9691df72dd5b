package main

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// lockedBuffer is a bytes.Buffer that go-redis's goroutines may write to
// while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// closedAddr is a loopback host:port nobody listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// jsonLines parses every line of out as a JSON object, failing on the
// first that is not one.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "a line that is not JSON with --log-format json: %q\nall output:\n%s", line, out)
		lines = append(lines, m)
	}
	return lines
}

// With --log-format json, a Redis that cannot be reached gives JSON lines
// only on stderr: go-redis's own lines (its dial failures, a Sentinel
// that does not answer) and the command's final error included.
func TestLogFormatJSONHoldsForRedisFailures(t *testing.T) {
	redisAddr, sentinelAddr := closedAddr(t), closedAddr(t)
	for _, tc := range []struct {
		name   string
		args   []string
		detail string // what go-redis's own line names
	}{
		{"address", []string{"--redis-addr", redisAddr}, redisAddr},
		{"sentinel", []string{"--redis-sentinel-master", "sluice", "--redis-sentinel-addrs", sentinelAddr}, sentinelAddr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr lockedBuffer
			args := append([]string{"sluice", "bulk-load", "--embedded", "--log-format", "json", "--capacity", "100", "--id-field", "id"}, tc.args...)
			code := run(append(args, sample(t, 5)), strings.NewReader(""), &stdout, &stderr)
			require.Equal(t, exitFailure, code, stderr.String())
			lines := jsonLines(t, stderr.String())
			var fromRedis, final bool
			for _, l := range lines {
				switch l["msg"] {
				case "redis client":
					require.Equal(t, "WARN", l["level"])
					require.Contains(t, l["detail"], tc.detail)
					fromRedis = true
				case "sluice failed":
					require.Equal(t, "ERROR", l["level"])
					require.Contains(t, l["err"], "redis ", "the error names the Redis")
					require.EqualValues(t, exitFailure, l["exit_code"])
					final = true
				}
			}
			require.True(t, fromRedis, "go-redis's own lines go through the logger:\n%s", stderr.String())
			require.True(t, final, "the command's error is a JSON line too:\n%s", stderr.String())
		})
	}
}

// With the text format the error stays the plain line it always was.
func TestLogFormatTextKeepsThePlainError(t *testing.T) {
	var stdout, stderr lockedBuffer
	addr := closedAddr(t)
	code := run([]string{"sluice", "pool", "status", "--redis-addr", addr}, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitFailure, code)
	require.Contains(t, stderr.String(), "\nsluice: redis redis://"+addr+"/0: ")
	require.Regexp(t, `(?m)^time=\S+ level=WARN msg="redis client" detail=".*failed to dial`, stderr.String(), "go-redis's lines in the text format")
	require.NotContains(t, stderr.String(), "redis: 20", "no line in go-redis's own format (\"redis: 2025/01/02 ...\")")
}
