package ingesttest

import (
	"context"
	"sync"

	"github.com/sluicehq/sluice/ingest"
)

// Queue is an in-memory ingest.Source: one queue partition's records, in
// order, then nothing until more are added (Fetch waits for them until its
// ctx is done). Safe for concurrent use.
type Queue struct {
	mu       sync.Mutex
	topic    string
	recs     []ingest.Record
	next     int
	left     int
	finished chan struct{}
	added    chan struct{} // closed and replaced when records are added
}

var (
	_ ingest.Source = (*Queue)(nil)
	_ ingest.Lagger = (*Queue)(nil)
)

// NewQueue returns a Queue of records with these values at offsets 0, 1,
// … of topic.
func NewQueue(topic string, values ...[]byte) *Queue {
	q := &Queue{topic: topic, finished: make(chan struct{}), added: make(chan struct{})}
	close(q.finished)
	q.Add(values...)
	return q
}

// Add appends records with these values at the next offsets, waking a
// Fetch that waits; Finished is open again until they are Done too.
func (q *Queue) Add(values ...[]byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(values) == 0 {
		return
	}
	for _, v := range values {
		q.recs = append(q.recs, ingest.Record{Pos: ingest.Position{Topic: q.topic, Offset: int64(len(q.recs))}, Value: v})
	}
	if q.left == 0 {
		q.finished = make(chan struct{})
	}
	q.left += len(values)
	close(q.added)
	q.added = make(chan struct{})
}

// Fetch returns the next record, or waits for one to be added until ctx
// is done.
func (q *Queue) Fetch(ctx context.Context) (ingest.Record, error) {
	for {
		q.mu.Lock()
		if q.next < len(q.recs) {
			rec := q.recs[q.next]
			q.next++
			q.mu.Unlock()
			return rec, nil
		}
		added := q.added
		q.mu.Unlock()
		select {
		case <-added:
		case <-ctx.Done():
			return ingest.Record{}, ctx.Err()
		}
	}
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

// Finished is closed once every record added so far is Done.
func (q *Queue) Finished() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.finished
}

// Discard is an ingest.DeadLetters that drops what it is given.
type Discard struct{}

// DeadLetter drops letters.
func (Discard) DeadLetter(context.Context, ...ingest.DeadLetter) error { return nil }
