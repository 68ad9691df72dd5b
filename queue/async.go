package queue

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/segmentio/kafka-go"

	"github.com/sluicehq/sluice/ingest"
)

// RecordError is a record the broker refused for good by a verdict about
// that record alone (too large, an invalid record or timestamp): it is to
// be dead-lettered, not produced again. Refused reports true.
type RecordError struct {
	Err error
}

func (e *RecordError) Error() string { return "refused by Kafka: " + e.Err.Error() }
func (e *RecordError) Unwrap() error { return e.Err }

// Refused reports that the broker refused this record for good.
func (e *RecordError) Refused() bool { return true }

// refusedForContent reports whether a produce error refuses a batch for
// what it holds (one of its records, usually) rather than for the state of
// the broker.
func refusedForContent(err error) bool {
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil {
				return refusedForContent(e)
			}
		}
		return false
	}
	var ke kafka.Error
	if !errors.As(err, &ke) {
		var tl kafka.MessageTooLargeError
		return errors.As(err, &tl)
	}
	switch ke {
	case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge, kafka.InvalidTimestamp, kafka.InvalidRecord:
		return true
	}
	return false
}

// soleError returns the error of a one-message write: kafka-go wraps it in
// WriteErrors.
func soleError(err error) error {
	var we kafka.WriteErrors
	if errors.As(err, &we) && len(we) == 1 && we[0] != nil {
		return we[0]
	}
	return err
}

// asyncChunk is one ProduceAsync call's records on their way.
type asyncChunk struct {
	n    int
	done func(errs []error)
	left atomic.Int64
	mu   sync.Mutex
	errs []error // nil while no record failed
}

// asyncRef ties a message to its chunk (kafka.Message.WriterData).
type asyncRef struct {
	c *asyncChunk
	i int
}

func (c *asyncChunk) finish(i int, err error) {
	if err != nil {
		c.mu.Lock()
		if c.errs == nil {
			c.errs = make([]error, c.n)
		}
		c.errs[i] = err
		c.mu.Unlock()
	}
	if c.left.Add(-1) == 0 {
		c.mu.Lock()
		errs := c.errs
		c.mu.Unlock()
		c.done(errs)
	}
}

// asyncWriter returns the writer of ProduceAsync, creating it at the first
// call: kafka-go's Writer in its asynchronous mode, with the same acks,
// batching and balancer as the synchronous one, the configured compression
// on the wire, and a completion handler that answers each chunk.
func (p *Producer) asyncWriter() *kafka.Writer {
	p.asyncOnce.Do(func() {
		p.aw = p.newAsync()
		p.aw.Completion = p.complete
	})
	return p.aw
}

// ProduceAsync queues recs for topic and returns as soon as they are
// queued, so that many chunks are on their way at once; it blocks while
// MaxInFlight records are unacknowledged (memory stays bounded), until ctx
// ends (its error; nothing queued). done is called once, from another
// goroutine, when every record of recs is answered: with nil when every
// in-sync replica acknowledged them all (RequireAll), else with one error
// per record, nil for each record acknowledged. A record's error is a
// *RecordError when the broker refused that record for good (a batch
// refused for its content is sent again one record at a time to find
// which), any other error when the broker failed after MaxAttempts
// (transport, timeouts, no leader): the record is then not stored, and
// producing it again later is safe (the sink dedupes by ID). An error
// returned by ProduceAsync itself (no such topic, the broker unreachable
// for metadata, a record larger than BatchBytes) means nothing was queued
// and done is not called. Messages are built as Produce builds them.
func (p *Producer) ProduceAsync(ctx context.Context, topic string, recs []ingest.Record, done func(errs []error)) error {
	if err := p.writes(topic); err != nil {
		return err
	}
	if len(recs) == 0 {
		done(nil)
		return nil
	}
	w := p.asyncWriter()
	if w == nil {
		return fmt.Errorf("produce to topic %q: the producer is closed", topic)
	}
	weight := min(int64(len(recs)), p.maxInFlight)
	if err := p.inFlight.Acquire(ctx, weight); err != nil {
		return context.Cause(ctx)
	}
	c := &asyncChunk{n: len(recs), done: func(errs []error) {
		done(errs)
		p.inFlight.Release(weight) // after the answer: at most MaxInFlight unanswered
	}}
	c.left.Store(int64(len(recs)))
	refs := make([]asyncRef, len(recs))
	msgs := make([]kafka.Message, len(recs))
	headers := make([]kafka.Header, len(recs)) // one array for the chunk's ID headers
	for i, rec := range recs {
		refs[i] = asyncRef{c: c, i: i}
		msgs[i] = message(topic, rec, headers[i:i:i+1]...)
		msgs[i].WriterData = &refs[i]
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		p.inFlight.Release(weight)
		return fmt.Errorf("produce %d records to topic %q: %w", len(recs), topic, p.conn.annotate(p.brokers, err))
	}
	return nil
}

// complete answers the records of one batch (the async writer's
// Completion).
func (p *Producer) complete(msgs []kafka.Message, err error) {
	if err == nil {
		for _, m := range msgs {
			ref := m.WriterData.(*asyncRef)
			ref.c.finish(ref.i, nil)
		}
		return
	}
	if !refusedForContent(err) {
		err = fmt.Errorf("produce to topic %q: %w", msgs[0].Topic, p.conn.annotate(p.brokers, err))
		for _, m := range msgs {
			ref := m.WriterData.(*asyncRef)
			ref.c.finish(ref.i, err)
		}
		return
	}
	// Refused for its content: find the records refused alone.
	for _, m := range msgs {
		ref := m.WriterData.(*asyncRef)
		alone := m
		alone.WriterData, alone.Partition, alone.Offset = nil, 0, 0
		ctx, cancel := context.WithTimeout(context.Background(), p.writeTimeout)
		werr := soleError(p.w.WriteMessages(ctx, alone))
		cancel()
		switch {
		case werr == nil:
		case refusedForContent(werr):
			werr = &RecordError{Err: werr}
		default:
			werr = fmt.Errorf("produce to topic %q: %w", m.Topic, p.conn.annotate(p.brokers, werr))
		}
		ref.c.finish(ref.i, werr)
	}
}
