package lease

import (
	"crypto/tls"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// isCluster reports whether c reaches a Redis Cluster: its multi-key
// commands, transactions and scripts need every key in one hash slot.
func isCluster(c redis.UniversalClient) bool {
	_, ok := c.(*redis.ClusterClient)
	return ok
}

// keysOn returns the key layout of pool on c. On a Redis Cluster the pool
// name is a hash tag ("sluice:{orders}:p:3"), so that every key of a pool
// hashes to the slot of "orders" and one script, MGET or transaction may
// touch any of them; elsewhere the keys are those of earlier versions
// ("sluice:orders:p:3"), so that workers of both share one set of leases
// during a rolling upgrade.
func keysOn(c redis.UniversalClient, prefix, pool string) keys {
	if isCluster(c) {
		return keysFor(prefix, "{"+pool+"}")
	}
	return keysFor(prefix, pool)
}

// poolKeys returns the key layout of pool on clients, which must all be
// Redis Clusters or none: the two name a pool's keys differently. The
// error wraps ErrInvalidConfig.
func poolKeys(prefix, pool string, clients []redis.UniversalClient) (keys, error) {
	clusters := 0
	for _, c := range clients {
		if isCluster(c) {
			clusters++
		}
	}
	if clusters > 0 && clusters < len(clients) {
		return keys{}, fmt.Errorf("%w: %d of %d Redis clients are Redis Cluster clients: use clusters only or none", ErrInvalidConfig, clusters, len(clients))
	}
	return keysOn(clients[0], prefix, pool), nil
}

// clusterClients builds the one go-redis cluster client of cfg: its Addrs
// are seed nodes of one cluster, which must agree on user, password and
// TLS; database 0 only.
func clusterClients(cfg RedisConfig, base *tls.Config) ([]redis.UniversalClient, error) {
	if cfg.DB != 0 {
		return nil, fmt.Errorf("%w: redis cluster: database %d: a Redis Cluster has database 0 only", ErrInvalidConfig, cfg.DB)
	}
	opts := &redis.ClusterOptions{DisableIdentity: true}
	for i, addr := range cfg.Addrs {
		o, err := cfg.options(strings.TrimSpace(addr), base)
		if err == nil && o.DB != 0 {
			err = fmt.Errorf("database %d: a Redis Cluster has database 0 only", o.DB)
		}
		if err == nil && i > 0 && (o.Username != opts.Username || o.Password != opts.Password || (o.TLSConfig == nil) != (opts.TLSConfig == nil)) {
			err = fmt.Errorf("the seed nodes of one cluster need the same user, password and TLS as %s", redactAddr(cfg.Addrs[0]))
		}
		if err != nil {
			return nil, fmt.Errorf("%w: redis cluster seed %d of %d (%s): %w", ErrInvalidConfig, i+1, len(cfg.Addrs), redactAddr(addr), err)
		}
		if i == 0 {
			opts.Username, opts.Password, opts.TLSConfig = o.Username, o.Password, o.TLSConfig
		}
		opts.Addrs = append(opts.Addrs, o.Addr)
	}
	if opts.TLSConfig != nil && cfg.ServerName == "" {
		// A URL names its host as the server name; the cluster's other
		// nodes are reached at the addresses it announces, each verified
		// against its own.
		opts.TLSConfig = opts.TLSConfig.Clone()
		opts.TLSConfig.ServerName = ""
	}
	return []redis.UniversalClient{redis.NewClusterClient(opts)}, nil
}

// describeCluster names a cluster client by its seeds, never with its
// password: "cluster rediss://sluice@10.0.0.1:6379,10.0.0.2:6379" (a
// RedisError reads "redis cluster rediss://…: …").
func describeCluster(c *redis.ClusterClient) string {
	o := c.Options()
	u := url.URL{Scheme: "redis", Host: strings.Join(o.Addrs, ",")}
	if o.TLSConfig != nil {
		u.Scheme = "rediss"
	}
	if o.Username != "" {
		u.User = url.User(o.Username)
	}
	return "cluster " + u.String()
}
