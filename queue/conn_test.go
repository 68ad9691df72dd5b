package queue

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

const testPassword = "hunter2-do-not-print"

// writeTestCert writes a self-signed certificate and its key as PEM files
// in dir and returns their paths.
func writeTestCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certFile, keyFile
}

func TestNewConnValidates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key := writeTestCert(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
	cases := []struct {
		name string
		sec  Security
		want string
	}{
		{"unknown mechanism", Security{SASLMechanism: "GSSAPI", Username: "u", Password: testPassword}, `unknown SASL mechanism "GSSAPI"`},
		{"mechanism without user", Security{SASLMechanism: "PLAIN", Password: testPassword}, "needs a username"},
		{"mechanism without password", Security{SASLMechanism: "SCRAM-SHA-512", Username: "u"}, `SCRAM-SHA-512 for user "u" needs a password`},
		{"password without mechanism", Security{Username: "u", Password: testPassword}, "without a SASL mechanism"},
		{"certificate without key", Security{CertFile: cert}, "both a certificate file and a key file"},
		{"key without certificate", Security{KeyFile: key}, "both a certificate file and a key file"},
		{"missing CA file", Security{CAFile: filepath.Join(dir, "missing.pem")}, "missing.pem"},
		{"CA file without PEM", Security{CAFile: notPEM}, "holds no PEM certificate"},
		{"key that is not a key", Security{CertFile: cert, KeyFile: notPEM}, "client certificate"},
		{"SCRAM password that is not text", Security{SASLMechanism: "SCRAM-SHA-256", Username: "u", Password: testPassword + "\u0000"}, "SASLprep"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewConn(tc.sec)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), testPassword)
		})
	}
}

func TestNewConn(t *testing.T) {
	t.Parallel()
	cert, key := writeTestCert(t, t.TempDir())
	cases := []struct {
		name     string
		sec      Security
		protocol string
		str      string
		tls      bool
		mech     string
	}{
		{"zero", Security{}, "PLAINTEXT", "PLAINTEXT", false, ""},
		{"TLS", Security{TLS: true}, "SSL", "SSL", true, ""},
		{"CA implies TLS", Security{CAFile: cert}, "SSL", "SSL", true, ""},
		{"mTLS", Security{CAFile: cert, CertFile: cert, KeyFile: key}, "SSL", "SSL, client certificate", true, ""},
		{"insecure", Security{InsecureSkipVerify: true}, "SSL", "SSL, certificate NOT verified", true, ""},
		{"SASL_PLAINTEXT", Security{SASLMechanism: "scram-sha-256", Username: "u", Password: testPassword},
			"SASL_PLAINTEXT", `SASL_PLAINTEXT, SCRAM-SHA-256, user "u"`, false, "SCRAM-SHA-256"},
		{"SASL_SSL", Security{TLS: true, SASLMechanism: " Plain ", Username: "u", Password: testPassword},
			"SASL_SSL", `SASL_SSL, PLAIN, user "u"`, true, "PLAIN"},
		{"SCRAM-SHA-512", Security{TLS: true, SASLMechanism: "SCRAM-SHA-512", Username: "u", Password: testPassword},
			"SASL_SSL", `SASL_SSL, SCRAM-SHA-512, user "u"`, true, "SCRAM-SHA-512"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := NewConn(tc.sec)
			require.NoError(t, err)
			require.Equal(t, tc.protocol, c.Protocol())
			require.Equal(t, tc.str, c.String())
			require.Equal(t, tc.tls, c.TLS != nil)
			if tc.mech == "" {
				require.Nil(t, c.SASL)
			} else {
				require.Equal(t, tc.mech, c.SASL.Name())
			}
			d, tr := c.Dialer(), c.Transport()
			require.Same(t, c.TLS, d.TLS)
			require.Same(t, c.TLS, tr.TLS)
			require.Equal(t, c.SASL, d.SASLMechanism)
			require.Equal(t, c.SASL, tr.SASL)
			require.Equal(t, dialTimeout, d.Timeout)
		})
	}

	c, err := NewConn(Security{CAFile: cert, CertFile: cert, KeyFile: key, ServerName: "kafka.example.com"})
	require.NoError(t, err)
	require.NotNil(t, c.TLS.RootCAs)
	require.Len(t, c.TLS.Certificates, 1)
	require.Equal(t, "kafka.example.com", c.TLS.ServerName)
	require.False(t, c.TLS.InsecureSkipVerify)
}

// TestPasswordNeverPrinted formats Security and Conn every way a caller
// or a log might.
func TestPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{MechanismPlain, MechanismScramSHA256, MechanismScramSHA512} {
		sec := Security{TLS: true, CAFile: "ca.pem", SASLMechanism: mech, Username: "sluice", Password: testPassword}
		conn, err := NewConn(Security{TLS: true, SASLMechanism: mech, Username: "sluice", Password: testPassword})
		require.NoError(t, err)
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("m", "security", sec, "conn", conn)
		slog.New(slog.NewTextHandler(&buf, nil)).Info("m", "security", sec, "conn", conn)
		for _, s := range []string{
			fmt.Sprint(sec), fmt.Sprintf("%+v", sec), fmt.Sprintf("%#v", sec), fmt.Sprintf("%+v", &sec),
			fmt.Sprint(conn), fmt.Sprintf("%+v", conn), fmt.Sprintf("%#v", conn), fmt.Sprintf("%v", &conn),
			fmt.Sprintf("%+v", ProducerConfig{Brokers: []string{"b:9092"}, Conn: conn}),
			fmt.Sprintf("%#v", Admin{Brokers: []string{"b:9092"}, Conn: conn}),
			buf.String(),
		} {
			require.NotContains(t, s, testPassword)
			require.Contains(t, s, mech)
		}
		require.Contains(t, sec.String(), "password set")
		require.Contains(t, buf.String(), `user \"sluice\"`)
	}
}

func TestBrokerError(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("produce: %w", Conn{}.annotate([]string{"a:1", "b:2"}, kafka.SASLAuthenticationFailed))
	var be *BrokerError
	require.ErrorAs(t, err, &be)
	require.Equal(t, "a:1,b:2", be.Broker)
	require.Equal(t, StageSASL, be.Stage)
	require.ErrorIs(t, err, kafka.SASLAuthenticationFailed)
	require.Contains(t, err.Error(), "kafka broker a:1,b:2 (PLAINTEXT): SASL authentication failed")

	other := fmt.Errorf("not a security failure")
	require.Same(t, other, Conn{}.annotate([]string{"a:1"}, other), "other errors are left as they are")
	require.NoError(t, Conn{}.annotate([]string{"a:1"}, nil))
	require.Same(t, error(be), Conn{}.annotate([]string{"c:3"}, be), "annotated once")
}

// TestCheck runs Check against the test broker (embedded, or
// SLUICE_TEST_BROKERS), which speaks PLAINTEXT.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	require.NoError(t, Check(ctx, testBrokers, Conn{}))
	require.NoError(t, Admin{Brokers: testBrokers}.Check(ctx))
	require.ErrorIs(t, Check(ctx, nil, Conn{}), ErrInvalidConfig)

	conn, err := NewConn(Security{TLS: true})
	require.NoError(t, err)
	start := time.Now()
	err = Check(ctx, testBrokers[:1], conn)
	require.Less(t, time.Since(start), 11*time.Second)
	var be *BrokerError
	require.ErrorAs(t, err, &be)
	require.Equal(t, StageTLS, be.Stage)
	require.Equal(t, testBrokers[0], be.Broker)
	require.ErrorContains(t, err, "kafka broker "+testBrokers[0]+" (SSL): TLS handshake failed")

	// A port nobody listens on: the dial fails, naming it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	err = Check(ctx, []string{closed}, Conn{})
	require.ErrorAs(t, err, &be)
	require.Equal(t, StageConnect, be.Stage)
	require.ErrorContains(t, err, "kafka broker "+closed+" (PLAINTEXT): connect failed")

	// The first bootstrap broker is down, the next answers: nil.
	require.NoError(t, Check(ctx, append([]string{closed}, testBrokers...), Conn{}))
}
