package ingesttest

import (
	"context"
	"sync"

	"github.com/sluicehq/sluice/ingest"
)

// Queue is an in-memory ingest.Source: one queue partition's records, in
// order, then nothing (Fetch waits until its ctx is done). Safe for
// concurrent use.
type Queue struct {
	mu       sync.Mutex
	recs     []ingest.Record
	next     int
	left     int
	finished chan struct{}
}

var (
	_ ingest.Source = (*Queue)(nil)
	_ ingest.Lagger = (*Queue)(nil)
)

// NewQueue returns a Queue of records with these values at offsets 0, 1,
// … of topic.
func NewQueue(topic string, values ...[]byte) *Queue {
	q := &Queue{left: len(values), finished: make(chan struct{})}
	for i, v := range values {
		q.recs = append(q.recs, ingest.Record{Pos: ingest.Position{Topic: topic, Offset: int64(i)}, Value: v})
	}
	if q.left == 0 {
		close(q.finished)
	}
	return q
}

// Fetch returns the next record, or waits until ctx is done once there is
// none.
func (q *Queue) Fetch(ctx context.Context) (ingest.Record, error) {
	q.mu.Lock()
	if q.next < len(q.recs) {
		rec := q.recs[q.next]
		q.next++
		q.mu.Unlock()
		return rec, nil
	}
	q.mu.Unlock()
	<-ctx.Done()
	return ingest.Record{}, ctx.Err()
}

// Done counts a record finished.
func (q *Queue) Done(ingest.Record) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.left--; q.left == 0 {
		close(q.finished)
	}
}

// Lag is the records not fetched yet.
func (q *Queue) Lag() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return int64(len(q.recs) - q.next)
}

// Finished is closed once every record is Done.
func (q *Queue) Finished() <-chan struct{} { return q.finished }

// Discard is an ingest.DeadLetters that drops what it is given.
type Discard struct{}

// DeadLetter drops letters.
func (Discard) DeadLetter(context.Context, ...ingest.DeadLetter) error { return nil }
