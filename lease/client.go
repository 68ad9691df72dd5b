package lease

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tlsfiles"
)

// pingTimeout bounds each PING of PingRedis whose ctx has no earlier
// deadline.
const pingTimeout = 5 * time.Second

// RedisConfig says how to reach the Redis that holds the pools: managed
// Redis (ElastiCache with AUTH or ACL users and in-transit encryption,
// Azure Cache for Redis, Redis Cloud), a self-run one with Sentinel, or
// a Redis Cluster (ElastiCache in cluster mode, Memorystore for Redis
// Cluster, Azure Cache for Redis with clustering, a self-run cluster).
// OpenRedis validates it and builds the go-redis clients that New,
// EnsurePool, SetPool and Status take.
//
// Give either Addrs (with Cluster or not) or SentinelMaster with
// SentinelAddrs. String, GoString and LogValue never show a password.
type RedisConfig struct {
	// Addrs are the Redis masters, each "host:port" or a URL in go-redis's
	// ParseURL form: redis://[user[:password]@]host[:port][/db][?options],
	// or rediss:// for TLS. Several are independent masters forming a
	// Redlock quorum (a lock needs len/2+1 of them), as with New; split a
	// comma-separated flag before. A URL's own user, password and
	// database win over Username, Password and DB. With Cluster they are
	// seed nodes of one cluster instead.
	Addrs []string
	// Cluster says Addrs are seed nodes of one Redis Cluster: OpenRedis
	// returns one go-redis cluster client, which learns the other nodes
	// and the slots from them (CLUSTER SLOTS) and follows the cluster
	// through failovers and resharding. The seeds must agree on user,
	// password and TLS; the database must be 0. A pool's keys then share
	// a hash tag (see the package doc, "Redis Cluster"). Default false.
	Cluster bool
	// Username is the ACL user (Redis 6 and later) for addresses that name
	// none. Default: none, which is Redis's "default" user.
	Username string
	// Password is the password (AUTH, or the ACL user's) for addresses
	// whose URL has none, and for the master behind Sentinel. Read it from
	// the environment or a file, never from a command-line flag. Default
	// none.
	Password string
	// DB is the database of host:port addresses and of the master behind
	// Sentinel. Default 0.
	DB int
	// TLS encrypts the connections to host:port addresses and to Sentinel
	// and its master; a rediss:// URL always does, a redis:// one never
	// (and then the TLS settings below are an error). Any of CAFile,
	// CertFile, KeyFile, ServerName and InsecureSkipVerify turns it on too.
	// Default false.
	TLS bool
	// CAFile is a PEM file of the CA certificates that sign the servers'
	// certificates. Default: the system's roots.
	CAFile string
	// CertFile and KeyFile are PEM files of a client certificate and its
	// unencrypted key, for servers that ask for one (tls-auth-clients).
	// Both or neither.
	CertFile string
	KeyFile  string
	// ServerName is the name the servers' certificates must hold. Default:
	// the host of each address.
	ServerName string
	// InsecureSkipVerify accepts any server certificate. For tests only.
	InsecureSkipVerify bool
	// SentinelMaster is the name of the master Redis Sentinel monitors
	// ("mymaster"). With it, OpenRedis returns one go-redis failover
	// client that asks SentinelAddrs for the master and follows it through
	// failovers.
	SentinelMaster string
	// SentinelAddrs are the Sentinels, "host:port".
	SentinelAddrs []string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// themselves, when they require it. Default none.
	SentinelUsername string
	SentinelPassword string
}

// tlsOn reports whether a setting asks for TLS.
func (c RedisConfig) tlsOn() bool {
	return c.TLS || c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != "" || c.InsecureSkipVerify
}

// String describes c without its passwords, e.g. `redis 127.0.0.1:6379,
// rediss://sluice:xxxxx@cache:6380/0, user "sluice", password set`.
func (c RedisConfig) String() string {
	var parts []string
	if c.SentinelMaster != "" || len(c.SentinelAddrs) > 0 {
		parts = append(parts, fmt.Sprintf("sentinel master %q via %s", c.SentinelMaster, strings.Join(c.SentinelAddrs, ",")))
	}
	if len(c.Addrs) > 0 {
		addrs := make([]string, len(c.Addrs))
		for i, a := range c.Addrs {
			addrs[i] = redactAddr(a)
		}
		kind := "redis "
		if c.Cluster {
			kind = "redis cluster "
		}
		parts = append(parts, kind+strings.Join(addrs, ","))
	}
	if c.Username != "" {
		parts = append(parts, "user "+strconv.Quote(c.Username))
	}
	if c.Password != "" {
		parts = append(parts, "password set")
	}
	if c.DB != 0 {
		parts = append(parts, "db "+strconv.Itoa(c.DB))
	}
	if c.tlsOn() {
		parts = append(parts, "TLS")
	}
	if c.CAFile != "" {
		parts = append(parts, "CA file "+c.CAFile)
	}
	if c.CertFile != "" {
		parts = append(parts, "client certificate "+c.CertFile)
	}
	if c.ServerName != "" {
		parts = append(parts, "server name "+c.ServerName)
	}
	if c.InsecureSkipVerify {
		parts = append(parts, "certificate NOT verified")
	}
	if c.SentinelUsername != "" {
		parts = append(parts, "sentinel user "+strconv.Quote(c.SentinelUsername))
	}
	if c.SentinelPassword != "" {
		parts = append(parts, "sentinel password set")
	}
	if len(parts) == 0 {
		return "no redis address"
	}
	return strings.Join(parts, ", ")
}

// GoString is String, so that %#v does not print a password either.
func (c RedisConfig) GoString() string { return "lease.RedisConfig{" + c.String() + "}" }

// LogValue is String, so that a structured log never holds a password.
func (c RedisConfig) LogValue() slog.Value { return slog.StringValue(c.String()) }

// redactAddr returns addr with the password of a URL replaced by "xxxxx";
// a string that does not parse as a URL shows only its scheme.
func redactAddr(addr string) string {
	if !strings.Contains(addr, "://") {
		return addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		scheme, _, _ := strings.Cut(addr, "://")
		return scheme + "://(unparsable)"
	}
	return u.Redacted()
}

// OpenRedis validates cfg, reads its certificate files and returns
// its go-redis clients: one per address of Addrs (independent masters, in
// order), one cluster client for Cluster, or one failover client for
// SentinelMaster. It does not connect;
// call PingRedis to check the connections at start-up. Errors wrap
// ErrInvalidConfig, name the address at fault (with its password
// redacted) and never hold a password. The caller closes the clients.
func OpenRedis(cfg RedisConfig) ([]redis.UniversalClient, error) {
	var base *tls.Config
	if cfg.tlsOn() {
		var err error
		if base, err = redisTLSConfig(cfg); err != nil {
			return nil, err
		}
	}
	switch {
	case cfg.SentinelMaster != "" && len(cfg.Addrs) > 0:
		return nil, fmt.Errorf("%w: redis: give addresses or a Sentinel master, not both", ErrInvalidConfig)
	case cfg.Cluster && (cfg.SentinelMaster != "" || len(cfg.SentinelAddrs) > 0):
		return nil, fmt.Errorf("%w: redis: a Redis Cluster or Sentinel, not both (a cluster fails over by itself)", ErrInvalidConfig)
	case cfg.SentinelMaster != "":
		return sentinelClients(cfg, base)
	case len(cfg.SentinelAddrs) > 0:
		return nil, fmt.Errorf("%w: redis: Sentinel addresses without a master name", ErrInvalidConfig)
	case len(cfg.Addrs) == 0:
		return nil, fmt.Errorf("%w: redis: no address", ErrInvalidConfig)
	case cfg.Cluster:
		return clusterClients(cfg, base)
	}
	opts := make([]*redis.Options, len(cfg.Addrs))
	for i, addr := range cfg.Addrs {
		o, err := cfg.options(strings.TrimSpace(addr), base)
		if err != nil {
			return nil, fmt.Errorf("%w: redis address %d of %d (%s): %w", ErrInvalidConfig, i+1, len(cfg.Addrs), redactAddr(addr), err)
		}
		opts[i] = o
	}
	clients := make([]redis.UniversalClient, len(opts))
	for i, o := range opts {
		clients[i] = redis.NewClient(o)
	}
	return clients, nil
}

// options builds the go-redis options of one address.
func (cfg RedisConfig) options(addr string, base *tls.Config) (*redis.Options, error) {
	var o *redis.Options
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			// url.Error quotes the whole URL, password included: keep
			// only the reason.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return nil, fmt.Errorf("not a valid URL: %w", err)
		}
		switch u.Scheme {
		case "rediss":
		case "redis":
			if base != nil {
				return nil, errors.New("TLS settings for a redis:// URL: use rediss://")
			}
		default:
			return nil, fmt.Errorf("scheme %q: want redis:// or rediss://", u.Scheme)
		}
		if o, err = redis.ParseURL(addr); err != nil {
			msg := err.Error()
			if pw, ok := u.User.Password(); ok && pw != "" {
				msg = strings.ReplaceAll(msg, pw, "xxxxx")
			}
			return nil, errors.New(msg)
		}
	} else {
		if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
			return nil, errors.New(`want "host:port" or a redis:// or rediss:// URL`)
		}
		o = &redis.Options{Addr: addr, DB: cfg.DB}
		if base != nil {
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
	// CLIENT SETINFO labels a connection in CLIENT LIST only, and costs two
	// commands on every new connection.
	o.DisableIdentity = true
	if o.Username == "" {
		o.Username = cfg.Username
	}
	if o.Password == "" {
		o.Password = cfg.Password
	}
	if o.TLSConfig != nil && base != nil {
		o.TLSConfig = mergeTLS(o.TLSConfig, base)
	}
	return o, nil
}

// mergeTLS returns a copy of from (go-redis's, from a URL) with what cfg's
// TLS settings add: roots, client certificate, server name, skip-verify.
func mergeTLS(from, base *tls.Config) *tls.Config {
	out := from.Clone()
	if base.RootCAs != nil {
		out.RootCAs = base.RootCAs
	}
	if len(base.Certificates) > 0 {
		out.Certificates = base.Certificates
	}
	if base.ServerName != "" {
		out.ServerName = base.ServerName
	}
	out.InsecureSkipVerify = out.InsecureSkipVerify || base.InsecureSkipVerify //nolint:gosec // documented as tests only
	return out
}

// sentinelClients builds the failover client of cfg.
func sentinelClients(cfg RedisConfig, base *tls.Config) ([]redis.UniversalClient, error) {
	if len(cfg.SentinelAddrs) == 0 {
		return nil, fmt.Errorf("%w: redis: Sentinel master %q without Sentinel addresses", ErrInvalidConfig, cfg.SentinelMaster)
	}
	for _, a := range cfg.SentinelAddrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return nil, fmt.Errorf(`%w: redis: Sentinel address %q: want "host:port"`, ErrInvalidConfig, a)
		}
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:       cfg.SentinelMaster,
		SentinelAddrs:    cfg.SentinelAddrs,
		SentinelUsername: cfg.SentinelUsername,
		SentinelPassword: cfg.SentinelPassword,
		Username:         cfg.Username,
		Password:         cfg.Password,
		DB:               cfg.DB,
		TLSConfig:        base,
		DisableIdentity:  true,
	})
	desc := fmt.Sprintf("sentinel master %q via %s", cfg.SentinelMaster, strings.Join(cfg.SentinelAddrs, ","))
	if cfg.Username != "" {
		desc += fmt.Sprintf(" (user %q)", cfg.Username)
	}
	return []redis.UniversalClient{&sentinelClient{Client: c, master: cfg.SentinelMaster, desc: desc}}, nil
}

// sentinelClient is go-redis's failover client with, for messages, the
// master and Sentinels it follows (its Options show neither).
type sentinelClient struct {
	*redis.Client
	master string
	desc   string
}

// redisTLSConfig builds the client TLS configuration of cfg.
func redisTLSConfig(cfg RedisConfig) (*tls.Config, error) {
	tc, err := tlsfiles.Files{CAFile: cfg.CAFile, CertFile: cfg.CertFile, KeyFile: cfg.KeyFile,
		ServerName: cfg.ServerName, InsecureSkipVerify: cfg.InsecureSkipVerify}.Config()
	if err != nil {
		return nil, fmt.Errorf("%w: redis %w", ErrInvalidConfig, err)
	}
	return tc, nil
}

// RedisError is a failure to reach one Redis, naming it without its
// password.
type RedisError struct {
	// Addr names the Redis: "host:port", a URL with its password
	// redacted (redis://user@host:port/db, rediss://… for TLS), the
	// Sentinel master and Sentinels, or "cluster" and a cluster's seeds.
	Addr string
	// Err is the cause.
	Err error
}

func (e *RedisError) Error() string {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		verify           *tls.CertificateVerificationError
		header           tls.RecordHeaderError
		op               *net.OpError
	)
	switch {
	case redis.IsAuthError(e.Err):
		return fmt.Sprintf("redis %s: authentication failed (wrong username or password, or the user is disabled): %v", e.Addr, e.Err)
	case redis.IsPermissionError(e.Err):
		return fmt.Sprintf("redis %s: permission denied (the ACL user may not run this command or touch this key): %v", e.Addr, e.Err)
	case errors.As(e.Err, &unknownAuthority), errors.As(e.Err, &hostname), errors.As(e.Err, &verify),
		errors.As(e.Err, &header), errors.As(e.Err, &op) && op.Op == "remote error":
		return fmt.Sprintf("redis %s: TLS handshake failed: %v", e.Addr, e.Err)
	}
	return fmt.Sprintf("redis %s: %v", e.Addr, e.Err)
}

func (e *RedisError) Unwrap() error { return e.Err }

// configMistake reports whether err comes from a setting that retrying
// will not mend: credentials, ACL permissions, certificates.
func configMistake(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		verify           *tls.CertificateVerificationError
	)
	return redis.IsAuthError(err) || redis.IsPermissionError(err) ||
		errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &verify)
}

// describeClient names c for messages, never with its password.
func describeClient(c redis.UniversalClient) string {
	switch c := c.(type) {
	case *sentinelClient:
		return c.desc
	case *redis.ClusterClient:
		return describeCluster(c)
	case *redis.Client:
		o := c.Options()
		u := url.URL{Scheme: "redis", Host: o.Addr, Path: "/" + strconv.Itoa(o.DB)}
		if o.TLSConfig != nil {
			u.Scheme = "rediss"
		}
		if o.Username != "" {
			u.User = url.User(o.Username)
		}
		return u.String()
	}
	return fmt.Sprintf("%T", c)
}

// PingRedis sends PING to each client at once, each bounded by ctx and
// 5 s: a start-up check that fails fast. It returns nil when a quorum
// (len/2+1) answers and none answered with a mistake that retrying will
// not mend — a wrong password or disabled user ("authentication
// failed"), an ACL refusal, a certificate that does not verify. Otherwise
// it returns each failure as a *RedisError naming the address (password
// redacted), joined.
func PingRedis(ctx context.Context, clients ...redis.UniversalClient) error {
	if len(clients) == 0 {
		return fmt.Errorf("%w: redis: no client", ErrInvalidConfig)
	}
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, pingTimeout)
			defer cancel()
			if err := c.Ping(pctx).Err(); err != nil {
				if sc, ok := c.(*sentinelClient); ok && errors.Is(err, redis.Nil) {
					// go-redis's word for "no Sentinel answered with an
					// address for this master name".
					err = fmt.Errorf("no Sentinel names a master %q (is the name right?): %w", sc.master, err)
				}
				errs[i] = &RedisError{Addr: describeClient(c), Err: err}
			}
		})
	}
	wg.Wait()
	failed, mistake := 0, false
	for _, err := range errs {
		if err != nil {
			failed++
			mistake = mistake || configMistake(err)
		}
	}
	if failed == 0 || (!mistake && len(clients)-failed >= len(clients)/2+1) {
		return nil
	}
	return errors.Join(errs...)
}

// connectTimeout bounds Connect's check that a quorum answers.
const connectTimeout = 10 * time.Second

// Connect opens the clients cfg describes (OpenRedis) and checks, within
// 10 s, that a quorum answers with the credentials given (PingRedis), so
// that a wrong password fails at start-up instead of being retried in
// silence. go-redis's own log lines go to log from then on (go-redis keeps
// one logger per process). An invalid cfg wraps ErrInvalidConfig.
func Connect(ctx context.Context, cfg RedisConfig, log *slog.Logger) ([]redis.UniversalClient, error) {
	redis.SetLogger(RedisLogs(log))
	clients, err := OpenRedis(cfg)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := PingRedis(pctx, clients...); err != nil {
		for _, c := range clients {
			_ = c.Close()
		}
		return nil, err
	}
	return clients, nil
}
