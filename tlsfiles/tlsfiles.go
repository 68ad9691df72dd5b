// Package tlsfiles builds the client TLS configuration of a connection
// (Kafka, Redis, an HTTP sink) from PEM files, the way every sluice
// connection takes them: trusted certificate authorities, a client
// certificate and key for mutual TLS, a server name to verify.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Files name the PEM files and checks of a TLS client.
type Files struct {
	// CAFile is a PEM file of the certificate authorities trusted for the
	// server; empty: the system's.
	CAFile string
	// SystemRoots keeps the system's authorities beside CAFile's; false:
	// CAFile's alone.
	SystemRoots bool
	// CertFile and KeyFile are the client certificate and its key, for
	// mutual TLS; both or neither.
	CertFile, KeyFile string
	// ServerName is the name to verify instead of the server's host.
	ServerName string
	// InsecureSkipVerify accepts any server certificate (tests only).
	InsecureSkipVerify bool
}

// Config returns the client configuration, TLS 1.2 at least. Its errors
// name the file at fault: one that cannot be read, holds no PEM
// certificate, or a certificate without its key.
func (f Files) Config() (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         f.ServerName,
		InsecureSkipVerify: f.InsecureSkipVerify, //nolint:gosec // documented as tests only
	}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if f.SystemRoots {
			if system, err := x509.SystemCertPool(); err == nil {
				pool = system
			}
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", f.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.CertFile == "" && f.KeyFile == "":
	case f.CertFile == "" || f.KeyFile == "":
		return nil, fmt.Errorf("a client certificate needs both a certificate file and a key file (got %q and %q)", f.CertFile, f.KeyFile)
	default:
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate %s with key %s: %w", f.CertFile, f.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
