package queue

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// readPartition reads n messages of topic's partition 0 from the start,
// outside any group.
func readPartition(t *testing.T, topic string, n int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: testBrokers, Topic: topic, MaxWait: 100 * time.Millisecond, ReadLagInterval: -1})
	defer func() { require.NoError(t, r.Close()) }()
	ctx := testContext(t)
	out := make([]kafka.Message, 0, n)
	for range n {
		m, err := r.FetchMessage(ctx)
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

func headers(m kafka.Message) map[string]string {
	out := map[string]string{}
	for _, h := range m.Headers {
		out[h.Key] = string(h.Value)
	}
	return out
}

func TestDeadLetterLandsInDLQWithHeaders(t *testing.T) {
	t.Parallel()
	topic := newTopic(t, 2)
	produceN(t, topic, 1)
	src := newTestSource(t, topic, "g-"+t.Name())
	stop := runSource(t, src)
	rec := fetchN(t, src, 1)[0]

	dlq, err := NewDeadLetterWriter(ProducerConfig{Brokers: testBrokers, Logger: testLogger()})
	require.NoError(t, err)
	defer func() { require.NoError(t, dlq.Close()) }()
	ctx := testContext(t)
	require.NoError(t, dlq.DeadLetter(ctx, ingest.DeadLetter{Record: rec, Reason: "HTTP 400: field mag is not a number"}))
	// A malformed input row: never in Kafka, so no sluice-source.
	row := ingest.Record{ID: "sha256:abc", Value: []byte("not json"), Pos: ingest.Position{Topic: topic, Offset: -1}}
	require.NoError(t, dlq.DeadLetter(ctx, ingest.DeadLetter{Record: row, Reason: "quakes.csv:7: wrong number of fields"}))
	src.Done(rec)
	require.NoError(t, stop())

	got := readPartition(t, DeadLetterTopic(topic), 2)
	require.Equal(t, rec.Value, got[0].Value)
	require.Equal(t, rec.Key, got[0].Key)
	require.Equal(t, map[string]string{
		HeaderReason: "HTTP 400: field mag is not a number",
		HeaderID:     rec.ID,
		HeaderSource: rec.Pos.String(),
	}, headers(got[0]))
	require.Equal(t, "not json", string(got[1].Value))
	require.Equal(t, []byte("sha256:abc"), got[1].Key)
	require.Equal(t, map[string]string{HeaderReason: "quakes.csv:7: wrong number of fields", HeaderID: "sha256:abc"}, headers(got[1]))
}

func TestDeadLetterWithoutTopic(t *testing.T) {
	t.Parallel()
	dlq, err := NewDeadLetterWriter(ProducerConfig{Brokers: testBrokers})
	require.NoError(t, err)
	defer dlq.Close()
	err = dlq.DeadLetter(testContext(t), ingest.DeadLetter{Record: ingest.Record{ID: "x"}, Reason: "why"})
	require.ErrorIs(t, err, ErrNoTopic)
}

// Produce keeps an explicit key (same key, same partition), sets the ID
// header, and lands every record.
func TestProduceKeysAndHeaders(t *testing.T) {
	t.Parallel()
	topic := newTopic(t, 4)
	p, err := NewProducer(ProducerConfig{Brokers: testBrokers, Logger: testLogger()})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	recs := []ingest.Record{
		{ID: "a", Key: []byte("k"), Value: []byte(`{"i":1}`)},
		{ID: "b", Key: []byte("k"), Value: []byte(`{"i":2}`)},
		{ID: "c", Key: []byte("k"), Value: []byte(`{"i":3}`)},
	}
	require.NoError(t, p.Produce(testContext(t), topic, recs))
	require.NoError(t, p.Produce(testContext(t), topic, nil), "nothing to produce")
	require.ErrorIs(t, p.Produce(testContext(t), "", recs), ErrNoTopic)

	end, err := EndOffsets(testContext(t), testBrokers, topic)
	require.NoError(t, err)
	var total int64
	nonEmpty := 0
	for _, o := range end {
		total += o
		if o > 0 {
			nonEmpty++
		}
	}
	require.Equal(t, int64(3), total)
	require.Equal(t, 1, nonEmpty, "one key, one partition, in order")

	src := newTestSource(t, topic, "g-"+t.Name())
	stop := runSource(t, src)
	got := fetchN(t, src, 3)
	for i, r := range got {
		require.Equal(t, recs[i].ID, r.ID)
		require.Equal(t, []byte("k"), r.Key)
		require.Equal(t, recs[i].Value, r.Value)
	}
	require.NoError(t, stop())
}

func TestNewProducerValidates(t *testing.T) {
	t.Parallel()
	_, err := NewProducer(ProducerConfig{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	_, err = NewDeadLetterWriter(ProducerConfig{Brokers: []string{"127.0.0.1:1"}, BatchSize: -1})
	require.ErrorIs(t, err, ErrInvalidConfig)
}
