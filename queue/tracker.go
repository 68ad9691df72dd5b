package queue

import (
	"cmp"
	"maps"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/ingest"
)

// commitTracker decides, per Kafka partition, which offset may be committed
// and which fetched records this member still owns.
//
// Commits: the lowest fetched offset whose record is not yet Done, or one
// past the highest fetched offset when every fetched record is Done ("next
// offset to read" semantics, the value Kafka stores for a group). Only
// fetched offsets count, so gaps left by compaction or transaction markers
// never hold a commit back. Done may come in any order, more than once, and
// for offsets the tracker no longer knows (ignored).
//
// Generations: join counts the group joins this member started (kafka-go
// asks the balancer for its UserData at each), begin notes that the reader
// fetches from the latest joined generation. A partition is current while
// it was fetched, or confirmed by the group (confirm), in the latest joined
// generation; only current partitions are committed, so a partition lost
// in a rebalance is never committed by this member again (late Done calls
// cannot rewind its new owner's offsets), and only records of current
// partitions are owned (owns). A record not owned is released: the
// pipeline drops it unsent, and it is fetched again — kafka-go re-seeks
// every partition to the group's committed offset in each generation —
// by this member or the partition's new owner.
//
// Re-fetches: a partition fetched again at or below its highest fetched
// offset (the re-seek of a new generation) keeps its state, and the
// re-fetched records already Done or still held by the pipeline are
// skipped, so a member that keeps a partition across a rebalance sends no
// record twice; only released records are handed out again. A fetch below
// the state's first offset, or (in a new generation) above its highest —
// the group committed past everything this member fetched — starts the
// partition afresh.
//
// Memory is O(records in flight). Safe for concurrent use.
type commitTracker struct {
	mu    sync.Mutex
	parts map[topicPartition]*partitionState
	epoch uint64 // bumped on every reset, to match commits with the state they came from
	// gen counts the joins started; started is the latest generation the
	// reader fetches from (started < gen while a join is under way).
	gen, started uint64
	// assigned is the assignment the group confirmed in generation
	// assignedGen.
	assigned    map[topicPartition]struct{}
	assignedGen uint64
	// claims is what the latest join returned.
	claims map[string][]int
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
	// released holds the offsets of inFlight the pipeline dropped unsent
	// (owns said no); a re-fetch hands them out again.
	released map[int64]struct{}
	// start is the first offset fetched in this state.
	start int64
	// last is the highest offset fetched.
	last int64
	// committed is the offset last committed (or the first fetched offset
	// of this state, which needs no commit).
	committed int64
	// gen is the generation the partition was last fetched or confirmed in.
	gen   uint64
	epoch uint64
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

// join notes that the member starts joining the group: no partition is
// current until the new generation fetches or confirms it. It returns what
// the member owns, per topic, sorted: the partitions current until now; or,
// when nothing was learned about the generation that ends (a join retried
// before the reader fetched or the group confirmed anything), what the
// previous join returned.
func (t *commitTracker) join() map[string][]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	learned := t.assignedGen == t.gen
	owned := map[topicPartition]struct{}{}
	for key, p := range t.parts {
		if p.gen == t.gen {
			owned[key] = struct{}{}
			learned = true
		}
	}
	if t.assignedGen == t.gen {
		maps.Copy(owned, t.assigned)
	}
	t.gen++
	if learned {
		t.claims = map[string][]int{}
		for key := range owned {
			t.claims[key.topic] = append(t.claims[key.topic], key.partition)
		}
		for _, parts := range t.claims {
			slices.Sort(parts)
		}
	}
	out := make(map[string][]int, len(t.claims))
	for topic, parts := range t.claims {
		out[topic] = slices.Clone(parts)
	}
	return out
}

// begin notes that the reader fetches from the latest joined generation:
// records fetched from now on belong to it.
func (t *commitTracker) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.started = t.gen
}

// generation returns the latest joined generation and whether the group
// has yet to confirm this member's assignment in it (the reader fetches
// from it and confirm has not been called for it).
func (t *commitTracker) generation() (gen uint64, unconfirmed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gen, t.started == t.gen && t.assignedGen != t.gen
}

// confirm records the member's assignment in generation gen, as the group
// reported it once the reader fetched from gen: the assigned partitions
// become current and the state of partitions not assigned is dropped
// (revoked). Nothing happens when another join started since gen, or the
// reader does not fetch from gen yet.
func (t *commitTracker) confirm(gen uint64, assigned map[string][]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if gen != t.gen || t.started != gen {
		return
	}
	t.assigned = map[topicPartition]struct{}{}
	for topic, parts := range assigned {
		for _, partition := range parts {
			t.assigned[topicPartition{topic, partition}] = struct{}{}
		}
	}
	t.assignedGen = gen
	for key, p := range t.parts {
		if _, ok := t.assigned[key]; ok {
			p.gen = gen
		} else {
			delete(t.parts, key)
		}
	}
}

// fetched records that pos was fetched in the generation the reader
// fetches from. It reports whether to hand the record out (false for a
// re-fetch of a record already Done or still held) and whether the
// partition's state started afresh over an existing one.
func (t *commitTracker) fetched(pos ingest.Position) (deliver, reset bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := topicPartition{pos.Topic, pos.Partition}
	p := t.parts[key]
	gen := t.started
	if p != nil && pos.Offset >= p.start && pos.Offset <= p.last {
		p.gen = max(p.gen, gen)
		return p.refetched(pos.Offset), false
	}
	if p == nil || pos.Offset < p.start || gen > p.gen {
		reset = p != nil
		t.epoch++
		p = &partitionState{
			done: make(map[int64]struct{}), released: make(map[int64]struct{}),
			start: pos.Offset, last: pos.Offset - 1, committed: pos.Offset, epoch: t.epoch,
		}
		t.parts[key] = p
	}
	p.gen = max(p.gen, gen)
	p.inFlight = append(p.inFlight, pos.Offset)
	p.last = pos.Offset
	return true, reset
}

// refetched handles a fetch of offset, start ≤ offset ≤ last.
func (p *partitionState) refetched(offset int64) (deliver bool) {
	if len(p.inFlight) == 0 || offset < p.inFlight[0] {
		return false // Done
	}
	if _, ok := p.done[offset]; ok {
		return false
	}
	if _, ok := p.released[offset]; ok {
		delete(p.released, offset)
		return true
	}
	i, found := slices.BinarySearch(p.inFlight, offset)
	if found {
		return false // the pipeline still holds it
	}
	// Never fetched in this state (a gap then, a record now): in flight.
	p.inFlight = slices.Insert(p.inFlight, i, offset)
	return true
}

// owns reports whether pos is a record the pipeline holds for a current
// partition. When it is held but its partition is not current, it is
// released: the caller drops it unsent and a re-fetch hands it out again.
func (t *commitTracker) owns(pos ingest.Position) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.parts[topicPartition{pos.Topic, pos.Partition}]
	if p == nil || !p.holds(pos.Offset) {
		return false
	}
	if p.gen == t.gen && t.started == t.gen {
		return true
	}
	p.released[pos.Offset] = struct{}{}
	return false
}

// holds reports whether offset is in flight: fetched, not Done, not
// released.
func (p *partitionState) holds(offset int64) bool {
	if len(p.inFlight) == 0 || offset < p.inFlight[0] || offset > p.last {
		return false
	}
	if _, ok := p.done[offset]; ok {
		return false
	}
	if _, ok := p.released[offset]; ok {
		return false
	}
	_, found := slices.BinarySearch(p.inFlight, offset)
	return found
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
	delete(p.released, pos.Offset) // Done is authoritative
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

// committable returns the offsets worth committing: one per current
// partition whose committable offset advanced past the last
// commit. Sorted by topic and partition.
func (t *commitTracker) committable() []offsetCommit {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []offsetCommit
	for key, p := range t.parts {
		if p.gen != t.gen || t.started != t.gen {
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

// inFlight returns the number of fetched records the pipeline holds (not
// Done, not released), over all partitions.
func (t *commitTracker) inFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range t.parts {
		n += len(p.inFlight) - len(p.done) - len(p.released)
	}
	return n
}
