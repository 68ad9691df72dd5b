package lease

import (
	"bytes"
	"context"
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

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

const secret = "hunter2-do-not-print"

// writeCert writes a self-signed certificate and its key as PEM files in
// dir and returns their paths.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
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

func closeAll(t *testing.T, clients []redis.UniversalClient) {
	t.Cleanup(func() {
		for _, c := range clients {
			_ = c.Close()
		}
	})
}

func TestOpenRedisValidates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, _ := writeCert(t, dir)
	cases := []struct {
		name string
		cfg  RedisConfig
		want string
	}{
		{"nothing", RedisConfig{Password: secret}, "no address"},
		{"addresses and Sentinel", RedisConfig{Addrs: []string{"h:1"}, SentinelMaster: "m", SentinelAddrs: []string{"s:1"}}, "not both"},
		{"Sentinel addresses without master", RedisConfig{SentinelAddrs: []string{"s:1"}}, "without a master name"},
		{"Sentinel master without addresses", RedisConfig{SentinelMaster: "m"}, `master "m" without Sentinel addresses`},
		{"Sentinel address without port", RedisConfig{SentinelMaster: "m", SentinelAddrs: []string{"sentinel"}}, `Sentinel address "sentinel"`},
		{"address without port", RedisConfig{Addrs: []string{"h:1", "cache"}}, `redis address 2 of 2 (cache): want "host:port"`},
		{"unknown scheme", RedisConfig{Addrs: []string{"http://u:" + secret + "@h:1"}}, `(http://u:xxxxx@h:1): scheme "http"`},
		{"TLS settings for redis://", RedisConfig{Addrs: []string{"redis://u:" + secret + "@h:1"}, CAFile: cert}, "use rediss://"},
		{"unparsable URL", RedisConfig{Addrs: []string{"redis://u:" + secret + "@h:bad port"}}, "(redis://(unparsable)): not a valid URL"},
		{"unknown option", RedisConfig{Addrs: []string{"rediss://u:" + secret + "@h:1?bogus=1"}}, "(rediss://u:xxxxx@h:1?bogus=1): redis: unexpected option: bogus"},
		{"bad database", RedisConfig{Addrs: []string{"redis://u:" + secret + "@h:1/x"}}, "invalid database number"},
		{"certificate without key", RedisConfig{Addrs: []string{"h:1"}, CertFile: cert}, "both a certificate file and a key file"},
		{"missing CA file", RedisConfig{Addrs: []string{"h:1"}, CAFile: filepath.Join(dir, "missing.pem")}, "missing.pem"},
		{"CA file without PEM", RedisConfig{Addrs: []string{"h:1"}, CAFile: filepath.Join(dir, "key.pem")}, "holds no PEM certificate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := OpenRedis(tc.cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), secret)
		})
	}
}

func TestOpenRedisOptions(t *testing.T) {
	t.Parallel()
	cert, key := writeCert(t, t.TempDir())
	clients, err := OpenRedis(RedisConfig{
		Addrs: []string{
			"h1:6379",
			"redis://url-user:url-pw@h2:6380/3",
			"rediss://url-user@h3:6381",
			" rediss://h4:6382?skip_verify=true ",
		},
		Username: "cfg-user", Password: "cfg-pw", DB: 2,
		CAFile: cert, CertFile: cert, KeyFile: key,
	})
	// redis:// with TLS settings is refused; without them the rest holds.
	require.ErrorContains(t, err, "redis address 2 of 4")
	require.Nil(t, clients)

	clients, err = OpenRedis(RedisConfig{
		Addrs:    []string{"h1:6379", "redis://url-user:url-pw@h2:6380/3", "redis://url-user@h3:6381"},
		Username: "cfg-user", Password: "cfg-pw", DB: 2,
	})
	require.NoError(t, err)
	closeAll(t, clients)
	require.Len(t, clients, 3)
	o := []*redis.Options{clients[0].(*redis.Client).Options(), clients[1].(*redis.Client).Options(), clients[2].(*redis.Client).Options()}
	require.Equal(t, "h1:6379", o[0].Addr)
	require.Equal(t, []string{"cfg-user", "cfg-pw"}, []string{o[0].Username, o[0].Password})
	require.Equal(t, 2, o[0].DB)
	require.Nil(t, o[0].TLSConfig)
	require.Equal(t, []string{"url-user", "url-pw"}, []string{o[1].Username, o[1].Password}, "a URL's own credentials win")
	require.Equal(t, 3, o[1].DB)
	require.Equal(t, []string{"url-user", "cfg-pw"}, []string{o[2].Username, o[2].Password}, "the password fills in where the URL has none")
	require.Equal(t, 0, o[2].DB, "a URL names its database")

	clients, err = OpenRedis(RedisConfig{
		Addrs:  []string{"h1:6379", "rediss://u@h3:6381", "rediss://h4:6382?skip_verify=true"},
		CAFile: cert, CertFile: cert, KeyFile: key,
	})
	require.NoError(t, err)
	closeAll(t, clients)
	for i, c := range clients {
		tc := c.(*redis.Client).Options().TLSConfig
		require.NotNil(t, tc, "client %d uses TLS", i)
		require.NotNil(t, tc.RootCAs, "client %d trusts the CA file", i)
		require.Len(t, tc.Certificates, 1, "client %d sends the client certificate", i)
		require.Equal(t, i == 2, tc.InsecureSkipVerify, "client %d", i)
	}
	require.Equal(t, "h3", clients[1].(*redis.Client).Options().TLSConfig.ServerName)

	clients, err = OpenRedis(RedisConfig{Addrs: []string{"rediss://h3:6381"}, ServerName: "cache.example.com"})
	require.NoError(t, err)
	closeAll(t, clients)
	require.Equal(t, "cache.example.com", clients[0].(*redis.Client).Options().TLSConfig.ServerName)

	clients, err = OpenRedis(RedisConfig{SentinelMaster: "m", SentinelAddrs: []string{"s1:26379", "s2:26379"}, Username: "u", Password: secret})
	require.NoError(t, err)
	closeAll(t, clients)
	require.Len(t, clients, 1)
	require.Equal(t, `sentinel master "m" via s1:26379,s2:26379 (user "u")`, describeClient(clients[0]))
}

// TestRedisPasswordNeverPrinted formats RedisConfig every way a caller or
// a log might.
func TestRedisPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	cfg := RedisConfig{
		Addrs:    []string{"h1:6379", "rediss://u:" + secret + "1@h2:6380/1"},
		Username: "u", Password: secret + "2", TLS: true,
		SentinelUsername: "su", SentinelPassword: secret + "3",
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("m", "redis", cfg)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("m", "redis", cfg)
	for _, s := range []string{cfg.String(), fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%v", &cfg), buf.String()} {
		require.NotContains(t, s, secret)
		require.Contains(t, s, "rediss://u:xxxxx@h2:6380/1")
	}
	require.Equal(t, `redis h1:6379,rediss://u:xxxxx@h2:6380/1, user "u", password set, TLS, sentinel user "su", sentinel password set`, cfg.String())
}

func TestPingRedis(t *testing.T) {
	t.Parallel()
	mr := miniredis.NewMiniRedis()
	require.NoError(t, mr.Start())
	t.Cleanup(mr.Close)
	mr.RequireUserAuth("sluice", secret)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := l.Addr().String()
	require.NoError(t, l.Close())
	ctx := context.Background()

	ping := func(cfg RedisConfig) error {
		clients, err := OpenRedis(cfg)
		require.NoError(t, err)
		closeAll(t, clients)
		return PingRedis(ctx, clients...)
	}
	require.NoError(t, ping(RedisConfig{Addrs: []string{mr.Addr()}, Username: "sluice", Password: secret}))
	require.NoError(t, ping(RedisConfig{Addrs: []string{"redis://sluice@" + mr.Addr()}, Password: secret}))

	err = ping(RedisConfig{Addrs: []string{"redis://sluice:wrong-" + secret + "@" + mr.Addr() + "/0"}})
	var re *RedisError
	require.ErrorAs(t, err, &re)
	require.Equal(t, "redis://sluice@"+mr.Addr()+"/0", re.Addr)
	require.ErrorContains(t, err, "redis redis://sluice@"+mr.Addr()+"/0: authentication failed")
	require.NotContains(t, err.Error(), secret)

	err = ping(RedisConfig{Addrs: []string{down}})
	require.ErrorAs(t, err, &re)
	require.ErrorContains(t, err, "redis redis://"+down+"/0: ")

	// A quorum of three: one down is fine, two down is not, and a wrong
	// password anywhere is a mistake to fix now.
	good := "redis://sluice:" + secret + "@" + mr.Addr()
	require.NoError(t, ping(RedisConfig{Addrs: []string{good, good, down}}))
	require.Error(t, ping(RedisConfig{Addrs: []string{good, down, down}}))
	err = ping(RedisConfig{Addrs: []string{good, good, "redis://sluice:wrong@" + mr.Addr()}})
	require.ErrorContains(t, err, "authentication failed")

	require.ErrorIs(t, PingRedis(ctx), ErrInvalidConfig)
}
