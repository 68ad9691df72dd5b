package queue

import (
	"cmp"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/ingest"
)

// commitTracker decides, per Kafka partition, which offset may be committed:
// the lowest fetched offset whose record is not yet Done, or one past the
// highest fetched offset when every fetched record is Done ("next offset to
// read" semantics, the value Kafka stores for a group). Only fetched offsets
// count, so gaps left by compaction or transaction markers never hold a
// commit back. Done may come in any order, more than once, and for offsets
// the tracker no longer knows (ignored).
//
// A partition's state is reset when it is fetched again at or below its
// highest fetched offset: the consumer re-seeked to the group's committed
// offset after a rebalance, and everything from there is fetched again.
// After a rebalance every partition is suspended: not committed until it is
// fetched again, so a partition revoked by the rebalance is never committed
// by this member again (late Done calls for it cannot rewind the offsets its
// new owner commits). A fetch above the highest fetched offset lifts the
// suspension and keeps the in-flight state, which is always safe: the
// commit then waits for those records too. So does resume, for partitions
// the group says are still this member's (a "rebalance" that moved nothing,
// or a partition with nothing more to fetch).
//
// Memory is O(records in flight). Safe for concurrent use.
type commitTracker struct {
	mu    sync.Mutex
	parts map[topicPartition]*partitionState
	epoch uint64 // bumped on every reset, to match commits with the state they came from
	// suspensions counts suspendAll calls, so a resume decided on an
	// assignment read before the latest suspension is not applied.
	suspensions uint64
}

type topicPartition struct {
	topic     string
	partition int
}

// partitionState is one partition's fetched-but-not-committable offsets.
type partitionState struct {
	// inFlight are the fetched offsets from the lowest not-Done one on, in
	// fetch (ascending) order.
	inFlight []int64
	// done holds the offsets of inFlight that are Done.
	done map[int64]struct{}
	// last is the highest offset fetched.
	last int64
	// committed is the offset last committed (or the first fetched offset
	// of this state, which needs no commit).
	committed int64
	suspended bool
	epoch     uint64
}

// offsetCommit is one partition's offset to commit.
type offsetCommit struct {
	topic     string
	partition int
	// offset is the next offset to read: every fetched record below it is
	// Done.
	offset int64
	epoch  uint64
}

func newCommitTracker() *commitTracker {
	return &commitTracker{parts: make(map[topicPartition]*partitionState)}
}

// fetched records that pos was handed out and is now in flight. It reports
// whether the partition's state was reset (a re-seek).
func (t *commitTracker) fetched(pos ingest.Position) (reset bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := topicPartition{pos.Topic, pos.Partition}
	p := t.parts[key]
	if p == nil || pos.Offset <= p.last {
		reset = p != nil
		t.epoch++
		p = &partitionState{done: make(map[int64]struct{}), last: pos.Offset - 1, committed: pos.Offset, epoch: t.epoch}
		t.parts[key] = p
	}
	p.suspended = false
	p.inFlight = append(p.inFlight, pos.Offset)
	p.last = pos.Offset
	return reset
}

// done marks pos finished. It reports false when pos is not in flight
// (never fetched, already Done, or from before a reset).
func (t *commitTracker) done(pos ingest.Position) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.parts[topicPartition{pos.Topic, pos.Partition}]
	if p == nil || len(p.inFlight) == 0 || pos.Offset < p.inFlight[0] || pos.Offset > p.last {
		return false
	}
	if _, dup := p.done[pos.Offset]; dup {
		return false
	}
	if pos.Offset != p.inFlight[0] {
		// Out of order: remember it if it was fetched (gaps are never
		// fetched, so a binary search tells).
		if _, ok := slices.BinarySearch(p.inFlight, pos.Offset); !ok {
			return false
		}
		p.done[pos.Offset] = struct{}{}
		return true
	}
	// The head is done: drop it and every Done offset right behind it.
	p.inFlight = p.inFlight[1:]
	for len(p.inFlight) > 0 {
		if _, ok := p.done[p.inFlight[0]]; !ok {
			break
		}
		delete(p.done, p.inFlight[0])
		p.inFlight = p.inFlight[1:]
	}
	if len(p.inFlight) == 0 {
		p.inFlight = nil // let the backing array go
	}
	return true
}

// committable returns the offsets worth committing: one per partition that
// is not suspended and whose committable offset advanced past the last
// commit. Sorted by topic and partition.
func (t *commitTracker) committable() []offsetCommit {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []offsetCommit
	for key, p := range t.parts {
		if p.suspended {
			continue
		}
		next := p.last + 1
		if len(p.inFlight) > 0 {
			next = p.inFlight[0]
		}
		if next > p.committed {
			out = append(out, offsetCommit{topic: key.topic, partition: key.partition, offset: next, epoch: p.epoch})
		}
	}
	slices.SortFunc(out, func(a, b offsetCommit) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	return out
}

// committed records that c was committed. A commit from before a reset of
// its partition is ignored.
func (t *commitTracker) committed(c offsetCommit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.parts[topicPartition{c.topic, c.partition}]
	if p != nil && p.epoch == c.epoch && c.offset > p.committed {
		p.committed = c.offset
	}
}

// suspendAll stops committing every partition until it is fetched again:
// a rebalance happened, so each partition is either revoked (never commit
// it again) or fetched again (from the group's committed offset, or on from
// where it was).
func (t *commitTracker) suspendAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.suspensions++
	for _, p := range t.parts {
		p.suspended = true
	}
}

// suspension returns the number of suspensions so far and whether any
// partition is suspended now.
func (t *commitTracker) suspension() (seq uint64, any bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.parts {
		if p.suspended {
			return t.suspensions, true
		}
	}
	return t.suspensions, false
}

// resume lifts the suspension of topic's partitions in assigned (the
// member's current assignment, read after suspension seq), keeping their
// in-flight state: they are this member's, so their Done records may be
// committed. Nothing happens if another suspension came since seq.
func (t *commitTracker) resume(seq uint64, topic string, assigned []int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if seq != t.suspensions {
		return
	}
	for _, partition := range assigned {
		if p := t.parts[topicPartition{topic, partition}]; p != nil {
			p.suspended = false
		}
	}
}

// inFlight returns the number of fetched records not yet committable, over
// all partitions.
func (t *commitTracker) inFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range t.parts {
		n += len(p.inFlight) - len(p.done)
	}
	return n
}
