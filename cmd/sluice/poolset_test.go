package main

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/lease"
)

func TestPoolSet(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	_, err := lease.EnsurePool(context.Background(), c, "", lease.Pool{Name: "quakes", Capacity: 2000, Partitions: 20})
	require.NoError(t, err)

	// A decrease applies at once (before the next second).
	code, stdout, stderr := runCLI(t, "pool", "set", "--redis-addr", mr.Addr(), "--pool", "quakes", "--capacity", "1000")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "capacity 1000 records/s, 20 partitions")
	require.Contains(t, stdout, "was capacity 2000")
	st, err := lease.Status(context.Background(), c, "", "quakes")
	require.NoError(t, err)
	require.Equal(t, 1000.0, st.Pool.Capacity)
	require.WithinDuration(t, time.Now(), st.Pool.Switch.At, time.Second, "at once")

	// A raise at a switch instant one renewal interval (TTL/3) ahead.
	time.Sleep(time.Until(st.Pool.Switch.At.Add(lease.DecreaseLead)))
	code, _, stderr = runCLI(t, "pool", "set", "--redis-addr", mr.Addr(), "--pool", "quakes", "--capacity", "1500")
	require.Equal(t, exitOK, code, stderr)
	st, err = lease.Status(context.Background(), c, "", "quakes")
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(5*time.Second), st.Pool.Switch.At, time.Second, "one renewal interval (TTL/3) ahead")

	code, _, stderr = runCLI(t, "pool", "set", "--redis-addr", mr.Addr(), "--pool", "quakes", "--partitions", "10")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "already pending")

	code, _, stderr = runCLI(t, "pool", "set", "--redis-addr", mr.Addr(), "--pool", "nope", "--capacity", "5")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, `"nope"`)

	code, _, stderr = runCLI(t, "pool", "set", "--redis-addr", mr.Addr(), "--pool", "quakes")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--capacity, --partitions")
}

func TestRampFlags(t *testing.T) {
	code, _, stderr := runCLI(t, "worker", "--capacity", "100", "--ramp", "s3")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, `--ramp: unknown preset "s3"`)
	code, _, stderr = runCLI(t, "worker", "--capacity", "100", "--partitions", "4", "--reserved-partitions", "5")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "--reserved-partitions")
}
