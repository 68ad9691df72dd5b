package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// ErrSinkURL is wrapped by Open and CheckURL errors about the --sink URL.
var ErrSinkURL = errors.New("--sink")

// OpenConfig holds what Open needs beyond the URL. Secrets never come from
// the URL's query string or a flag: they come from the environment or a
// file named here.
type OpenConfig struct {
	// Timeout bounds each HTTP request (HTTP sink) or Azure request.
	// Default DefaultTimeout.
	Timeout time.Duration
	// StatementTimeout is the PostgreSQL statement_timeout. Default
	// DefaultPostgresStatementTimeout.
	StatementTimeout time.Duration
	// MaxConns bounds the PostgreSQL pool. Default DefaultPostgresMaxConns.
	MaxConns int
	// AccountKeyFile names a file holding the Azure storage account key
	// (surrounding white space is ignored); when empty the key comes from
	// the SLUICE_AZURE_ACCOUNT_KEY environment variable.
	AccountKeyFile string
	// Logger receives the sink's events. Default slog.Default().
	Logger *slog.Logger
}

// Opened is a sink opened by Open. Close releases its connections; it is a
// no-op for the HTTP sink.
type Opened interface {
	ingest.Sink
	io.Closer
}

// CheckURL checks the --sink URL without connecting: its scheme selects the
// sink, and the sink's required parts must be present.
//
//   - http://host:port, https://host:port: the HTTP sink (the emulator's
//     batch protocol);
//   - postgres://user@host:port/db?table=T (also postgresql://): the
//     PostgreSQL sink; optional query parameters id_column and value_column
//     (defaults "id" and "value"), create_table=false to not create a
//     missing table; other parameters go to the driver.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSinkURL, err)
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return fmt.Errorf("%w: %q has no host", ErrSinkURL, raw)
		}
	case "postgres", "postgresql":
		if u.Host == "" {
			return fmt.Errorf("%w: %q has no host", ErrSinkURL, redact(u))
		}
		if u.Query().Get("table") == "" {
			return fmt.Errorf("%w: %q needs ?table=<name>", ErrSinkURL, redact(u))
		}
	default:
		return fmt.Errorf("%w: unknown scheme %q in %q (want http, https or postgres)", ErrSinkURL, u.Scheme, redact(u))
	}
	return nil
}

// Open checks raw (see CheckURL) and opens the sink it names.
func Open(ctx context.Context, raw string, cfg OpenConfig) (Opened, error) {
	if err := CheckURL(raw); err != nil {
		return nil, err
	}
	u, _ := url.Parse(raw)
	switch u.Scheme {
	case "postgres", "postgresql":
		q := u.Query()
		pc := PostgresConfig{
			Table:            q.Get("table"),
			IDColumn:         q.Get("id_column"),
			ValueColumn:      q.Get("value_column"),
			CreateTable:      q.Get("create_table") != "false",
			StatementTimeout: cfg.StatementTimeout,
			MaxConns:         cfg.MaxConns,
			Logger:           cfg.Logger,
		}
		for _, k := range []string{"table", "id_column", "value_column", "create_table"} {
			q.Del(k)
		}
		u.RawQuery = q.Encode()
		pc.URL = u.String()
		s, err := NewPostgres(ctx, pc)
		if err != nil {
			return nil, fmt.Errorf("%w %s: %w", ErrSinkURL, redact(u), err)
		}
		return s, nil
	default:
		s, err := NewHTTP(HTTPConfig{URL: raw, Timeout: cfg.Timeout})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSinkURL, err)
		}
		return httpCloser{s}, nil
	}
}

// httpCloser gives HTTPSink a no-op Close; it keeps Stats.
type httpCloser struct{ *HTTPSink }

func (httpCloser) Close() error { return nil }

// redact hides a password in u for messages.
func redact(u *url.URL) string { return u.Redacted() }
