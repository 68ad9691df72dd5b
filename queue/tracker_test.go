package queue

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func pos(partition int, offset int64) ingest.Position {
	return ingest.Position{Topic: "t", Partition: partition, Offset: offset}
}

// step is one tracker operation on partition 0.
type step struct {
	op     byte // 'f' fetch, 'd' done, 'j' join (a rebalance starts), 'b' the reader fetches from the joined generation, 'c' commit what is committable
	offset int64
}

func f(o ...int64) []step { return ops('f', o) }
func d(o ...int64) []step { return ops('d', o) }
func ops(op byte, o []int64) []step {
	out := make([]step, len(o))
	for i, x := range o {
		out[i] = step{op, x}
	}
	return out
}

var (
	join   = []step{{op: 'j'}}
	begin  = []step{{op: 'b'}}
	newGen = []step{{op: 'j'}, {op: 'b'}}
	commit = []step{{op: 'c'}}
)

func seq(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestCommitTrackerTable(t *testing.T) {
	t.Parallel()
	const none = -1
	for _, tc := range []struct {
		name  string
		steps []step
		want  int64 // offset committable on partition 0 after steps; none when nothing to commit
	}{
		{"nothing fetched", nil, none},
		{"fetched, nothing done", f(0, 1, 2), none},
		{"in order, all done", seq(f(0, 1, 2), d(0, 1, 2)), 3},
		{"in order, prefix done", seq(f(0, 1, 2), d(0, 1)), 2},
		{"out of order, head missing", seq(f(0, 1, 2), d(2, 1)), none},
		{"out of order, then head", seq(f(0, 1, 2), d(2, 1, 0)), 3},
		{"out of order, hole in the middle", seq(f(0, 1, 2, 3), d(3, 0, 2)), 1},
		{"starts at a nonzero offset", seq(f(40, 41, 42), d(40)), 41},
		{"first fetched offset needs no commit", f(40), none},
		{"gap from compaction: only fetched offsets count", seq(f(0, 5, 9), d(0, 5)), 9},
		{"gap, all done commits one past the last", seq(f(0, 5, 9), d(9, 5, 0)), 10},
		{"duplicate done is a no-op", seq(f(0, 1, 2), d(0, 0, 0)), 1},
		{"done for an offset never fetched (a gap)", seq(f(0, 5), d(3)), none},
		{"done for an offset beyond the fetched ones", seq(f(0, 1), d(7)), none},
		{"done for an offset below the window", seq(f(5, 6), d(5, 4)), 6},
		{"re-fetch within the window keeps the state", seq(f(0, 1, 2, 3), d(0, 1), f(2), d(3)), 2},
		{"re-fetch then progress", seq(f(0, 1, 2, 3), d(0), f(1, 2), d(1)), 2},
		{"re-fetch of the same offset keeps its done neighbours", seq(f(0, 1), d(1), f(1), d(0)), 2},
		{"re-fetch below the first offset starts afresh", seq(f(5, 6), d(5, 6), f(3)), none},
		{"re-fetch below the first offset, then done", seq(f(5, 6), d(5, 6), f(3), d(3)), 4},
		{"an offset unknown in the window is in flight", seq(f(0, 5), d(5), f(3), d(0)), 3},
		{"rebalance under way: nothing committed", seq(f(0, 1), d(0, 1), join), none},
		{"joined, reader not yet in the new generation", seq(f(0, 1), d(0), join, f(2), d(1, 2)), none},
		{"new generation, not fetched yet: not committed", seq(f(0, 1), d(0, 1), newGen), none},
		{"new generation re-seeks to the committed offset: kept", seq(f(0, 1, 2), d(0), commit, newGen, f(1), d(1, 2)), 3},
		{"new generation, fetched on above the last: group committed past, afresh", seq(f(0, 1, 2), d(1, 2), newGen, f(3), d(0)), none},
		{"new generation, afresh, then done", seq(f(0, 1, 2), newGen, f(10), d(10)), 11},
		{"leader change (begin without a join) keeps the state", seq(f(0, 1, 2), d(1, 2), begin, f(3), d(0)), 3},
		{"already committed is not offered again", seq(f(0, 1), d(0, 1), commit), none},
		{"committed then more done", seq(f(0, 1, 2), d(0), commit, d(1)), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr := newCommitTracker()
			for _, s := range tc.steps {
				switch s.op {
				case 'f':
					tr.fetched(pos(0, s.offset))
				case 'd':
					tr.done(pos(0, s.offset))
				case 'j':
					tr.join()
				case 'b':
					tr.begin()
				case 'c':
					for _, c := range tr.committable() {
						tr.committed(c)
					}
				}
			}
			got := tr.committable()
			if tc.want == none {
				require.Empty(t, got)
				return
			}
			require.Len(t, got, 1)
			require.Equal(t, offsetCommit{topic: "t", partition: 0, offset: tc.want, epoch: got[0].epoch}, got[0])
		})
	}
}

func TestCommitTrackerReports(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	fetch := func(p ingest.Position) [2]bool {
		deliver, reset := tr.fetched(p)
		return [2]bool{deliver, reset}
	}
	require.Equal(t, [2]bool{true, false}, fetch(pos(0, 5)), "first fetch")
	require.Equal(t, [2]bool{true, false}, fetch(pos(0, 6)))
	require.True(t, tr.done(pos(0, 6)))
	require.False(t, tr.done(pos(0, 6)), "duplicate")
	require.False(t, tr.done(pos(1, 0)), "unknown partition")
	require.False(t, tr.done(ingest.Position{Topic: "other", Offset: 0}), "unknown topic")
	require.Equal(t, 1, tr.inFlight())
	require.Equal(t, [2]bool{false, false}, fetch(pos(0, 6)), "re-fetch of a Done record: skipped")
	require.Equal(t, [2]bool{false, false}, fetch(pos(0, 5)), "re-fetch of a held record: skipped")
	require.Equal(t, [2]bool{true, true}, fetch(pos(0, 4)), "below the window: afresh")
	require.Equal(t, 1, tr.inFlight())
}

// Ownership across a rebalance: records of the old generation are
// released (dropped unsent, not Done) and handed out again by the re-seek;
// records Done or still held are not; a revoked partition is forgotten.
func TestCommitTrackerOwnership(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	claims := tr.join()
	require.Empty(t, claims, "a new member owns nothing")
	tr.begin()
	for o := range int64(4) {
		tr.fetched(pos(0, o))
		tr.fetched(pos(1, o))
	}
	require.True(t, tr.owns(pos(0, 0)))
	require.False(t, tr.owns(pos(0, 9)), "never fetched")
	tr.done(pos(0, 0))
	require.False(t, tr.owns(pos(0, 0)), "Done")
	tr.done(pos(0, 1)) // sent and acknowledged before the rebalance
	require.True(t, tr.owns(pos(0, 2)), "sent before the rebalance, acknowledged after")

	// A rebalance starts: the member claims what it fetched.
	require.Equal(t, map[string][]int{"t": {0, 1}}, tr.join())
	require.False(t, tr.owns(pos(0, 3)), "released")
	require.False(t, tr.owns(pos(1, 0)), "released")
	require.False(t, tr.owns(pos(0, 3)), "released once")
	require.Empty(t, tr.committable())
	require.Equal(t, 4, tr.inFlight(), "held: offset 2 of p0, 1..3 of p1")
	tr.done(pos(0, 2))

	// The new generation keeps partition 0 and re-seeks it to the
	// committed offset 0: only the released record comes out again.
	tr.begin()
	for o, want := range []bool{false, false, false, true} {
		deliver, reset := tr.fetched(pos(0, int64(o)))
		require.False(t, reset)
		require.Equal(t, want, deliver, "offset %d", o)
	}
	require.True(t, tr.owns(pos(0, 3)))
	require.False(t, tr.owns(pos(1, 1)), "partition 1 not current")
	gen, unconfirmed := tr.generation()
	require.True(t, unconfirmed)
	tr.confirm(gen-1, map[string][]int{"t": {0, 1}}) // an older answer
	tr.confirm(gen, map[string][]int{"t": {0}})      // partition 1 was revoked
	_, unconfirmed = tr.generation()
	require.False(t, unconfirmed)
	require.False(t, tr.done(pos(1, 1)), "a revoked partition's late Done is ignored")
	tr.done(pos(0, 3))
	got := tr.committable()
	require.Len(t, got, 1)
	require.Equal(t, int64(4), got[0].offset)
	require.Equal(t, map[string][]int{"t": {0}}, tr.join(), "claims the confirmed assignment")
}

// A partition confirmed by the group but never fetched is claimed at the
// next join (an idle partition stays put), and a confirm before the reader
// fetches from the generation is ignored.
func TestCommitTrackerClaimsConfirmedIdlePartitions(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	tr.join()
	gen, unconfirmed := tr.generation()
	require.False(t, unconfirmed, "the reader is not in the generation yet")
	tr.confirm(gen, map[string][]int{"t": {3}})
	tr.begin()
	_, unconfirmed = tr.generation()
	require.True(t, unconfirmed)
	tr.confirm(gen, map[string][]int{"t": {3, 4}})
	require.Equal(t, map[string][]int{"t": {3, 4}}, tr.join())
	require.Equal(t, map[string][]int{"t": {3, 4}}, tr.join(), "a retried join claims the same")
	tr.begin()
	gen, _ = tr.generation()
	tr.confirm(gen, nil)
	require.Empty(t, tr.join(), "confirmed: nothing assigned")
}

// A commit computed before a reset must not move the new state's marker.
func TestCommitTrackerStaleCommitIgnored(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	tr.fetched(pos(0, 5))
	tr.fetched(pos(0, 6))
	tr.done(pos(0, 5))
	tr.done(pos(0, 6))
	stale := tr.committable()
	require.Len(t, stale, 1)
	tr.fetched(pos(0, 3)) // re-seek below the state while the commit was on its way
	tr.committed(stale[0])
	tr.fetched(pos(0, 4))
	tr.fetched(pos(0, 5))
	tr.done(pos(0, 3))
	got := tr.committable()
	require.Len(t, got, 1)
	require.Equal(t, int64(4), got[0].offset)
}

// Memory is O(in flight): a long run of fetch/done keeps no per-record state.
func TestCommitTrackerForgetsFinishedRecords(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	for o := range int64(100_000) {
		tr.fetched(pos(0, o))
		if o%2 == 1 { // done pairwise out of order
			tr.done(pos(0, o))
			tr.done(pos(0, o-1))
		}
	}
	p := tr.parts[topicPartition{"t", 0}]
	require.Empty(t, p.inFlight)
	require.Empty(t, p.done)
	require.Equal(t, 0, tr.inFlight())
	require.Equal(t, int64(100_000), tr.committable()[0].offset)
}

// The invariant, checked against a model under random interleavings: the
// committable offset never exceeds the lowest fetched offset not Done, and
// equals it.
func TestCommitTrackerRandomized(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0))
			tr := newCommitTracker()
			var fetchedOffs []int64
			doneSet := map[int64]bool{}
			next := int64(rng.IntN(10))
			for range 2000 {
				if rng.IntN(3) > 0 || len(fetchedOffs) == 0 {
					next += 1 + int64(rng.IntN(3)) // gaps
					tr.fetched(pos(0, next))
					fetchedOffs = append(fetchedOffs, next)
				} else {
					o := fetchedOffs[rng.IntN(len(fetchedOffs))]
					tr.done(pos(0, o))
					doneSet[o] = true
				}
				want := fetchedOffs[len(fetchedOffs)-1] + 1
				for _, o := range fetchedOffs {
					if !doneSet[o] {
						want = o
						break
					}
				}
				got := tr.committable()
				if want == fetchedOffs[0] {
					require.Empty(t, got)
				} else {
					require.Len(t, got, 1)
					require.Equal(t, want, got[0].offset)
				}
			}
		})
	}
}

// Done from many goroutines, commits polled concurrently (run with -race):
// the commits seen are monotonic and end at one past the last offset.
func TestCommitTrackerConcurrentDone(t *testing.T) {
	t.Parallel()
	const parts, perPart, workers = 4, 5000, 8
	tr := newCommitTracker()
	var all []ingest.Position
	for o := range int64(perPart) {
		for p := range parts {
			rec := pos(p, o)
			tr.fetched(rec)
			all = append(all, rec)
		}
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	stop := make(chan struct{})
	polled := make(chan error)
	go func() {
		last := map[int]int64{}
		for {
			for _, c := range tr.committable() {
				if c.offset < last[c.partition] {
					<-stop
					polled <- fmt.Errorf("commit went back on partition %d: %d < %d", c.partition, c.offset, last[c.partition])
					return
				}
				last[c.partition] = c.offset
				tr.committed(c)
			}
			select {
			case <-stop:
				polled <- nil
				return
			default:
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(all); i += workers {
				assert.True(t, tr.done(all[i]))
				tr.done(all[i]) // duplicate, concurrent
			}
		})
	}
	wg.Wait()
	close(stop)
	require.NoError(t, <-polled)
	got := tr.committable()
	for _, c := range got {
		tr.committed(c)
	}
	require.Zero(t, tr.inFlight())
	for p := range parts {
		st := tr.parts[topicPartition{"t", p}]
		require.Equal(t, int64(perPart), st.committed)
	}
}
