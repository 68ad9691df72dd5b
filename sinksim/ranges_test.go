package sinksim

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/sinkwire"
)

// drive posts perTick records every 100 ms for d, keys from key(i), and
// returns the records accepted per second of the run.
func drive(t *testing.T, s *Sim, clock *fakeClock, d time.Duration, perTick int, key func(i int) string) []int {
	t.Helper()
	var perSecond []int
	n := 0
	for tick := 0; time.Duration(tick)*100*time.Millisecond < d; tick++ {
		batch := make([]sinkwire.Record, perTick)
		for j := range batch {
			batch[j] = rec(fmt.Sprintf("r%07d", n), 0)
			batch[j].Key = key(n)
			n++
		}
		_, resp := post(t, s, batch)
		if tick%10 == 0 {
			perSecond = append(perSecond, 0)
		}
		perSecond[len(perSecond)-1] += countStatus(resp.Results)[sinkwire.StatusStored]
		clock.Advance(100 * time.Millisecond)
	}
	return perSecond
}

func sequential(i int) string { return fmt.Sprintf("2025-05-01T%09d/nc%d", i, i) }

func hashed(i int) string {
	sum := md5.Sum([]byte(sequential(i)))
	return hex.EncodeToString(sum[:])[:4] + "/" + sequential(i)
}

func TestRangesCapSequentialKeysAtOnePartition(t *testing.T) {
	t.Parallel()
	s, clock := newTestSim(t, Config{Capacity: 10_000, PartitionLimit: 100, SplitAfter: 2 * time.Second, MaxPartitions: 8})
	perSecond := drive(t, s, clock, 30*time.Second, 50, sequential) // 500/s offered
	st := s.Snapshot(false)
	t.Logf("accepted per second %v; %d ranges after %d splits", perSecond, len(st.Partitions), st.Splits)
	require.Equal(t, 8, len(st.Partitions), "the hot range kept splitting, up to MaxPartitions")
	require.Equal(t, 7, st.Splits)
	for i, n := range perSecond[len(perSecond)-10:] {
		require.LessOrEqual(t, n, 100, "second %d after the last split: one range's limit", i)
	}
	for _, p := range st.Partitions {
		require.LessOrEqual(t, p.MaxOps1s, int64(100), "no range over its limit in any sliding second")
	}
	last := st.Partitions[len(st.Partitions)-1]
	require.Positive(t, last.Throttled, "the newest range throttles")
	require.Empty(t, last.High)
	for i := 1; i < len(st.Partitions); i++ {
		require.Equal(t, st.Partitions[i-1].High, st.Partitions[i].Low, "ranges tile the key space")
		require.Less(t, st.Partitions[i-1].Low, st.Partitions[i].Low)
	}
}

func TestRangesLetSpreadKeysReachCapacity(t *testing.T) {
	t.Parallel()
	s, clock := newTestSim(t, Config{Capacity: 400, PartitionLimit: 100, SplitAfter: time.Second, MaxPartitions: 16})
	perSecond := drive(t, s, clock, 30*time.Second, 40, hashed) // 400/s offered
	st := s.Snapshot(false)
	t.Logf("accepted per second %v; %d ranges", perSecond, len(st.Partitions))
	require.LessOrEqual(t, perSecond[0], 100+1, "one range at first")
	for i, n := range perSecond[len(perSecond)-5:] {
		require.GreaterOrEqual(t, n, 380, "second %d of the end: the ranges carry the provisioned rate", i)
	}
	require.GreaterOrEqual(t, len(st.Partitions), 4)
	require.LessOrEqual(t, st.MaxUnits1s, int64(400), "Capacity still holds")
}

func TestRangeSplitsAtTheMedianOfItsRecentKeys(t *testing.T) {
	t.Parallel()
	r := newRanges(10, time.Second, 4)
	for i, k := range []string{"d", "a", "e", "b", "c"} {
		r.admit(time.Duration(i)*time.Millisecond, 0, k)
	}
	require.True(t, r.split(0))
	st := r.stats()
	require.Equal(t, []sinkwire.PartitionStats{{Low: "", High: "c", Accepted: 5, MaxOps1s: 5}, {Low: "c", MaxOps1s: 5}}, st, "the new half carries the last second's operations")
	require.Equal(t, 0, r.find("bzz"))
	require.Equal(t, 1, r.find("c"))
	require.Equal(t, 1, r.find("zzz"))

	same := newRanges(10, time.Second, 4)
	same.admit(0, 0, "x")
	same.admit(0, 0, "x")
	require.False(t, same.split(0), "equal keys cannot be cut")
}

func TestRangeThrottlesOnlyItsOwnRecords(t *testing.T) {
	t.Parallel()
	s, _ := newTestSim(t, Config{Capacity: 1000, PartitionLimit: 2})
	batch := []sinkwire.Record{rec("a1", 0), rec("a2", 0), rec("a3", 0), rec("b1", 0)}
	w, resp := post(t, s, batch)
	require.Equal(t, http.StatusMultiStatus, w.Code)
	require.Equal(t, []int{sinkwire.StatusStored, sinkwire.StatusStored, sinkwire.StatusThrottled, sinkwire.StatusThrottled}, []int{
		resp.Results[0].Status, resp.Results[1].Status, resp.Results[2].Status, resp.Results[3].Status},
		"one range at first: its limit of 2 holds for every key")
	after, err := strconv.Atoi(w.Header().Get(sinkwire.HeaderRetryAfterMs))
	require.NoError(t, err)
	require.Equal(t, 1000, after, "the range frees up one second after its first admission")
	st := s.Snapshot(false)
	require.Equal(t, int64(2), st.Partitions[0].Throttled)
	require.Equal(t, int64(1), st.ThrottledRequests)
}

func TestNewSimValidatesRanges(t *testing.T) {
	t.Parallel()
	for _, cfg := range []Config{
		{Capacity: 10, PartitionLimit: -1},
		{Capacity: 10, PartitionLimit: 5, SplitAfter: -time.Second},
		{Capacity: 10, PartitionLimit: 5, MaxPartitions: -2},
	} {
		_, err := New(cfg)
		require.Error(t, err, "%+v", cfg)
	}
	s, err := New(Config{Capacity: 10})
	require.NoError(t, err)
	require.Nil(t, s.Snapshot(false).Partitions, "no ranges unless asked for")
}
