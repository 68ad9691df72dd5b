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

// step is one tracker operation: fetch, done or suspend, on partition 0.
type step struct {
	op     byte // 'f' fetch, 'd' done, 's' suspend all, 'c' commit what is committable
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
	suspend = []step{{op: 's'}}
	commit  = []step{{op: 'c'}}
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
		{"re-seek to a lower offset resets the state", seq(f(0, 1, 2, 3), d(0, 1), f(2), d(3)), none},
		{"re-seek then progress", seq(f(0, 1, 2, 3), d(0), f(1, 2), d(1)), 2},
		{"re-fetch of the same offset resets", seq(f(0, 1), d(1), f(1)), none},
		{"stale done after re-seek marks the refetched offset (it was delivered)", seq(f(0, 1, 2), f(0, 1), d(0)), 1},
		{"suspended partitions are not committed", seq(f(0, 1), d(0, 1), suspend), none},
		{"suspended then fetched again from the committed offset", seq(f(0, 1, 2), d(0), commit, suspend, f(1, 2), d(1, 2)), 3},
		{"suspended then fetched on: in-flight state kept", seq(f(0, 1, 2), d(1, 2), suspend, f(3), d(0)), 3},
		{"suspended then fetched above: waits for the records in flight", seq(f(0, 1, 2), suspend, f(10), d(10)), none},
		{"suspended then fetched above, in flight done", seq(f(0, 1, 2), suspend, f(10), d(10, 2, 1, 0)), 11},
		{"suspension noticed after the re-seek", seq(f(0, 1, 2, 3), d(0), f(1, 2, 3), d(1, 2, 3), suspend, f(4)), 4},
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
				case 's':
					tr.suspendAll()
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
	require.False(t, tr.fetched(pos(0, 0)), "first fetch is not a reset")
	require.False(t, tr.fetched(pos(0, 1)))
	require.True(t, tr.done(pos(0, 1)))
	require.False(t, tr.done(pos(0, 1)), "duplicate")
	require.False(t, tr.done(pos(1, 0)), "unknown partition")
	require.False(t, tr.done(ingest.Position{Topic: "other", Offset: 0}), "unknown topic")
	require.Equal(t, 1, tr.inFlight())
	require.True(t, tr.fetched(pos(0, 0)), "re-seek is a reset")
	require.Equal(t, 1, tr.inFlight())
}

func TestCommitTrackerPartitionsAreIndependent(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	for o := range int64(3) {
		tr.fetched(pos(0, o))
		tr.fetched(pos(1, 100+o))
		tr.fetched(ingest.Position{Topic: "u", Partition: 0, Offset: o})
	}
	tr.done(pos(0, 0))
	tr.done(pos(1, 101))
	tr.done(pos(1, 100))
	tr.done(ingest.Position{Topic: "u", Partition: 0, Offset: 2})
	got := tr.committable()
	require.Len(t, got, 2)
	require.Equal(t, []offsetCommit{{"t", 0, 1, got[0].epoch}, {"t", 1, 102, got[1].epoch}}, got)
}

func TestCommitTrackerResume(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	for o := range int64(3) {
		tr.fetched(pos(0, o))
		tr.fetched(pos(1, o))
		tr.done(pos(0, o))
		tr.done(pos(1, o))
	}
	seq, any := tr.suspension()
	require.False(t, any)
	tr.suspendAll()
	seq, any = tr.suspension()
	require.True(t, any)
	require.Empty(t, tr.committable())

	tr.resume(seq-1, "t", []int{0, 1}) // decided before the latest suspension
	require.Empty(t, tr.committable())
	tr.resume(seq, "other", []int{0, 1})
	require.Empty(t, tr.committable())
	tr.resume(seq, "t", []int{1, 7}) // partition 0 was revoked, 7 never fetched
	got := tr.committable()
	require.Len(t, got, 1)
	require.Equal(t, 1, got[0].partition)
	require.Equal(t, int64(3), got[0].offset)
	_, any = tr.suspension()
	require.True(t, any, "partition 0 stays suspended")
}

// A commit computed before a reset must not move the new state's marker.
func TestCommitTrackerStaleCommitIgnored(t *testing.T) {
	t.Parallel()
	tr := newCommitTracker()
	tr.fetched(pos(0, 0))
	tr.fetched(pos(0, 1))
	tr.done(pos(0, 0))
	tr.done(pos(0, 1))
	stale := tr.committable()
	require.Len(t, stale, 1)
	tr.fetched(pos(0, 0)) // re-seek while the commit was on its way
	tr.committed(stale[0])
	tr.fetched(pos(0, 1))
	tr.fetched(pos(0, 2))
	tr.done(pos(0, 0))
	got := tr.committable()
	require.Len(t, got, 1)
	require.Equal(t, int64(1), got[0].offset)
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
