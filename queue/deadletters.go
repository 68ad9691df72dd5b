package queue

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluicehq/sluice/ingest"
)

// DeadLetterMessage is one message of a dead-letter topic.
type DeadLetterMessage struct {
	Partition int
	Offset    int64
	// ID is the record's ID (header sluice-id); Reason why it was
	// dead-lettered (sluice-reason); Source where it was consumed,
	// "topic/partition@offset", empty for a row refused before producing
	// (its reason starts with its file:line).
	ID, Reason, Source string
	Key, Value         []byte
	// Truncated is the value's full size when the dead-letter topic holds
	// only its start (sluice-truncated), else 0.
	Truncated int
}

// Kind is the reason without the part that names this record: "HTTP 400:
// missing required field \"time\"" for "record t/0@7 (id a1): HTTP 400:
// missing required field \"time\"" and "wrong number of fields" for
// "quakes.csv:12: wrong number of fields". It groups dead letters by cause.
func (m DeadLetterMessage) Kind() string {
	return recordPrefix.ReplaceAllString(m.Reason, "")
}

// recordPrefix matches how the pipeline and the file reader name a record
// at the start of a reason.
var recordPrefix = regexp.MustCompile(`^(record \S+( \(id [^)]*\))?|\S+:\d+): `)

// ReadDeadLetters calls each for every message of topic's dead-letter topic
// (DeadLetterTopic(topic)), partition by partition in offset order, from
// the first to the last there was when it started. It stops at each's
// first error and returns it; ErrUnknownTopic when there is no dead-letter
// topic.
func (a Admin) ReadDeadLetters(ctx context.Context, topic string, each func(DeadLetterMessage) error) error {
	dlq := DeadLetterTopic(topic)
	ends, err := a.EndOffsets(ctx, dlq)
	if err != nil {
		return err
	}
	for partition, end := range ends {
		if end == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers: a.Brokers, Topic: dlq, Partition: partition, Dialer: a.Conn.Dialer(),
			MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 100 * time.Millisecond,
		})
		err := readUntil(ctx, r, end, partition, each)
		if cerr := r.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close the reader of %s: %w", dlq, cerr)
		}
		if err != nil {
			return a.Conn.annotate(a.Brokers, err)
		}
	}
	return nil
}

func readUntil(ctx context.Context, r *kafka.Reader, end int64, partition int, each func(DeadLetterMessage) error) error {
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		dl := DeadLetterMessage{Partition: partition, Offset: m.Offset, Key: m.Key, Value: m.Value}
		for _, h := range m.Headers {
			switch h.Key {
			case HeaderID:
				dl.ID = string(h.Value)
			case HeaderReason:
				dl.Reason = string(h.Value)
			case HeaderSource:
				dl.Source = string(h.Value)
			case HeaderTruncated:
				dl.Truncated, _ = strconv.Atoi(string(h.Value))
			}
		}
		if err := each(dl); err != nil {
			return err
		}
		if m.Offset+1 >= end {
			return nil
		}
	}
}

// ErrTruncatedDeadLetter is returned by Replay for a dead letter whose value
// the dead-letter topic holds only in part: replay it from where its reason
// says it came from.
var ErrTruncatedDeadLetter = errors.New("queue: the dead letter holds only the start of the record")

// Replay produces dead letters back to topic with their ID and key, so that
// the sink, which dedupes by ID, stores each once however often they are
// replayed. It refuses (before producing anything) a dead letter whose
// value was truncated.
func (p *Producer) Replay(ctx context.Context, topic string, letters []DeadLetterMessage) error {
	recs := make([]ingest.Record, len(letters))
	for i, l := range letters {
		if l.Truncated > 0 {
			return fmt.Errorf("%w: dead letter %d@%d (id %s, %d bytes)", ErrTruncatedDeadLetter, l.Partition, l.Offset, l.ID, l.Truncated)
		}
		recs[i] = ingest.Record{ID: l.ID, Key: l.Key, Value: l.Value}
	}
	return p.Produce(ctx, topic, recs)
}
