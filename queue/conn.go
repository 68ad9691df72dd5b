package queue

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/sluicehq/sluice/tlsfiles"
)

// SASL mechanisms NewConn accepts in Security.SASLMechanism, spelled as
// Kafka's sasl.mechanism setting spells them.
const (
	// MechanismPlain sends the username and password as they are (RFC
	// 4616): use it over TLS only. Confluent Cloud API keys and Azure Event
	// Hubs connection strings use it.
	MechanismPlain = "PLAIN"
	// MechanismScramSHA256 proves the password without sending it (RFC
	// 7677). Amazon MSK and Aiven offer SCRAM.
	MechanismScramSHA256 = "SCRAM-SHA-256"
	// MechanismScramSHA512 is SCRAM with SHA-512 (the only SCRAM that
	// Amazon MSK offers).
	MechanismScramSHA512 = "SCRAM-SHA-512"
)

// dialTimeout bounds one connection attempt (TCP, TLS handshake and SASL
// authentication) of a Dialer or a Check.
const dialTimeout = 10 * time.Second

// Security is how sluice secures and authenticates its connections to
// Kafka, as a managed cluster (Confluent Cloud, Amazon MSK, Azure Event
// Hubs, Aiven) asks for it. The zero value is Kafka's PLAINTEXT: no TLS, no
// authentication. NewConn validates it and loads its files.
//
// The four security.protocol values of Kafka's clients map to it as
// follows: PLAINTEXT is the zero value; SSL is TLS (with CertFile and
// KeyFile for brokers that require a client certificate); SASL_SSL is TLS
// with SASLMechanism; SASL_PLAINTEXT is SASLMechanism alone.
//
// String, GoString and LogValue never show Password.
type Security struct {
	// TLS encrypts every connection and verifies each broker's certificate
	// against CAFile, else the system's roots. Any of CAFile, CertFile,
	// KeyFile, ServerName and InsecureSkipVerify turns it on too. Default
	// false.
	TLS bool
	// CAFile is a PEM file of the CA certificates that sign the brokers'
	// certificates (a private CA, as MSK's or Aiven's). Default: the
	// system's roots.
	CAFile string
	// CertFile and KeyFile are PEM files of the client certificate and its
	// unencrypted private key, for brokers that authenticate clients by
	// certificate (mTLS). Both or neither. Default none.
	CertFile string
	KeyFile  string
	// ServerName is the name each broker's certificate must hold. Default:
	// the host of the address dialled.
	ServerName string
	// InsecureSkipVerify accepts any certificate the broker shows. For
	// tests only: the connection is then open to a man in the middle.
	// Default false.
	InsecureSkipVerify bool
	// SASLMechanism is MechanismPlain, MechanismScramSHA256 or
	// MechanismScramSHA512 (any letter case), or empty for no SASL
	// authentication. With it, Username and Password are required.
	SASLMechanism string
	// Username is the SASL user (a Confluent Cloud API key; "$ConnectionString"
	// for Event Hubs).
	Username string
	// Password is the SASL password (the API secret; the Event Hubs
	// connection string). Read it from the environment or a file, never
	// from a command-line flag.
	Password string
}

// tlsOn reports whether any setting asks for TLS.
func (s Security) tlsOn() bool {
	return s.TLS || s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" || s.ServerName != "" || s.InsecureSkipVerify
}

// String describes s without its password, e.g.
// `SASL_SSL, SCRAM-SHA-512, user "sluice", CA file ca.pem, password set`.
func (s Security) String() string {
	proto := "PLAINTEXT"
	switch {
	case s.tlsOn() && s.SASLMechanism != "":
		proto = "SASL_SSL"
	case s.tlsOn():
		proto = "SSL"
	case s.SASLMechanism != "":
		proto = "SASL_PLAINTEXT"
	}
	parts := []string{proto}
	if s.SASLMechanism != "" {
		parts = append(parts, strings.ToUpper(s.SASLMechanism))
	}
	if s.Username != "" {
		parts = append(parts, "user "+strconv.Quote(s.Username))
	}
	if s.CAFile != "" {
		parts = append(parts, "CA file "+s.CAFile)
	}
	if s.CertFile != "" {
		parts = append(parts, "client certificate "+s.CertFile)
	}
	if s.ServerName != "" {
		parts = append(parts, "server name "+s.ServerName)
	}
	if s.InsecureSkipVerify {
		parts = append(parts, "certificate NOT verified")
	}
	if s.Password != "" {
		parts = append(parts, "password set")
	}
	return strings.Join(parts, ", ")
}

// GoString is String, so that %#v does not print the password either.
func (s Security) GoString() string { return "queue.Security{" + s.String() + "}" }

// LogValue is String, so that a structured log never holds the password.
func (s Security) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Conn is a validated Security, ready for kafka-go: the TLS configuration
// and the SASL mechanism that every connection to a broker uses. The zero
// value is PLAINTEXT (what sluice did before Conn existed). Build one with
// NewConn, or set the fields directly for what Security does not cover
// (another sasl.Mechanism, such as an OAUTHBEARER or AWS IAM one).
//
// Every Kafka user in this package takes a Conn (SourceConfig.Conn,
// ProducerConfig.Conn, Admin.Conn); Check connects with it once to fail
// fast at start-up.
type Conn struct {
	// TLS, when not nil, encrypts every connection. A config with no
	// ServerName verifies each broker against the host of its address.
	TLS *tls.Config
	// SASL, when not nil, authenticates every connection.
	SASL sasl.Mechanism

	user string // for messages: the SASL user NewConn was given
}

// NewConn validates sec, reads its CA and client certificate files, and
// returns the Conn that connects as sec says. Errors wrap ErrInvalidConfig,
// name the setting at fault and never hold the password.
func NewConn(sec Security) (Conn, error) {
	var c Conn
	mech := strings.ToUpper(strings.TrimSpace(sec.SASLMechanism))
	switch mech {
	case "":
		if sec.Username != "" || sec.Password != "" {
			return Conn{}, fmt.Errorf("%w: a SASL username or password without a SASL mechanism (set %s, %s or %s)",
				ErrInvalidConfig, MechanismPlain, MechanismScramSHA256, MechanismScramSHA512)
		}
	case MechanismPlain, MechanismScramSHA256, MechanismScramSHA512:
		if sec.Username == "" {
			return Conn{}, fmt.Errorf("%w: SASL %s needs a username", ErrInvalidConfig, mech)
		}
		if sec.Password == "" {
			return Conn{}, fmt.Errorf("%w: SASL %s for user %q needs a password", ErrInvalidConfig, mech, sec.Username)
		}
		if mech == MechanismPlain {
			c.SASL = plain.Mechanism{Username: sec.Username, Password: sec.Password}
			break
		}
		algo := scram.SHA256
		if mech == MechanismScramSHA512 {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, sec.Username, sec.Password)
		if err != nil {
			// The SCRAM library's message may quote what it rejected:
			// keep it out, it could be the password.
			return Conn{}, fmt.Errorf("%w: SASL %s: the username or password is not valid text for SCRAM (SASLprep)", ErrInvalidConfig, mech)
		}
		c.SASL = m
	default:
		return Conn{}, fmt.Errorf("%w: unknown SASL mechanism %q (want %s, %s or %s)",
			ErrInvalidConfig, sec.SASLMechanism, MechanismPlain, MechanismScramSHA256, MechanismScramSHA512)
	}
	c.user = sec.Username
	if sec.tlsOn() {
		cfg, err := tlsConfig(sec)
		if err != nil {
			return Conn{}, err
		}
		c.TLS = cfg
	}
	return c, nil
}

// tlsConfig builds the client TLS configuration of sec.
func tlsConfig(sec Security) (*tls.Config, error) {
	tc, err := tlsfiles.Files{CAFile: sec.CAFile, CertFile: sec.CertFile, KeyFile: sec.KeyFile,
		ServerName: sec.ServerName, InsecureSkipVerify: sec.InsecureSkipVerify}.Config()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return tc, nil
}

// Protocol returns Kafka's name for c's security.protocol: "PLAINTEXT",
// "SSL", "SASL_PLAINTEXT" or "SASL_SSL".
func (c Conn) Protocol() string {
	switch {
	case c.TLS != nil && c.SASL != nil:
		return "SASL_SSL"
	case c.TLS != nil:
		return "SSL"
	case c.SASL != nil:
		return "SASL_PLAINTEXT"
	}
	return "PLAINTEXT"
}

// String describes c for messages, never with its password: the protocol,
// the SASL mechanism and user, and whether a client certificate is sent
// and the broker's certificate is not verified, e.g.
// `SASL_SSL, SCRAM-SHA-256, user "sluice"`.
func (c Conn) String() string {
	parts := []string{c.Protocol()}
	if c.SASL != nil {
		parts = append(parts, c.SASL.Name())
		if c.user != "" {
			parts = append(parts, "user "+strconv.Quote(c.user))
		}
	}
	if c.TLS != nil && (len(c.TLS.Certificates) > 0 || c.TLS.GetClientCertificate != nil) {
		parts = append(parts, "client certificate")
	}
	if c.TLS != nil && c.TLS.InsecureSkipVerify {
		parts = append(parts, "certificate NOT verified")
	}
	return strings.Join(parts, ", ")
}

// GoString is String, so that %#v does not print the mechanism's password.
func (c Conn) GoString() string { return "queue.Conn{" + c.String() + "}" }

// LogValue is String, so that a structured log never holds the password.
func (c Conn) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Dialer returns a kafka-go Dialer (for a kafka.Reader, or kafka.Conn) that
// connects as c says, with a 10 s timeout for each connection (TCP, TLS
// handshake and SASL together). Set its ClientID as needed.
func (c Conn) Dialer() *kafka.Dialer {
	return &kafka.Dialer{Timeout: dialTimeout, DualStack: true, TLS: c.TLS, SASLMechanism: c.SASL}
}

// Transport returns a kafka-go Transport (for a kafka.Writer or a
// kafka.Client) that connects as c says. Its connections stay open until
// idle for 30 s or CloseIdleConnections. Set its ClientID as needed.
func (c Conn) Transport() *kafka.Transport {
	return &kafka.Transport{TLS: c.TLS, SASL: c.SASL}
}

// Stages of a connection a BrokerError names.
const (
	StageConnect  = "connect"             // TCP (or name resolution)
	StageTLS      = "TLS handshake"       // the broker's certificate, or ours
	StageSASL     = "SASL authentication" // the mechanism, user or password
	StageMetadata = "metadata request"    // the first request after connecting
)

// BrokerError is a failure to connect to Kafka, naming the broker and how
// sluice connected (Conn.String, never the password). Check returns them,
// and the admin calls, Producer and DeadLetterWriter wrap a TLS or SASL
// failure in one.
type BrokerError struct {
	// Broker is the "host:port" that failed, or the comma-separated
	// bootstrap brokers when the failing one is not known.
	Broker string
	// Conn describes the connection: protocol, SASL mechanism and user.
	Conn string
	// Stage is the step that failed: StageConnect, StageTLS, StageSASL or
	// StageMetadata.
	Stage string
	// Err is the cause.
	Err error
}

func (e *BrokerError) Error() string {
	msg := fmt.Sprintf("kafka broker %s (%s): %s failed: %v", e.Broker, e.Conn, e.Stage, e.Err)
	if hint := e.hint(); hint != "" {
		msg += " (" + hint + ")"
	}
	return msg
}

func (e *BrokerError) Unwrap() error { return e.Err }

// hint says what usually causes e.
func (e *BrokerError) hint() string {
	switch {
	case errors.Is(e.Err, kafka.SASLAuthenticationFailed):
		return "wrong username or password, or no credentials of this mechanism for the user"
	case errors.Is(e.Err, kafka.UnsupportedSASLMechanism):
		return "the listener does not enable this SASL mechanism"
	case errors.Is(e.Err, kafka.IllegalSASLState):
		return "the listener does not take SASL: is it a SASL listener?"
	case e.Stage == StageTLS && errors.Is(e.Err, io.EOF):
		return "the broker closed the connection: is the listener TLS?"
	case e.Stage == StageTLS && strings.Contains(e.Err.Error(), "remote error: tls: ") && !strings.Contains(e.Conn, "client certificate"):
		return "the broker refused the connection: does it require a client certificate (mTLS)?"
	case e.Stage == StageMetadata && errors.Is(e.Err, io.EOF) && !strings.HasPrefix(e.Conn, "SASL_SSL") && !strings.HasPrefix(e.Conn, "SSL"):
		return "the broker closed the connection: does the listener want TLS or SASL?"
	}
	return ""
}

// stageOf tells which step of a connection err comes from; "" when it does
// not look like a connection failure.
func stageOf(err error) string {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verify           *tls.CertificateVerificationError
		header           tls.RecordHeaderError
		alert            tls.AlertError
		op               *net.OpError
	)
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed), errors.Is(err, kafka.UnsupportedSASLMechanism),
		errors.Is(err, kafka.IllegalSASLState):
		return StageSASL
	case errors.As(err, &unknownAuthority), errors.As(err, &hostname), errors.As(err, &invalid),
		errors.As(err, &verify), errors.As(err, &header), errors.As(err, &alert):
		return StageTLS
	case errors.As(err, &op) && op.Op == "remote error":
		// An alert from the broker: with TLS 1.3 a refused (or missing)
		// client certificate shows only after the handshake.
		return StageTLS
	case errors.As(err, &op) && op.Op == "dial":
		return StageConnect
	}
	return ""
}

// annotate wraps err in a BrokerError naming brokers and c when it is a
// TLS or SASL failure, so that the message says how sluice connected.
func (c Conn) annotate(brokers []string, err error) error {
	if err == nil {
		return nil
	}
	if be := (*BrokerError)(nil); errors.As(err, &be) {
		return err
	}
	stage := stageOf(err)
	if stage != StageTLS && stage != StageSASL {
		return err
	}
	return &BrokerError{Broker: strings.Join(brokers, ","), Conn: c.String(), Stage: stage, Err: err}
}

// Check connects to the bootstrap brokers with conn, in order, until one
// accepts: the TCP connection, the TLS handshake (when conn has TLS), SASL
// authentication (when conn has SASL) and a metadata request. It then does
// the same with every broker that metadata lists (the addresses a client is
// sent to, from the brokers' advertised listeners), so a listener that
// does not match conn is found at start-up and not at the first fetch.
//
// It returns nil when a bootstrap broker and every listed broker answer.
// Otherwise its error wraps a *BrokerError per failure, each naming the
// broker, the stage that failed and conn (never the password): with no
// bootstrap broker answering, one per bootstrap broker, joined. Each
// connection is bounded by 10 s and the whole check by ctx.
//
// A command calls it before it starts consuming or producing and exits
// when it fails: kafka-go's Reader would otherwise retry a wrong password
// for ever, logging only.
func Check(ctx context.Context, brokers []string, conn Conn) error {
	if len(brokers) == 0 {
		return fmt.Errorf("%w: no brokers", ErrInvalidConfig)
	}
	var errs []error
	for _, b := range brokers {
		listed, err := checkBroker(ctx, b, conn)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		seen := map[string]bool{b: true}
		for _, addr := range listed {
			if seen[addr] {
				continue
			}
			seen[addr] = true
			if _, err := checkBroker(ctx, addr, conn); err != nil {
				return fmt.Errorf("broker %s is listed by the cluster's metadata (from %s): %w", addr, b, err)
			}
		}
		return nil
	}
	return errors.Join(errs...)
}

// checkBroker connects to addr as conn says, step by step so that the
// error names the step, and returns the brokers the cluster's metadata
// lists.
func checkBroker(ctx context.Context, addr string, conn Conn) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	fail := func(stage string, err error) error {
		if ctx.Err() != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		return &BrokerError{Broker: addr, Conn: conn.String(), Stage: stage, Err: err}
	}
	if conn.TLS != nil {
		// The TLS handshake on a connection of its own, so that a
		// certificate problem is told apart from an authentication one.
		raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fail(StageConnect, err)
		}
		cfg := conn.TLS
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(raw, cfg)
		err = tc.HandshakeContext(ctx)
		_ = tc.Close()
		if err != nil {
			return nil, fail(StageTLS, err)
		}
	}
	kc, err := conn.Dialer().DialContext(ctx, "tcp", addr)
	if err != nil {
		stage := stageOf(err)
		if stage == "" {
			stage = StageConnect
			if conn.SASL != nil {
				stage = StageSASL // the dial got through; kafka-go then authenticates
			}
		}
		return nil, fail(stage, err)
	}
	defer kc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = kc.SetDeadline(dl)
	}
	brokers, err := kc.Brokers()
	if err != nil {
		stage := stageOf(err)
		if stage == "" || stage == StageConnect {
			stage = StageMetadata
		}
		return nil, fail(stage, err)
	}
	out := make([]string, len(brokers))
	for i, b := range brokers {
		out[i] = net.JoinHostPort(b.Host, strconv.Itoa(b.Port))
	}
	return out, nil
}
