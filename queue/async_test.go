package queue

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// answers collects ProduceAsync's answers.
type answers struct {
	mu      sync.Mutex
	chunks  int
	errs    [][]error
	pending int // records sent and not answered
	maxSeen int
	done    chan struct{}
	want    int
}

func (a *answers) sent(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pending += n
	a.maxSeen = max(a.maxSeen, a.pending)
}

func (a *answers) answer(n int) func([]error) {
	return func(errs []error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.pending -= n
		a.errs = append(a.errs, errs)
		if a.chunks++; a.chunks == a.want {
			close(a.done)
		}
	}
}

// Every record of every chunk is acknowledged once, compressed with each
// codec on the wire (lz4 with its 64 KiB blocks), and reads back whole;
// no more records are ever unanswered than MaxInFlight.
func TestProduceAsyncAcknowledgesEveryRecord(t *testing.T) {
	t.Parallel()
	for _, codec := range []string{"lz4", "snappy", "zstd", "gzip", "none"} {
		t.Run(codec, func(t *testing.T) {
			t.Parallel()
			topic := newTopic(t, 3)
			p, err := NewProducer(ProducerConfig{Brokers: testBrokers, Logger: testLogger(), RoundRobin: true,
				Compression: codec, MaxInFlight: 300, AsyncBatchSize: 100})
			require.NoError(t, err)
			const chunks, size = 20, 100
			a := &answers{done: make(chan struct{}), want: chunks}
			for c := range chunks {
				recs := make([]ingest.Record, size)
				for i := range recs {
					id := fmt.Sprintf("r%d-%d", c, i)
					recs[i] = ingest.Record{ID: id, Value: fmt.Appendf(nil, `{"id":%q,"place":"45 km ESE of Beatty, Nevada"}`, id)}
				}
				require.NoError(t, p.ProduceAsync(testContext(t), topic, recs, a.answer(size)))
				a.sent(size)
			}
			select {
			case <-a.done:
			case <-testContext(t).Done():
				t.Fatal("not every chunk was answered")
			}
			require.NoError(t, p.Close())
			for _, errs := range a.errs {
				require.Nil(t, errs, "every record acknowledged")
			}
			require.LessOrEqual(t, a.maxSeen, 300, "records unanswered at once")

			end, err := EndOffsets(testContext(t), testBrokers, topic)
			require.NoError(t, err)
			var total int64
			for _, o := range end {
				total += o
			}
			require.EqualValues(t, chunks*size, total)
			src := newTestSource(t, topic, "g-"+t.Name())
			stop := runSource(t, src)
			seen := map[string]bool{}
			for _, r := range fetchN(t, src, chunks*size) {
				require.JSONEq(t, fmt.Sprintf(`{"id":%q,"place":"45 km ESE of Beatty, Nevada"}`, r.ID), string(r.Value))
				seen[r.ID] = true
			}
			require.Len(t, seen, chunks*size)
			require.NoError(t, stop())
		})
	}
}

// A record the broker refuses for its size is answered alone with a
// *RecordError; the records batched with it are acknowledged.
func TestProduceAsyncRefusesOnlyTheRecordTooLarge(t *testing.T) {
	t.Parallel()
	topic := newTopic(t, 1)
	// The writer lets 2 MiB through; the broker takes about 1 MiB.
	p, err := NewProducer(ProducerConfig{Brokers: testBrokers, Logger: testLogger(), Compression: "none", BatchBytes: 4 << 20})
	require.NoError(t, err)
	defer p.Close()
	noise := make([]byte, 1_500_000)
	_, _ = rand.Read(noise)
	big := fmt.Appendf(nil, `{"id":"big","pad":%q}`, base64.StdEncoding.EncodeToString(noise))
	recs := []ingest.Record{
		{ID: "a", Value: []byte(`{"id":"a"}`)},
		{ID: "big", Value: big},
		{ID: "b", Value: []byte(`{"id":"b"}`)},
	}
	got := make(chan []error, 1)
	require.NoError(t, p.ProduceAsync(testContext(t), topic, recs, func(errs []error) { got <- errs }))
	errs := <-got
	require.Len(t, errs, 3)
	require.NoError(t, errs[0])
	require.NoError(t, errs[2])
	var re *RecordError
	require.True(t, errors.As(errs[1], &re), "%v", errs[1])
	require.True(t, re.Refused())
	require.True(t, errors.Is(errs[1], kafka.MessageSizeTooLarge), "%v", errs[1])

	src := newTestSource(t, topic, "g-"+t.Name())
	stop := runSource(t, src)
	var ids []string
	for _, r := range fetchN(t, src, 2) {
		ids = append(ids, r.ID)
	}
	require.ElementsMatch(t, []string{"a", "b"}, ids)
	require.NoError(t, stop())
}

// Errors that are about the call, not a record, come back at once and
// nothing is queued.
func TestProduceAsyncErrors(t *testing.T) {
	t.Parallel()
	p, err := NewProducer(ProducerConfig{Brokers: testBrokers, Logger: testLogger()})
	require.NoError(t, err)
	called := false
	require.ErrorIs(t, p.ProduceAsync(testContext(t), "", []ingest.Record{{ID: "x", Value: []byte(`{}`)}}, func([]error) { called = true }), ErrNoTopic)
	require.NoError(t, p.Close())
	require.False(t, called)
	_, err = NewProducer(ProducerConfig{Brokers: testBrokers, Compression: "lzma"})
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, `unknown compression "lzma"`)
}
