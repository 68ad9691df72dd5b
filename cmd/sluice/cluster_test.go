package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// --redis-cluster, or SLUICE_REDIS_CLUSTER like every flag, makes
// --redis-addr seed nodes of one cluster; what a cluster cannot do is a
// usage error naming the setting.
func TestRedisClusterFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-cluster", "--redis-addr", "127.0.0.1:1", "--redis-db", "2"}, "--redis-*: lease: invalid config: redis cluster: database 2: a Redis Cluster has database 0 only"},
		{[]string{"--redis-cluster", "--redis-addr", "127.0.0.1:1,redis://other@127.0.0.1:2"}, "redis cluster seed 2 of 2 (redis://other@127.0.0.1:2): the seed nodes of one cluster need the same user"},
		{[]string{"--redis-cluster", "--redis-sentinel-master", "m", "--redis-sentinel-addrs", "127.0.0.1:1"}, "a Redis Cluster or Sentinel, not both"},
	} {
		code, _, stderr := runCLI(t, append([]string{"pool", "status"}, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}

	t.Setenv("SLUICE_REDIS_CLUSTER", "1")
	code, _, stderr := runCLI(t, "pool", "status", "--redis-addr", "127.0.0.1:1", "--redis-db", "2")
	require.Equal(t, exitUsage, code, stderr)
	require.Contains(t, stderr, "a Redis Cluster has database 0 only", "SLUICE_REDIS_CLUSTER turns it on")
}
