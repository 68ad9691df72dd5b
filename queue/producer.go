package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/semaphore"

	"github.com/sluicehq/sluice/ingest"
)

// ErrNoTopic is returned (wrapped) when a record to produce or dead-letter
// names no topic.
var ErrNoTopic = errors.New("queue: no topic")

// ProducerConfig configures a Producer or a DeadLetterWriter.
type ProducerConfig struct {
	// Brokers are the bootstrap brokers, "host:port". Required.
	Brokers []string
	// Conn is how to connect: TLS and SASL. A TLS or SASL failure makes
	// Produce and DeadLetter fail with a *BrokerError. Default: the zero
	// Conn, PLAINTEXT.
	Conn Conn
	// BatchTimeout is how long the writer waits to fill a batch before
	// sending it. Default 5 ms (short: Produce is synchronous, so this is
	// latency added to each call).
	BatchTimeout time.Duration
	// BatchSize is the most messages per batch and partition. Default 500.
	BatchSize int
	// BatchBytes is the most bytes per batch and partition request; a
	// single larger message fails with kafka.MessageTooLargeError. Default
	// 1 MiB (Kafka's default message.max.bytes is about that).
	BatchBytes int64
	// WriteTimeout bounds one produce request to a broker. Default 10 s.
	WriteTimeout time.Duration
	// MaxAttempts is how many times a batch is tried before Produce fails.
	// Default 10.
	MaxAttempts int
	// Compression is the codec of the batches ProduceAsync sends on the
	// wire: "none", "gzip", "snappy", "lz4" or "zstd" (the broker stores
	// them so and consumers decompress them). Default "lz4": a bulk load's
	// JSON records shrink to about a third for little CPU, which keeps the
	// broker's disk and network from being the limit.
	Compression string
	// AsyncBatchSize is the most messages per batch and partition of
	// ProduceAsync. Default 1,000 (BatchBytes caps a batch too).
	AsyncBatchSize int
	// AsyncBatchTimeout is how long a batch of ProduceAsync waits to fill.
	// Default 20 ms: at 250,000 records/s over 6 partitions a batch fills
	// to 830 in that time but to 210 in 5 ms, and the broker spends about
	// half the CPU a record on full batches (measured on Kafka 3.9 beside
	// `sluice produce`: 0.8 CPU-seconds per million USGS rows at 20 ms,
	// 1.5 to 2.8 at 5 ms). A bulk load does not wait on any one record.
	AsyncBatchTimeout time.Duration
	// MaxInFlight is the most records ProduceAsync keeps unanswered; it
	// blocks beyond. Default 10,000 (about 8 MB of USGS records with
	// their messages): a batch on its way and one filling for each of
	// five partitions.
	MaxInFlight int
	// RoundRobin spreads messages evenly over the partitions instead of
	// hashing their keys: for bulk loads, whose records have no order to
	// keep, so that every consumer of the group gets the same share and
	// they finish together. Default false (by key).
	RoundRobin bool
	// Topics are the topics the producer writes to: the cluster metadata
	// it fetches at its first write and refreshes every 6 s is only
	// theirs, and a write to any other topic fails at once, wrapping
	// ErrTopicNotConfigured. Default none: the metadata of every topic in
	// the cluster, megabytes a refresh on a cluster of thousands of
	// partitions (see metadataScope). Required of every producer sluice
	// itself opens; optional for one whose topics are not known up front.
	Topics []string
	// Logger receives the writer's logs. Default slog.Default().
	Logger *slog.Logger
}

func (cfg *ProducerConfig) fill() error {
	cfg.BatchTimeout = cmp.Or(cfg.BatchTimeout, 5*time.Millisecond)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 500)
	cfg.BatchBytes = cmp.Or(cfg.BatchBytes, 1<<20)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, 10*time.Second)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, 10)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.Compression = cmp.Or(cfg.Compression, "lz4")
	cfg.AsyncBatchSize = cmp.Or(cfg.AsyncBatchSize, 1000)
	cfg.AsyncBatchTimeout = cmp.Or(cfg.AsyncBatchTimeout, 20*time.Millisecond)
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, 10_000)
	if _, err := ParseCompression(cfg.Compression); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	switch {
	case len(cfg.Brokers) == 0:
		return fmt.Errorf("%w: no brokers", ErrInvalidConfig)
	case cfg.BatchTimeout < 0 || cfg.AsyncBatchTimeout < 0 || cfg.WriteTimeout < 0:
		return fmt.Errorf("%w: durations must be > 0", ErrInvalidConfig)
	case cfg.BatchSize < 1 || cfg.BatchBytes < 1 || cfg.MaxAttempts < 1 || cfg.AsyncBatchSize < 1 || cfg.MaxInFlight < 1:
		return fmt.Errorf("%w: BatchSize, BatchBytes, MaxAttempts, AsyncBatchSize and MaxInFlight must be ≥ 1", ErrInvalidConfig)
	}
	return nil
}

// Producer appends records to topics with kafka-go's Writer: synchronous
// (Produce returns once every record is acknowledged), RequiredAcks
// RequireAll (acknowledged by all in-sync replicas), and partitioned by key
// with the murmur2 hash of the Java client, so a key lands on the same
// partition whichever client produced it (or round-robin, see
// ProducerConfig.RoundRobin). It implements ingest.Producer.
type Producer struct {
	w         *kafka.Writer
	transport *kafka.Transport // MetadataTopics nil: any topic
	brokers   []string
	conn      Conn
	maxBytes  int64

	// ProduceAsync's
	asyncOnce    sync.Once
	aw           *kafka.Writer
	newAsync     func() *kafka.Writer
	maxInFlight  int64
	inFlight     *semaphore.Weighted
	writeTimeout time.Duration
}

var _ ingest.Producer = (*Producer)(nil)

// NewProducer validates cfg and creates the producer; it connects lazily.
func NewProducer(cfg ProducerConfig) (*Producer, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	transport := cfg.Conn.Transport()
	if len(cfg.Topics) > 0 {
		transport.MetadataTopics = metadataScope(cfg.Topics)
	}
	var balancer kafka.Balancer = kafka.Murmur2Balancer{}
	if cfg.RoundRobin {
		balancer = &kafka.RoundRobin{}
	}
	compression, _ := ParseCompression(cfg.Compression)
	newWriter := func(async bool) *kafka.Writer {
		w := &kafka.Writer{
			Addr:         kafka.TCP(cfg.Brokers...),
			Balancer:     balancer,
			RequiredAcks: kafka.RequireAll,
			Async:        async,
			BatchTimeout: cfg.BatchTimeout,
			BatchSize:    cfg.BatchSize,
			BatchBytes:   cfg.BatchBytes,
			WriteTimeout: cfg.WriteTimeout,
			MaxAttempts:  cfg.MaxAttempts,
			Transport:    transport,
			Logger:       kafkaLogger(cfg.Logger, slog.LevelDebug),
			ErrorLogger:  kafkaLogger(cfg.Logger, slog.LevelWarn),
		}
		if async {
			w.BatchSize, w.BatchTimeout, w.Compression = cfg.AsyncBatchSize, cfg.AsyncBatchTimeout, compression
		}
		return w
	}
	return &Producer{
		transport:    transport,
		brokers:      cfg.Brokers,
		conn:         cfg.Conn,
		maxBytes:     cfg.BatchBytes,
		maxInFlight:  int64(cfg.MaxInFlight),
		inFlight:     semaphore.NewWeighted(int64(cfg.MaxInFlight)),
		writeTimeout: cfg.WriteTimeout,
		w:            newWriter(false),
		newAsync:     func() *kafka.Writer { return newWriter(true) },
	}, nil
}

// Produce writes recs to topic and returns once all are acknowledged by
// every in-sync replica. Each message's key is rec.Key, or rec.ID when the
// key is empty; rec.ID travels in the "sluice-id" header. On error some
// records may have been written (producing again is safe: the sink dedupes
// by ID).
func (p *Producer) Produce(ctx context.Context, topic string, recs []ingest.Record) error {
	if err := p.writes(topic); err != nil {
		return err
	}
	if len(recs) == 0 {
		return nil
	}
	msgs := make([]kafka.Message, len(recs))
	for i, rec := range recs {
		msgs[i] = message(topic, rec)
	}
	if err := p.w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("produce %d records to topic %q: %w", len(recs), topic, p.conn.annotate(p.brokers, err))
	}
	return nil
}

// writes returns nil when the producer may write to topic, else an error
// wrapping ErrNoTopic or ErrTopicNotConfigured.
func (p *Producer) writes(topic string) error {
	if topic == "" {
		return fmt.Errorf("produce: %w", ErrNoTopic)
	}
	if p.transport.MetadataTopics == nil {
		return nil
	}
	if err := inScope([]string{topic}, p.transport.MetadataTopics); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	return nil
}

// ErrTooLarge is wrapped by Fits's error for a record whose message is
// larger than the producer's BatchBytes (about the broker's default
// message.max.bytes): Kafka would refuse it.
var ErrTooLarge = errors.New("queue: record too large for a Kafka message")

// messageOverhead is an upper bound of a record batch's and a record's
// framing around one message's key, value and headers, in bytes.
const messageOverhead = 128

// Fits returns nil when rec can be produced, and an error wrapping
// ErrTooLarge, naming its size and the limit, when it cannot.
func (p *Producer) Fits(rec ingest.Record) error {
	if n := messageSize(message("", rec)); n > p.maxBytes {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, n, p.maxBytes)
	}
	return nil
}

func messageSize(m kafka.Message) int64 {
	n := int64(len(m.Key) + len(m.Value) + messageOverhead)
	for _, h := range m.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// message builds the Kafka message of rec.
func message(topic string, rec ingest.Record, headers ...kafka.Header) kafka.Message {
	key := rec.Key
	if len(key) == 0 && rec.ID != "" {
		key = []byte(rec.ID)
	}
	if rec.ID != "" {
		id := key // the same bytes when the key is the ID (read only)
		if string(key) != rec.ID {
			id = []byte(rec.ID)
		}
		headers = append(headers, kafka.Header{Key: HeaderID, Value: id})
	}
	return kafka.Message{Topic: topic, Key: key, Value: rec.Value, Headers: headers}
}

// ParseCompression returns kafka-go's codec of a compression name: none
// (or ""), gzip, snappy, lz4 or zstd.
func ParseCompression(name string) (kafka.Compression, error) {
	switch name {
	case "", "none":
		return 0, nil
	case "gzip":
		return kafka.Gzip, nil
	case "snappy":
		return kafka.Snappy, nil
	case "lz4":
		return kafka.Lz4, nil
	case "zstd":
		return kafka.Zstd, nil
	}
	return 0, fmt.Errorf("unknown compression %q (want none, gzip, snappy, lz4 or zstd)", name)
}

// Close flushes and closes the writers and their connections; it waits
// for ProduceAsync's records on their way to be answered.
func (p *Producer) Close() error {
	var aerr error
	p.asyncOnce.Do(func() {}) // no async writer after Close
	if p.aw != nil {
		aerr = p.aw.Close()
	}
	err := errors.Join(p.w.Close(), aerr)
	p.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("close Kafka writer: %w", err)
	}
	return nil
}

// DeadLetterWriter stores records that can never be written in the
// dead-letter topic "<topic>.dlq" of the topic they came from, with the
// same key and value and the headers "sluice-reason" (why),
// "sluice-id" (the record ID) and "sluice-source" ("topic/partition@offset",
// only for records consumed from Kafka, i.e. Pos.Offset ≥ 0; malformed input
// rows carry their file:line in the reason instead). Writes are synchronous
// with RequireAll, like Producer. It implements ingest.DeadLetters.
type DeadLetterWriter struct {
	p *Producer
}

var _ ingest.DeadLetters = (*DeadLetterWriter)(nil)

// DeadLetterTopic returns the dead-letter topic of topic.
func DeadLetterTopic(topic string) string { return topic + ".dlq" }

// NewDeadLetterWriter validates cfg and creates the writer; it connects
// lazily. cfg.Topics are the dead-letter topics it writes to. The
// dead-letter topics must exist (EnsureTopic).
func NewDeadLetterWriter(cfg ProducerConfig) (*DeadLetterWriter, error) {
	p, err := NewProducer(cfg)
	if err != nil {
		return nil, err
	}
	return &DeadLetterWriter{p: p}, nil
}

// DeadLetter writes every letter's record to DeadLetterTopic of its
// Record.Pos.Topic with its reason, in one batch, and returns nil once every
// in-sync replica has them all. A record too large for a Kafka message (see
// Fits) is stored with its value cut to fit and the header
// "sluice-truncated" giving its full size in bytes; the reason says where
// the whole record is (a file:line, say). It fails (wrapping ErrNoTopic)
// when a record's Pos.Topic is empty, or ErrTopicNotConfigured when its
// dead-letter topic is not one of the writer's Topics, before writing
// anything.
func (d *DeadLetterWriter) DeadLetter(ctx context.Context, letters ...ingest.DeadLetter) error {
	msgs := make([]kafka.Message, len(letters))
	for i, l := range letters {
		rec := l.Record
		if rec.Pos.Topic == "" {
			return fmt.Errorf("dead-letter record %q: %w", rec.ID, ErrNoTopic)
		}
		if err := d.p.writes(DeadLetterTopic(rec.Pos.Topic)); err != nil {
			return fmt.Errorf("dead-letter record %q: %w", rec.ID, err)
		}
		headers := []kafka.Header{{Key: HeaderReason, Value: []byte(l.Reason)}}
		if rec.Pos.Offset >= 0 {
			headers = append(headers, kafka.Header{Key: HeaderSource, Value: []byte(rec.Pos.String())})
		}
		m := message(DeadLetterTopic(rec.Pos.Topic), rec, headers...)
		if over := messageSize(m) + int64(len(HeaderTruncated)) + 20 - d.p.maxBytes; over > 0 {
			full := len(m.Value)
			m.Value = m.Value[:max(len(m.Value)-int(over), 0)]
			m.Headers = append(m.Headers, kafka.Header{Key: HeaderTruncated, Value: []byte(strconv.Itoa(full))})
		}
		msgs[i] = m
	}
	if len(msgs) == 0 {
		return nil
	}
	if err := d.p.w.WriteMessages(ctx, msgs...); err != nil {
		if len(letters) == 1 {
			return fmt.Errorf("dead-letter record %q from %s to topic %q: %w", letters[0].Record.ID, letters[0].Record.Pos, msgs[0].Topic, d.p.conn.annotate(d.p.brokers, err))
		}
		return fmt.Errorf("dead-letter %d records: %w", len(letters), d.p.conn.annotate(d.p.brokers, err))
	}
	return nil
}

// Close flushes and closes the writer and its connections.
func (d *DeadLetterWriter) Close() error { return d.p.Close() }
