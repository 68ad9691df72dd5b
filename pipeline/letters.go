package pipeline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// Dead-letter writing: up to letterBatch records per write, each write
// bounded by letterTimeout, and a failed write retried after a wait that
// doubles from letterBackoff up to letterBackoffMax.
const (
	letterBatch      = 500
	letterTimeout    = 30 * time.Second
	letterBackoff    = 100 * time.Millisecond
	letterBackoffMax = 5 * time.Second
)

// letterQueue holds the records waiting for the dead-letter topic. Its
// length is bounded by the in-flight bound (each record counts against it
// until it is stored) and the fetcher pauses at maxLetterBacklog.
type letterQueue struct {
	mu      sync.Mutex
	pending []letter
	wake    chan struct{}
	failing atomic.Int64 // unix ns since writes have been failing; 0 when they are not
}

type letter struct {
	it     *item
	reason string
}

func (q *letterQueue) init() { q.wake = make(chan struct{}, 1) }

func (q *letterQueue) push(l letter) {
	q.mu.Lock()
	q.pending = append(q.pending, l)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take removes and returns up to n letters, oldest first.
func (q *letterQueue) take(n int) []letter {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.pending))
	out := q.pending[:n:n]
	q.pending = q.pending[n:]
	return out
}

// putBack returns ls to the front of the queue.
func (q *letterQueue) putBack(ls []letter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pending = append(ls[:len(ls):len(ls)], q.pending...)
}

func (q *letterQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}

// deadLetter queues it for the dead-letter topic with reason; its slot is
// freed once it is stored.
func (p *Pipeline) deadLetter(it *item, reason string) {
	p.letters.push(letter{it: it, reason: reason})
}

// deadLetters writes the queued dead letters, outside the sink's request
// slots, until closing is closed and the queue is empty, or ctx is done
// (the letters left are then redelivered). A failed write is retried with
// backoff; meanwhile the fetcher pauses once the queue is long, so an
// unreachable dead-letter topic stops the intake instead of burning budget.
func (p *Pipeline) deadLetters(ctx context.Context, closing <-chan struct{}) {
	wait := letterBackoff
	for {
		batch := p.letters.take(letterBatch)
		if len(batch) == 0 {
			select {
			case <-p.letters.wake:
				continue
			case <-closing:
				if p.letters.len() == 0 {
					return
				}
				continue
			case <-ctx.Done():
				return
			}
		}
		letters := make([]ingest.DeadLetter, len(batch))
		for i, l := range batch {
			letters[i] = ingest.DeadLetter{Record: l.it.rec, Reason: l.reason}
		}
		wctx, cancel := context.WithTimeout(ctx, letterTimeout)
		err := p.p.DeadLetters.DeadLetter(wctx, letters...)
		cancel()
		if err != nil {
			p.letters.putBack(batch)
			if ctx.Err() != nil {
				return
			}
			p.letters.failing.CompareAndSwap(0, time.Now().UnixNano())
			p.letterErrLog.Do(func() {
				p.log.Error("dead-letter write failed, retrying; good records go on", "records", len(batch), "err", err)
			})
			if !sleepUntil(ctx, time.Now().Add(wait)) {
				return
			}
			wait = min(2*wait, letterBackoffMax)
			continue
		}
		wait = letterBackoff
		p.letters.failing.Store(0)
		now := time.Now()
		for _, l := range batch {
			total := p.c.Count(ingest.EventDeadLettered, 1)
			p.letterLog.Do(func() {
				p.log.Warn("record dead-lettered", "record_id", l.it.rec.ID, "source", l.it.rec.Pos.String(),
					"reason", l.reason, "dead_lettered_total", total)
			})
			p.finish(l.it, now)
		}
	}
}
