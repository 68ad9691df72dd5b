package queue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// produceN writes n records with IDs "r0".."r{n-1}" to topic.
func produceN(t *testing.T, topic string, n int) {
	t.Helper()
	p, err := NewProducer(ProducerConfig{Brokers: testBrokers, Logger: testLogger()})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	recs := make([]ingest.Record, n)
	for i := range recs {
		recs[i] = ingest.Record{ID: fmt.Sprintf("r%d", i), Value: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	require.NoError(t, p.Produce(testContext(t), topic, recs))
}

func newTestSource(t *testing.T, topic, group string) *Source {
	t.Helper()
	s, err := NewSource(SourceConfig{
		Brokers: testBrokers, Topic: topic, Group: group, Logger: testLogger(),
		CommitInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	return s
}

// runSource runs s.Run in the background; the returned stop cancels it and
// returns Run's error.
func runSource(t *testing.T, s *Source) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	var err error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func fetchN(t *testing.T, s *Source, n int) []ingest.Record {
	t.Helper()
	ctx := testContext(t)
	out := make([]ingest.Record, 0, n)
	for range n {
		rec, err := s.Fetch(ctx)
		require.NoError(t, err)
		out = append(out, rec)
	}
	return out
}

func byPartition(recs []ingest.Record) map[int][]ingest.Record {
	out := map[int][]ingest.Record{}
	for _, r := range recs {
		out[r.Pos.Partition] = append(out[r.Pos.Partition], r)
	}
	return out
}

func committed(t *testing.T, group, topic string) map[int]int64 {
	t.Helper()
	got, err := CommittedOffsets(testContext(t), testBrokers, group, topic)
	require.NoError(t, err)
	return got
}

// The whole at-least-once contract against a broker: out-of-order Done
// commits exactly the contiguous Done prefix per partition, and a restart
// in the same group resumes right there — nothing lost, nothing beyond the
// records not Done redelivered.
func TestSourceCommitsContiguousDoneAndResumes(t *testing.T) {
	t.Parallel()
	const n, partitions = 90, 3
	topic, group := newTopic(t, partitions), "g-"+t.Name()
	produceN(t, topic, n)

	src := newTestSource(t, topic, group)
	stop := runSource(t, src)
	recs := fetchN(t, src, n)
	ids := map[string]bool{}
	for _, r := range recs {
		require.NotEmpty(t, r.ID, "ID comes from the sluice-id header")
		require.Equal(t, []byte(r.ID), r.Key, "key defaults to the ID")
		require.JSONEq(t, fmt.Sprintf(`{"n":%s}`, r.ID[1:]), string(r.Value))
		ids[r.ID] = true
	}
	require.Len(t, ids, n)

	// Per partition: Done everything in reverse order except the record at
	// position hole, so the commit must stop right at the hole.
	want := map[int]int64{}
	parts := byPartition(recs)
	require.Len(t, parts, partitions, "the hash balancer spreads the keys")
	for p, rs := range parts {
		hole := len(rs) / 2
		want[p] = rs[hole].Pos.Offset
		for i := len(rs) - 1; i >= 0; i-- {
			if i != hole {
				src.Done(rs[i])
				src.Done(rs[i]) // duplicates are harmless
			}
		}
	}
	require.Equal(t, partitions, src.InFlight())
	require.Eventually(t, func() bool { return maps.Equal(committed(t, group, topic), want) }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, stop(), "clean stop")
	require.Equal(t, want, committed(t, group, topic), "never beyond the first record not Done")

	// Restart: the new member resumes at the hole of each partition.
	src2 := newTestSource(t, topic, group)
	stop2 := runSource(t, src2)
	var redelivered int
	for p, rs := range parts {
		redelivered += len(rs) - len(rs)/2
		_ = p
	}
	again := fetchN(t, src2, redelivered)
	for p, rs := range byPartition(again) {
		orig := parts[p]
		hole := len(orig) / 2
		require.Len(t, rs, len(orig)-hole, "partition %d", p)
		for i, r := range rs {
			require.Equal(t, orig[hole+i].Pos, r.Pos, "partition %d resumes at the committed offset, in order", p)
			require.Equal(t, orig[hole+i].ID, r.ID)
			src2.Done(r)
		}
	}
	require.NoError(t, stop2())
	end, err := EndOffsets(testContext(t), testBrokers, topic)
	require.NoError(t, err)
	require.Equal(t, end, committed(t, group, topic), "everything Done is committed on stop")
}

// Run's final commit on stop includes what was Done since the last tick.
func TestSourceFinalCommitOnStop(t *testing.T) {
	t.Parallel()
	topic, group := newTopic(t, 1), "g-"+t.Name()
	produceN(t, topic, 5)
	src, err := NewSource(SourceConfig{Brokers: testBrokers, Topic: topic, Group: group, Logger: testLogger(), CommitInterval: time.Hour})
	require.NoError(t, err)
	stop := runSource(t, src)
	recs := fetchN(t, src, 5)
	for _, r := range recs[:3] {
		src.Done(r)
	}
	require.Empty(t, committed(t, group, topic), "no tick yet")
	require.NoError(t, stop())
	require.Equal(t, map[int]int64{0: recs[2].Pos.Offset + 1}, committed(t, group, topic))
}

func TestSourceFetchReturnsContextError(t *testing.T) {
	t.Parallel()
	topic := newTopic(t, 1)
	src := newTestSource(t, topic, "g-"+t.Name())
	stop := runSource(t, src)
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("test stop")
	cancel(cause)
	_, err := src.Fetch(ctx)
	require.ErrorIs(t, err, cause)
	require.NoError(t, stop())
	_, err = src.Fetch(testContext(t))
	require.Error(t, err, "closed")
}

func TestNewSourceValidates(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]SourceConfig{
		"no brokers":          {Topic: "t", Group: "g"},
		"no topic":            {Brokers: []string{"127.0.0.1:1"}, Group: "g"},
		"no group":            {Brokers: []string{"127.0.0.1:1"}, Topic: "t"},
		"negative interval":   {Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g", CommitInterval: -1},
		"heartbeat ≥ session": {Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g", HeartbeatInterval: 10 * time.Second, SessionTimeout: 5 * time.Second},
		"negative max bytes":  {Brokers: []string{"127.0.0.1:1"}, Topic: "t", Group: "g", MaxBytes: -1},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewSource(cfg)
			require.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}

func TestCloseBoundedTimesOut(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	err := closeBounded(func() error { <-release; return nil }, 10*time.Millisecond, "thing")
	require.ErrorIs(t, err, ErrCloseTimeout)
	require.ErrorContains(t, err, "10ms")
	require.NoError(t, closeBounded(func() error { return nil }, time.Second, "thing"))
}

// consume fetches from s and, as the pipeline does, sends (records in
// sent, by position, unless nil) and marks Done every record s still owns, until
// ctx is done, signalling the first record on first.
func consume(ctx context.Context, s *Source, first chan<- struct{}, sent *sync.Map) error {
	signalled := false
	for {
		rec, err := s.Fetch(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !signalled {
			close(first)
			signalled = true
		}
		if !s.Owns(rec) {
			continue
		}
		if sent != nil {
			if _, dup := sent.LoadOrStore(rec.Pos, true); dup {
				return fmt.Errorf("record %s (%s) sent twice by one member", rec.ID, rec.Pos)
			}
		}
		s.Done(rec)
	}
}

// A second member joins while the first holds un-Done records. The first
// member keeps half of its partitions (sticky balancer) and the records it
// holds of them stay its own (Owns; the re-seek does not hand them out
// again); those of the partitions it lost are not its own any more, and the
// second member gets them from the committed offsets. The first member's
// late Done for partitions it lost never rewinds the offsets the new owner
// committed.
func TestSourceRebalance(t *testing.T) {
	t.Parallel()
	const n, partitions = 200, 4
	topic, group := newTopic(t, partitions), "g-"+t.Name()
	produceN(t, topic, n)

	a := newTestSource(t, topic, group)
	stopA := runSource(t, a)
	recs := fetchN(t, a, n)
	half := map[int]int64{}
	var held []ingest.Record
	for p, rs := range byPartition(recs) {
		half[p] = rs[len(rs)/2].Pos.Offset
		for i, r := range rs {
			if i < len(rs)/2 {
				a.Done(r)
			} else {
				held = append(held, r)
			}
		}
	}
	require.Eventually(t, func() bool { return maps.Equal(committed(t, group, topic), half) }, 30*time.Second, 20*time.Millisecond)

	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	errs := make(chan error, 2)
	firstA, firstB := make(chan struct{}), make(chan struct{})
	var sentA, sentB sync.Map // ingest.Position → true: what each member sent
	go func() { errs <- consume(ctx, a, firstA, &sentA) }()
	b := newTestSource(t, topic, group)
	stopB := runSource(t, b)
	go func() { errs <- consume(ctx, b, firstB, &sentB) }()
	select {
	case <-firstB: // the group rebalanced and b owns partitions
	case <-ctx.Done():
		t.Fatal("the second member never got a record")
	}
	for _, r := range held { // what a's pipeline does with what it holds
		if a.Owns(r) {
			sentA.Store(r.Pos, true)
			a.Done(r)
		}
	}
	produceN(t, topic, n) // b commits past what a fetched
	end, err := EndOffsets(testContext(t), testBrokers, topic)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return maps.Equal(committed(t, group, topic), end) }, 30*time.Second, 20*time.Millisecond,
		"end %v, committed %v", end, committed(t, group, topic))

	for _, r := range held { // late, for partitions a may have lost
		a.Done(r)
	}
	cancel()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.NoError(t, stopA())
	require.NoError(t, stopB())
	require.Equal(t, end, committed(t, group, topic), "no rewind")
	var dups []any
	sentB.Range(func(pos, _ any) bool {
		if _, ok := sentA.Load(pos); ok {
			dups = append(dups, pos)
		}
		return true
	})
	require.Empty(t, dups, "records sent by both members")
}

// A new generation that keeps partitions with nothing more to fetch: the
// group's answer (DescribeGroups) makes them current, so their Done
// records are committed.
func TestSourceConfirmsAssignedPartitions(t *testing.T) {
	t.Parallel()
	topic, group := newTopic(t, 2), "g-"+t.Name()
	produceN(t, topic, 10)
	src := newTestSource(t, topic, group)
	stop := runSource(t, src)
	recs := fetchN(t, src, 10)
	src.tracker.join() // as if the member had rejoined and kept both
	src.tracker.begin()
	for _, r := range recs {
		require.False(t, src.Owns(r), "fetched in the previous generation")
	}
	for _, r := range recs {
		src.Done(r)
	}
	end, err := EndOffsets(testContext(t), testBrokers, topic)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return maps.Equal(committed(t, group, topic), end) }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, stop())
}

// groupAssignments returns, when group is stable, each member's partitions
// of topic by client ID.
func groupAssignments(t *testing.T, group, topic string) (map[string][]int, bool) {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(testBrokers...), Transport: &kafka.Transport{}}
	defer c.Transport.(*kafka.Transport).CloseIdleConnections()
	res, err := c.DescribeGroups(testContext(t), &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	require.NoError(t, err)
	out := map[string][]int{}
	for _, g := range res.Groups {
		require.NoError(t, g.Error)
		if g.GroupState != "Stable" {
			return nil, false
		}
		for _, m := range g.Members {
			for _, tp := range m.MemberAssignments.Topics {
				if tp.Topic == topic {
					out[m.ClientID] = append(out[m.ClientID], tp.Partitions...)
				}
			}
			slices.Sort(out[m.ClientID])
		}
	}
	return out, true
}

// awaitAssignments waits until group is stable with members members that
// each have a share (⌊P/M⌋ or ⌈P/M⌉) of topic's partitions.
func awaitAssignments(t *testing.T, group, topic string, members, partitions int) map[string][]int {
	t.Helper()
	var got map[string][]int
	require.Eventually(t, func() bool {
		asg, stable := groupAssignments(t, group, topic)
		if !stable || len(asg) != members {
			return false
		}
		for _, parts := range asg {
			if len(parts) < partitions/members || len(parts) > (partitions+members-1)/members {
				return false
			}
		}
		got = asg
		return true
	}, 45*time.Second, 50*time.Millisecond, "group %s never had %d balanced members", group, members)
	return got
}

// A source joins its group when it runs, not when it is made: one that is
// closed before it ran (a load with nothing to do) was never a member, so
// no peer waits SessionTimeout for it to leave. a runs and gets every
// partition while b, made first, sits idle; b's Close then changes nothing.
func TestSourceJoinsWhenItRuns(t *testing.T) {
	t.Parallel()
	const partitions = 4
	topic, group := newTopic(t, partitions), "g-"+t.Name()
	b := newTestSource(t, topic, group)
	a := newTestSource(t, topic, group)
	stop := runSource(t, a)
	asg := awaitAssignments(t, group, topic, 1, partitions)
	require.Equal(t, []int{0, 1, 2, 3}, asg[a.clientID], "a alone is in the group")
	require.NoError(t, b.Close())
	_, err := b.Fetch(testContext(t))
	require.ErrorIs(t, err, io.EOF, "a closed source fetches nothing")
	asg, stable := groupAssignments(t, group, topic)
	require.True(t, stable)
	require.Equal(t, map[string][]int{a.clientID: {0, 1, 2, 3}}, asg)
	require.NoError(t, stop())
}

// Three members share a 6-partition topic; the third stops cleanly with
// records still in flight (Done on all but the last few it fetched of each
// partition). Its final commit leaves nothing acknowledged uncommitted: its
// partitions' committed offsets are exactly its first records not Done.
// With the sticky balancer the two survivors keep their partitions and
// split the leaver's, and no record is sent twice: none Done by the leaver
// is fetched again, none of a survivor's is either.
func TestSourceMemberLeavesCleanly(t *testing.T) {
	t.Parallel()
	const partitions, n, held = 6, 600, 3
	topic, group := newTopic(t, partitions), "g-"+t.Name()
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()

	a, b := newTestSource(t, topic, group), newTestSource(t, topic, group)
	c, err := NewSource(SourceConfig{ // commits only when it stops
		Brokers: testBrokers, Topic: topic, Group: group, Logger: testLogger(), CommitInterval: time.Hour,
	})
	require.NoError(t, err)
	stopA, stopB, stopC := runSource(t, a), runSource(t, b), runSource(t, c)
	fetchingC := make(chan ingest.Record, n)
	go func() { // keep c in the group: its reader joins as Fetch is called
		for {
			rec, err := c.Fetch(ctx)
			if err != nil {
				close(fetchingC)
				return
			}
			fetchingC <- rec
		}
	}()
	errs := make(chan error, 2)
	var sentA, sentB sync.Map
	go func() { errs <- consume(ctx, a, make(chan struct{}), &sentA) }()
	go func() { errs <- consume(ctx, b, make(chan struct{}), &sentB) }()
	before := awaitAssignments(t, group, topic, 3, partitions)
	produceN(t, topic, n)

	// c fetches at least 10 records of each of its partitions, then Done on
	// all but the last few of each partition: those are in flight when it
	// stops.
	var fetchedC []ingest.Record
	perPartition := map[int]int{}
	enough := func() bool {
		for _, p := range before[c.clientID] {
			if perPartition[p] < 10 {
				return false
			}
		}
		return true
	}
	for !enough() {
		select {
		case rec := <-fetchingC:
			require.True(t, c.Owns(rec))
			fetchedC = append(fetchedC, rec)
			perPartition[rec.Pos.Partition]++
		case <-ctx.Done():
			t.Fatal("c fetched too little")
		}
	}
	sentC := map[ingest.Position]bool{}
	firstHeld := map[int]int64{}
	for p, rs := range byPartition(fetchedC) {
		require.Contains(t, before[c.clientID], p)
		require.Greater(t, len(rs), held, "partition %d: too few records to hold some back", p)
		for _, r := range rs[:len(rs)-held] {
			c.Done(r)
			sentC[r.Pos] = true
		}
		firstHeld[p] = rs[len(rs)-held].Pos.Offset
	}
	require.NoError(t, stopC(), "clean stop")
	got := committed(t, group, topic)
	for p, off := range firstHeld {
		require.Equal(t, off, got[p], "c's partition %d: committed up to its first record not Done", p)
	}

	after := awaitAssignments(t, group, topic, 2, partitions)
	for _, m := range []*Source{a, b} {
		require.Subset(t, after[m.clientID], before[m.clientID], "a survivor keeps its partitions")
		require.Len(t, after[m.clientID], 3)
	}
	require.ElementsMatch(t, before[c.clientID], slices.Concat(
		slices.DeleteFunc(slices.Clone(after[a.clientID]), func(p int) bool { return slices.Contains(before[a.clientID], p) }),
		slices.DeleteFunc(slices.Clone(after[b.clientID]), func(p int) bool { return slices.Contains(before[b.clientID], p) }),
	), "c's partitions are split between the survivors")

	end, err := EndOffsets(testContext(t), testBrokers, topic)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return maps.Equal(committed(t, group, topic), end) }, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.NoError(t, stopA())
	require.NoError(t, stopB())

	// Every record sent exactly once, by one member.
	sent := map[ingest.Position]int{}
	for pos := range sentC {
		sent[pos]++
	}
	for _, m := range []*sync.Map{&sentA, &sentB} {
		m.Range(func(pos, _ any) bool {
			sent[pos.(ingest.Position)]++
			return true
		})
	}
	var total int64
	for p, off := range end {
		total += off
		for o := range off {
			require.Equal(t, 1, sent[ingest.Position{Topic: topic, Partition: p, Offset: o}], "partition %d offset %d", p, o)
		}
	}
	require.Len(t, sent, int(total))
}

func TestSourceLagCountsWhatIsLeftToFetch(t *testing.T) {
	t.Parallel()
	topic, group := newTopic(t, 1), "g-"+t.Name()
	produceN(t, topic, 10)
	src := newTestSource(t, topic, group)
	runSource(t, src)
	require.EqualValues(t, -1, src.Lag(), "unknown before the first fetch")
	fetchN(t, src, 4)
	require.EqualValues(t, 6, src.Lag())
	fetchN(t, src, 6)
	require.Zero(t, src.Lag(), "caught up")
}
