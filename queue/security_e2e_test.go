//go:build e2e

// These tests need the broker's secured listeners, started with
//
//	SLUICE_KAFKA_SECURE=1 scripts/kafka.sh start
//
// and read the same variables as that script, with the same defaults:
// SLUICE_KAFKA_PORT (19092; the SASL_SSL, SSL and MTLS listeners are on
// port + 2, + 3 and + 4 unless SLUICE_KAFKA_SASL_SSL_PORT,
// SLUICE_KAFKA_SSL_PORT and SLUICE_KAFKA_MTLS_PORT say otherwise),
// SLUICE_KAFKA_SASL_USERNAME (sluice), SLUICE_KAFKA_SASL_PASSWORD
// (sluice-test-password) and SLUICE_CACHE (the repository's .cache), where
// the script leaves the certificates. Run them with
//
//	go test -tags e2e -run Secure ./queue/

package queue

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// secureKafka is where the secured broker listens and what it accepts.
type secureKafka struct {
	saslSSL, ssl, mtls string // "127.0.0.1:port"
	user, password     string
	tlsDir             string // ca.pem, client.crt, client.key
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func secureKafkaEnv(t *testing.T) secureKafka {
	t.Helper()
	port, err := strconv.Atoi(envOr("SLUICE_KAFKA_PORT", "19092"))
	require.NoError(t, err, "SLUICE_KAFKA_PORT")
	addr := func(name string, offset int) string {
		return "127.0.0.1:" + envOr(name, strconv.Itoa(port+offset))
	}
	cache := envOr("SLUICE_CACHE", ".cache")
	if !filepath.IsAbs(cache) {
		cache = filepath.Join("..", cache) // the tests run in queue/
	}
	k := secureKafka{
		saslSSL:  addr("SLUICE_KAFKA_SASL_SSL_PORT", 2),
		ssl:      addr("SLUICE_KAFKA_SSL_PORT", 3),
		mtls:     addr("SLUICE_KAFKA_MTLS_PORT", 4),
		user:     envOr("SLUICE_KAFKA_SASL_USERNAME", "sluice"),
		password: envOr("SLUICE_KAFKA_SASL_PASSWORD", "sluice-test-password"),
		tlsDir:   filepath.Join(cache, "kafka", "broker-"+strconv.Itoa(port), "tls"),
	}
	_, err = os.Stat(k.file("ca.pem"))
	require.NoError(t, err, "no test CA: start the broker with SLUICE_KAFKA_SECURE=1 scripts/kafka.sh start")
	return k
}

func (k secureKafka) file(name string) string { return filepath.Join(k.tlsDir, name) }

// TestSecureProduceConsume produces, consumes, commits and dead-letters
// through each secured listener and mechanism, with every Kafka user of
// the package (Admin, Producer, DeadLetterWriter, Source) on the same Conn.
func TestSecureProduceConsume(t *testing.T) {
	k := secureKafkaEnv(t)
	cases := []struct {
		name    string
		broker  string
		sec     Security
		wantStr string
	}{
		{"SASL_SSL/PLAIN", k.saslSSL, Security{CAFile: k.file("ca.pem"), SASLMechanism: "PLAIN", Username: k.user, Password: k.password},
			`SASL_SSL, PLAIN, user "` + k.user + `"`},
		{"SASL_SSL/SCRAM-SHA-256", k.saslSSL, Security{CAFile: k.file("ca.pem"), SASLMechanism: "scram-sha-256", Username: k.user, Password: k.password},
			`SASL_SSL, SCRAM-SHA-256, user "` + k.user + `"`},
		{"SASL_SSL/SCRAM-SHA-512", k.saslSSL, Security{CAFile: k.file("ca.pem"), SASLMechanism: "SCRAM-SHA-512", Username: k.user, Password: k.password},
			`SASL_SSL, SCRAM-SHA-512, user "` + k.user + `"`},
		{"SSL", k.ssl, Security{TLS: true, CAFile: k.file("ca.pem")}, "SSL"},
		{"SSL/ServerName", k.ssl, Security{CAFile: k.file("ca.pem"), ServerName: "localhost"}, "SSL"},
		{"MTLS", k.mtls, Security{CAFile: k.file("ca.pem"), CertFile: k.file("client.crt"), KeyFile: k.file("client.key")},
			"SSL, client certificate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn, err := NewConn(tc.sec)
			require.NoError(t, err)
			require.Equal(t, tc.wantStr, conn.String())
			brokers := []string{tc.broker}
			ctx := testContext(t)
			require.NoError(t, Check(ctx, brokers, conn))

			admin := Admin{Brokers: brokers, Conn: conn}
			require.NoError(t, admin.Ping(ctx))
			topic := fmt.Sprintf("secure-%s-%d", strings.NewReplacer("/", "-", "_", "-").Replace(strings.ToLower(tc.name)), time.Now().UnixNano())
			require.NoError(t, admin.EnsureTopic(ctx, topic, 2))
			require.NoError(t, admin.EnsureTopic(ctx, DeadLetterTopic(topic), 1))

			const n = 20
			p, err := NewProducer(ProducerConfig{Brokers: brokers, Conn: conn, Logger: testLogger()})
			require.NoError(t, err)
			recs := make([]ingest.Record, n)
			for i := range recs {
				recs[i] = ingest.Record{ID: fmt.Sprintf("r%d", i), Value: fmt.Appendf(nil, `{"n":%d}`, i)}
			}
			require.NoError(t, p.Produce(ctx, topic, recs))
			require.NoError(t, p.Close())
			end, err := admin.EndOffsets(ctx, topic)
			require.NoError(t, err)
			require.Equal(t, int64(n), end[0]+end[1])

			group := "g-" + topic
			src, err := NewSource(SourceConfig{
				Brokers: brokers, Conn: conn, Topic: topic, Group: group,
				Logger: testLogger(), CommitInterval: 20 * time.Millisecond,
			})
			require.NoError(t, err)
			stop := runSource(t, src)
			seen := map[string]bool{}
			var first ingest.Record
			for i := range n {
				rec, err := src.Fetch(ctx)
				require.NoError(t, err)
				seen[rec.ID] = true
				if i == 0 {
					first = rec
				}
				src.Done(rec)
			}
			require.Len(t, seen, n, "every record once")
			require.Eventually(t, func() bool {
				got, err := admin.CommittedOffsets(ctx, group, topic)
				return err == nil && got[0]+got[1] == n
			}, 20*time.Second, 50*time.Millisecond, "the group commits every offset")
			members, _, err := admin.GroupMembers(ctx, group)
			require.NoError(t, err)
			require.Equal(t, 1, members)
			require.NoError(t, stop())

			dlq, err := NewDeadLetterWriter(ProducerConfig{Brokers: brokers, Conn: conn, Logger: testLogger()})
			require.NoError(t, err)
			require.NoError(t, dlq.DeadLetter(ctx, ingest.DeadLetter{Record: first, Reason: "test"}))
			require.NoError(t, dlq.Close())
			end, err = admin.EndOffsets(ctx, DeadLetterTopic(topic))
			require.NoError(t, err)
			require.Equal(t, map[int]int64{0: 1}, end)
		})
	}
}

// TestSecureWrongPasswordFailsFast: Check, the admin calls and a producer
// fail within seconds with an error that names the broker and the
// mechanism, and never the password.
func TestSecureWrongPasswordFailsFast(t *testing.T) {
	k := secureKafkaEnv(t)
	const wrong = "not-the-password-x7"
	for _, mech := range []string{MechanismPlain, MechanismScramSHA256, MechanismScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			conn, err := NewConn(Security{CAFile: k.file("ca.pem"), SASLMechanism: mech, Username: k.user, Password: wrong})
			require.NoError(t, err)
			brokers := []string{k.saslSSL}
			ctx := testContext(t)

			start := time.Now()
			err = Check(ctx, brokers, conn)
			require.Less(t, time.Since(start), 5*time.Second)
			var be *BrokerError
			require.ErrorAs(t, err, &be)
			require.Equal(t, StageSASL, be.Stage)
			require.ErrorIs(t, err, kafka.SASLAuthenticationFailed)
			require.Contains(t, err.Error(), k.saslSSL)
			require.Contains(t, err.Error(), mech)
			require.Contains(t, err.Error(), "wrong username or password")
			require.NotContains(t, err.Error(), wrong)
			t.Log(err)

			start = time.Now()
			err = Admin{Brokers: brokers, Conn: conn}.Ping(ctx)
			require.Less(t, time.Since(start), 5*time.Second)
			require.ErrorAs(t, err, &be)
			require.Contains(t, err.Error(), k.saslSSL)
			require.Contains(t, err.Error(), mech)
			require.NotContains(t, err.Error(), wrong)

			p, err := NewProducer(ProducerConfig{Brokers: brokers, Conn: conn, Logger: testLogger(), MaxAttempts: 2})
			require.NoError(t, err)
			defer p.Close()
			start = time.Now()
			err = p.Produce(ctx, "secure-never-written", []ingest.Record{{ID: "x", Value: []byte("{}")}})
			require.Less(t, time.Since(start), 5*time.Second)
			t.Log(err)
			require.ErrorAs(t, err, &be)
			require.Contains(t, err.Error(), k.saslSSL)
			require.Contains(t, err.Error(), mech)
			require.NotContains(t, err.Error(), wrong)
		})
	}
}

// TestSecureMisconfiguredTLS: the failures a start-up check must tell
// apart, each naming the broker and the stage.
func TestSecureMisconfiguredTLS(t *testing.T) {
	k := secureKafkaEnv(t)
	ca := k.file("ca.pem")
	plainPort := "127.0.0.1:" + envOr("SLUICE_KAFKA_PORT", "19092")
	cases := []struct {
		name   string
		broker string
		sec    Security
		stage  string
		want   string
	}{
		{"unknown CA", k.ssl, Security{TLS: true}, StageTLS, "certificate"},
		{"wrong server name", k.ssl, Security{CAFile: ca, ServerName: "kafka.example.com"}, StageTLS, "kafka.example.com"},
		{"mTLS without a client certificate", k.mtls, Security{CAFile: ca}, StageTLS, "does it require a client certificate (mTLS)?"},
		{"TLS to a plaintext listener", plainPort, Security{CAFile: ca}, StageTLS, "is the listener TLS?"},
		{"SASL to a TLS-only listener", k.ssl, Security{CAFile: ca, SASLMechanism: "SCRAM-SHA-256", Username: k.user, Password: k.password}, StageSASL, ""},
		{"plaintext to a SASL_SSL listener", k.saslSSL, Security{}, StageMetadata, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			conn, err := NewConn(tc.sec)
			require.NoError(t, err)
			start := time.Now()
			err = Check(testContext(t), []string{tc.broker}, conn)
			require.Less(t, time.Since(start), 11*time.Second)
			var be *BrokerError
			require.ErrorAs(t, err, &be, "got %v", err)
			require.Equal(t, tc.stage, be.Stage, "%v", err)
			require.Equal(t, tc.broker, be.Broker)
			require.Contains(t, err.Error(), "kafka broker "+tc.broker+" ("+conn.String()+")")
			require.Contains(t, err.Error(), tc.want)
			t.Log(err)
		})
	}
}
