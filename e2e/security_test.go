//go:build e2e

package e2e

// The secured services, as managed Kafka and Redis ask a client to connect:
// a bulk load of the USGS file (or a worker draining it) through each, and
// a wrong password (or certificate) for each, which must fail at start-up
// with a message naming the broker or address and how sluice connected,
// and never print a secret. make e2e starts the broker and redis-server in
// their secured modes (SLUICE_KAFKA_SECURE=1, SLUICE_REDIS_SECURE=1): the
// plaintext listener and port the other cases use stay as they were.

import (
	"cmp"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every load goes through a pool of this many records/s (about 2.3 s of
// sending for the USGS file), in 10 partitions.
const (
	secureCapacity   = 4000
	securePartitions = 10
)

// failFast is how soon a command with a wrong password or certificate must
// have exited: its start-up checks answer at the first refusal (seen:
// well under a second), long before their 10 s timeouts.
const failFast = 5 * time.Second

// securedServices is where the secured listeners of the broker and Redis
// are and what they accept: the variables scripts/kafka.sh and
// scripts/redis.sh read, with their defaults, around the harness's
// SLUICE_E2E_BROKERS and SLUICE_E2E_REDIS_ADDR.
type securedServices struct {
	saslSSL, ssl, mtls       string // Kafka listeners, "127.0.0.1:port"
	kafkaUser, kafkaPassword string
	kafkaTLS                 string // ca.pem, client.crt, client.key

	redisPlain, redisTLS, sentinel string // "127.0.0.1:port"
	sentinelMaster                 string
	redisUser, redisPassword       string
	redisTLSDir                    string
}

func secured(t *testing.T) securedServices {
	t.Helper()
	cache := cmp.Or(os.Getenv("SLUICE_CACHE"), ".cache")
	if !filepath.IsAbs(cache) {
		cache = filepath.Join("..", cache) // the tests run in e2e/
	}
	kafkaPort := cmp.Or(os.Getenv("SLUICE_KAFKA_PORT"), portOf(t, strings.Split(brokers, ",")[0]))
	redisHost := redisAddr
	if strings.Contains(redisHost, "://") {
		u, err := url.Parse(redisHost)
		require.NoError(t, err, "SLUICE_E2E_REDIS_ADDR")
		redisHost = u.Host
	}
	redisPort := portOf(t, redisHost)
	at := func(variable, port string, offset int) string {
		n, err := strconv.Atoi(port)
		require.NoError(t, err)
		return "127.0.0.1:" + cmp.Or(os.Getenv(variable), strconv.Itoa(n+offset))
	}
	s := securedServices{
		saslSSL:       at("SLUICE_KAFKA_SASL_SSL_PORT", kafkaPort, 2),
		ssl:           at("SLUICE_KAFKA_SSL_PORT", kafkaPort, 3),
		mtls:          at("SLUICE_KAFKA_MTLS_PORT", kafkaPort, 4),
		kafkaUser:     cmp.Or(os.Getenv("SLUICE_KAFKA_SASL_USERNAME"), "sluice"),
		kafkaPassword: cmp.Or(os.Getenv("SLUICE_KAFKA_SASL_PASSWORD"), "sluice-test-password"),
		kafkaTLS:      filepath.Join(cache, "kafka", "broker-"+kafkaPort, "tls"),

		redisPlain:     redisHost,
		redisTLS:       at("SLUICE_REDIS_TLS_PORT", redisPort, 1),
		sentinel:       at("SLUICE_REDIS_SENTINEL_PORT", redisPort, 2),
		sentinelMaster: cmp.Or(os.Getenv("SLUICE_REDIS_SENTINEL_MASTER"), "sluice"),
		redisUser:      cmp.Or(os.Getenv("SLUICE_REDIS_USERNAME"), "sluice"),
		redisPassword:  cmp.Or(os.Getenv("SLUICE_REDIS_PASSWORD"), "sluice-test-password"),
		redisTLSDir:    filepath.Join(cache, "redis", "tls"),
	}
	for _, f := range []string{filepath.Join(s.kafkaTLS, "ca.pem"), filepath.Join(s.redisTLSDir, "ca.pem")} {
		_, err := os.Stat(f)
		require.NoError(t, err, "no test CA: start the services with SLUICE_KAFKA_SECURE=1 scripts/kafka.sh start and SLUICE_REDIS_SECURE=1 scripts/redis.sh start (make e2e does)")
	}
	return s
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "%q", addr)
	return port
}

func (s securedServices) kafkaFile(name string) string { return filepath.Join(s.kafkaTLS, name) }
func (s securedServices) redisFile(name string) string { return filepath.Join(s.redisTLSDir, name) }

// setFlag sets the value of flag in args, which must hold it.
func setFlag(t *testing.T, args []string, flag, value string) []string {
	t.Helper()
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			args[i+1] = value
			return args
		}
	}
	require.Failf(t, "no flag", "%s is not in %v", flag, args)
	return nil
}

// dropFlag removes flag and its value from args.
func dropFlag(args []string, flag string) []string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return append(args[:i:i], args[i+2:]...)
		}
	}
	return args
}

// secretFile writes secret to a file only the owner reads.
func secretFile(t *testing.T, secret string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "password")
	require.NoError(t, os.WriteFile(path, []byte(secret+"\n"), 0o600))
	return path
}

// requireNoSecret fails when out holds any of the secrets.
func requireNoSecret(t *testing.T, out string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		require.NotEmpty(t, s)
		require.NotContains(t, out, s, "a secret in the output")
	}
}

// logOf is the whole output of a process the env started.
func logOf(t *testing.T, p *proc) string {
	t.Helper()
	data, err := os.ReadFile(p.log)
	require.NoError(t, err)
	return string(data)
}

// secureBulkLoad bulk-loads the USGS file with conn, the flags of the
// secured connection (the env's --brokers set to brokers and its
// --redis-addr to redis, or dropped when redis is empty), and checks that
// every record was stored once and no sliding second went over the
// capacity. It returns the command's output.
func (e *env) secureBulkLoad(t *testing.T, kafkaBrokers, redis string, conn ...string) string {
	t.Helper()
	args, summary, _ := e.bulkLoadArgs(e.sim, usgs, conn...)
	args = setFlag(t, args, "--brokers", kafkaBrokers)
	if redis != "" {
		args = setFlag(t, args, "--redis-addr", redis)
	} else {
		args = dropFlag(args, "--redis-addr")
	}
	code, out := e.run(3*time.Minute, args...)
	require.Equal(t, 0, code, out)
	s := readSummaryFile(t, summary)
	st := e.stats()
	require.EqualValues(t, usgsRecords, s.RecordsDelivered)
	require.EqualValues(t, usgsRecords, st.Accepted, "every record at the sink")
	require.Zero(t, st.Duplicates, "every record once")
	e.report(st)
	return out
}

// secureWorker runs a worker with conn (and --brokers, --redis-addr as in
// secureBulkLoad) until it has drained the USGS file, produced by sluice
// produce with produceArgs (nil: through the plaintext listener), then
// stops it with SIGTERM: it must exit 0. It returns the output of both.
func (e *env) secureWorker(t *testing.T, kafkaBrokers, redis string, produceArgs []string, conn ...string) string {
	t.Helper()
	args := append([]string{"worker", "--worker-id", "w1"}, e.common()...)
	args = setFlag(t, args, "--brokers", kafkaBrokers)
	if redis != "" {
		args = setFlag(t, args, "--redis-addr", redis)
	} else {
		args = dropFlag(args, "--redis-addr")
	}
	w := e.start("w1", append(args, conn...)...)
	e.awaitGroup(1)
	var produced string
	if produceArgs == nil {
		e.produce(0)
	} else {
		code, out := e.run(2*time.Minute, append(append([]string{"produce", "--topic", e.name, "--id-field", "id"}, produceArgs...), usgs)...)
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "produced 9366 records")
		produced = out
	}
	st := e.awaitAccepted(usgsRecords, 2*time.Minute)
	require.Zero(t, st.Duplicates, "every record once")
	e.report(st)
	w.signal(t, syscall.SIGTERM)
	code, ok := w.wait(30 * time.Second)
	require.True(t, ok, "the worker did not stop on SIGTERM")
	require.Equal(t, 0, code, "a clean stop")
	return produced + logOf(t, w)
}

// failsFast runs args with the env's variables and checks that it exits 1
// within failFast, saying every one of want and none of the secrets.
func (e *env) failsFast(t *testing.T, args []string, want []string, secrets ...string) {
	t.Helper()
	began := time.Now()
	code, out := e.run(time.Minute, args...)
	took := time.Since(began)
	t.Logf("%s exited %d after %v: %s", args[0], code, took.Round(time.Millisecond), strings.TrimSpace(out))
	require.Equal(t, 1, code, out)
	require.Less(t, took, failFast, "fails at start-up, not after retries")
	for _, w := range want {
		require.Contains(t, out, w)
	}
	requireNoSecret(t, out, secrets...)
}

// The USGS file through Kafka's SASL_SSL listener with SCRAM: a bulk load
// with SCRAM-SHA-512 and the password in SLUICE_KAFKA_SASL_PASSWORD, and
// produce then a worker with SCRAM-SHA-256 and the password in a file;
// with a wrong password, bulk-load and worker exit 1 at once naming the
// broker and the mechanism. The password is in no output.
func TestKafkaSASLSCRAM(t *testing.T) {
	s := secured(t)
	tls := []string{"--kafka-ca-file", s.kafkaFile("ca.pem")}
	scram := func(mech string) []string {
		return append([]string{"--kafka-sasl-mechanism", mech, "--kafka-sasl-username", s.kafkaUser}, tls...)
	}

	t.Run("SCRAM-SHA-512 bulk-load", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		e.vars = []string{"SLUICE_KAFKA_SASL_PASSWORD=" + s.kafkaPassword}
		out := e.secureBulkLoad(t, s.saslSSL, e.redis, scram("SCRAM-SHA-512")...)
		requireNoSecret(t, out, s.kafkaPassword)
	})

	t.Run("SCRAM-SHA-256 produce and worker", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		conn := append(scram("SCRAM-SHA-256"), "--kafka-sasl-password-file", secretFile(t, s.kafkaPassword))
		out := e.secureWorker(t, s.saslSSL, e.redis, append([]string{"--brokers", s.saslSSL}, conn...), conn...)
		requireNoSecret(t, out, s.kafkaPassword)
	})

	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()
		const wrong = "not-the-kafka-password-5e2"
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		e.vars = []string{"SLUICE_KAFKA_SASL_PASSWORD=" + wrong}
		want := []string{
			"kafka broker " + s.saslSSL + ` (SASL_SSL, SCRAM-SHA-512, user "` + s.kafkaUser + `")`,
			"SASL authentication failed", "wrong username or password",
		}
		args, _, _ := e.bulkLoadArgs(e.sim, usgs, scram("SCRAM-SHA-512")...)
		e.failsFast(t, setFlag(t, args, "--brokers", s.saslSSL), want, wrong, s.kafkaPassword)
		worker := append(append([]string{"worker"}, e.common()...), scram("SCRAM-SHA-512")...)
		e.failsFast(t, setFlag(t, worker, "--brokers", s.saslSSL), want, wrong, s.kafkaPassword)
	})
}

// The USGS file through Kafka's TLS listeners: a bulk load over TLS that
// verifies the broker with the test CA, and one over the listener that
// requires a client certificate (mTLS). A broker whose CA is not trusted,
// and the mTLS listener without a client certificate, fail at start-up
// naming the broker and the TLS handshake; the client key is in no output.
func TestKafkaTLS(t *testing.T) {
	s := secured(t)
	key, err := os.ReadFile(s.kafkaFile("client.key"))
	require.NoError(t, err)
	keyBody := strings.Split(strings.TrimSpace(string(key)), "\n")[1] // a line of the key itself

	t.Run("TLS bulk-load", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		e.secureBulkLoad(t, s.ssl, e.redis, "--kafka-ca-file", s.kafkaFile("ca.pem"))
	})

	t.Run("mTLS bulk-load", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		out := e.secureBulkLoad(t, s.mtls, e.redis, "--kafka-ca-file", s.kafkaFile("ca.pem"),
			"--kafka-cert-file", s.kafkaFile("client.crt"), "--kafka-key-file", s.kafkaFile("client.key"))
		requireNoSecret(t, out, keyBody)
	})

	t.Run("untrusted or missing certificates", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		bulk := func(broker string, conn ...string) []string {
			args, _, _ := e.bulkLoadArgs(e.sim, usgs, conn...)
			return setFlag(t, args, "--brokers", broker)
		}
		e.failsFast(t, bulk(s.ssl, "--kafka-tls"),
			[]string{"kafka broker " + s.ssl + " (SSL): TLS handshake failed", "certificate signed by unknown authority"}, keyBody)
		e.failsFast(t, bulk(s.mtls, "--kafka-ca-file", s.kafkaFile("ca.pem")),
			[]string{"kafka broker " + s.mtls + " (SSL): TLS handshake failed", "does it require a client certificate (mTLS)?"}, keyBody)
	})
}

// The USGS file with the pools in Redis as its ACL user (keys sluice:*
// only, no dangerous commands): a bulk load with redis://user@host and the
// password in SLUICE_REDIS_PASSWORD, and a worker that finds the master
// through Sentinel with the password in a file. A wrong password fails at
// start-up naming the address and the user; the password is in no output.
func TestRedisAuth(t *testing.T) {
	s := secured(t)
	userURL := "redis://" + s.redisUser + "@" + s.redisPlain

	t.Run("ACL user bulk-load", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		e.vars = []string{"SLUICE_REDIS_PASSWORD=" + s.redisPassword}
		e.redis = userURL
		out := e.secureBulkLoad(t, brokers, userURL)
		requireNoSecret(t, out, s.redisPassword)
		st := e.pool() // pool status as the ACL user: the pool, released
		require.EqualValues(t, secureCapacity, st.Pool.Capacity)
		require.Empty(t, holders(st), "every lease released")
	})

	t.Run("Sentinel worker", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		out := e.secureWorker(t, brokers, "", nil,
			"--redis-sentinel-master", s.sentinelMaster, "--redis-sentinel-addrs", s.sentinel,
			"--redis-username", s.redisUser, "--redis-password-file", secretFile(t, s.redisPassword))
		requireNoSecret(t, out, s.redisPassword)
	})

	t.Run("wrong password", func(t *testing.T) {
		t.Parallel()
		const wrong = "not-the-redis-password-9c4"
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		e.vars = []string{"SLUICE_REDIS_PASSWORD=" + wrong}
		want := []string{"redis " + userURL + "/0: authentication failed", "wrong username or password", "WRONGPASS"}
		args, _, _ := e.bulkLoadArgs(e.sim, usgs)
		e.failsFast(t, setFlag(t, args, "--redis-addr", userURL), want, wrong, s.redisPassword)
		worker := append([]string{"worker"}, e.common()...)
		e.failsFast(t, setFlag(t, worker, "--redis-addr", userURL), want, wrong, s.redisPassword)
		// In the URL itself: redacted in the message.
		inURL := "redis://" + s.redisUser + ":" + wrong + "@" + s.redisPlain
		e.vars = nil
		e.failsFast(t, setFlag(t, worker, "--redis-addr", inURL), want, wrong, s.redisPassword)
	})
}

// The USGS file with the pools in Redis over TLS: a bulk load through a
// rediss:// URL verified with the test CA, and a worker that also sends a
// client certificate and verifies the server by name. A wrong password
// over TLS, and a server whose CA is not trusted, fail at start-up naming
// the address; the password and the client key are in no output.
func TestRedisTLS(t *testing.T) {
	s := secured(t)
	tlsURL := "rediss://" + s.redisUser + "@" + s.redisTLS
	key, err := os.ReadFile(s.redisFile("client.key"))
	require.NoError(t, err)
	keyBody := strings.Split(strings.TrimSpace(string(key)), "\n")[1]

	t.Run("rediss bulk-load", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		e.vars = []string{"SLUICE_REDIS_PASSWORD=" + s.redisPassword}
		out := e.secureBulkLoad(t, brokers, tlsURL, "--redis-ca-file", s.redisFile("ca.pem"))
		requireNoSecret(t, out, s.redisPassword)
	})

	t.Run("client certificate worker", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		e.vars = []string{"SLUICE_REDIS_PASSWORD=" + s.redisPassword}
		byName := "rediss://" + s.redisUser + "@localhost:" + portOf(t, s.redisTLS)
		out := e.secureWorker(t, brokers, byName, nil, "--redis-ca-file", s.redisFile("ca.pem"),
			"--redis-cert-file", s.redisFile("client.crt"), "--redis-key-file", s.redisFile("client.key"))
		requireNoSecret(t, out, s.redisPassword, keyBody)
	})

	t.Run("wrong password or untrusted server", func(t *testing.T) {
		t.Parallel()
		const wrong = "not-the-redis-password-3f1"
		e := newEnv(t, secureCapacity, securePartitions, 5*time.Second)
		args, _, _ := e.bulkLoadArgs(e.sim, usgs, "--redis-ca-file", s.redisFile("ca.pem"))
		args = setFlag(t, args, "--redis-addr", tlsURL)
		e.vars = []string{"SLUICE_REDIS_PASSWORD=" + wrong}
		e.failsFast(t, args, []string{"redis " + tlsURL + "/0: authentication failed", "WRONGPASS"}, wrong, s.redisPassword)
		e.vars = []string{"SLUICE_REDIS_PASSWORD=" + s.redisPassword}
		args = dropFlag(args, "--redis-ca-file")
		e.failsFast(t, args, []string{"redis " + tlsURL + "/0: TLS handshake failed", "certificate signed by unknown authority"}, s.redisPassword)
	})
}
