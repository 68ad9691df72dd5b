package queue

import (
	"encoding/json"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

func TestAssignSticky(t *testing.T) {
	t.Parallel()
	six := map[string][]int{"t": {0, 1, 2, 3, 4, 5}}
	m := func(id string, owned ...int) stickyMember {
		return stickyMember{id: id, topics: []string{"t"}, owned: map[string][]int{"t": owned}}
	}
	type want = map[string]map[string][]int
	for _, tc := range []struct {
		name       string
		members    []stickyMember
		partitions map[string][]int
		want       want
	}{
		{"all new: contiguous, lowest IDs get the extra", []stickyMember{m("b"), m("a"), m("c"), m("d")}, six,
			want{"a": {"t": {0, 4}}, "b": {"t": {1, 5}}, "c": {"t": {2}}, "d": {"t": {3}}}},
		{"member leaves: survivors keep theirs and split the leaver's", []stickyMember{m("a", 0, 1), m("b", 2, 3)}, six,
			want{"a": {"t": {0, 1, 4}}, "b": {"t": {2, 3, 5}}}},
		{"member leaves, the range case: nobody loses a partition", []stickyMember{m("m1", 0, 1), m("m2", 2, 3)}, six,
			want{"m1": {"t": {0, 1, 4}}, "m2": {"t": {2, 3, 5}}}},
		{"member joins: each gives up only its excess", []stickyMember{m("a", 0, 1, 2), m("b", 3, 4, 5), m("c")}, six,
			want{"a": {"t": {0, 1}}, "b": {"t": {3, 4}}, "c": {"t": {2, 5}}}},
		{"nothing changes: nothing moves", []stickyMember{m("a", 5, 0), m("b", 1, 4), m("c", 2, 3)}, six,
			want{"a": {"t": {0, 5}}, "b": {"t": {1, 4}}, "c": {"t": {2, 3}}}},
		{"uneven: the member keeping most gets the larger quota", []stickyMember{m("a", 0), m("b", 1, 2, 3, 4)}, map[string][]int{"t": {0, 1, 2, 3, 4}},
			want{"a": {"t": {0, 4}}, "b": {"t": {1, 2, 3}}}},
		{"two members claim one partition: the first ID keeps it", []stickyMember{m("b", 0, 1, 2), m("a", 2, 3)}, map[string][]int{"t": {0, 1, 2, 3}},
			want{"a": {"t": {2, 3}}, "b": {"t": {0, 1}}}},
		{"unknown and duplicate claims dropped", []stickyMember{m("a", 0, 0, 9, -1), m("b")}, map[string][]int{"t": {0, 1}},
			want{"a": {"t": {0}}, "b": {"t": {1}}}},
		{"more members than partitions", []stickyMember{m("a", 1), m("b"), m("c")}, map[string][]int{"t": {0, 1}},
			want{"a": {"t": {1}}, "b": {"t": {0}}}},
		{"topic without members", []stickyMember{m("a")}, map[string][]int{"t": {0}, "u": {0}},
			want{"a": {"t": {0}}}},
		{"topics balanced separately", []stickyMember{
			{id: "a", topics: []string{"t", "u"}, owned: map[string][]int{"u": {0, 1}}},
			{id: "b", topics: []string{"u"}},
		}, map[string][]int{"t": {0, 1}, "u": {0, 1, 2}},
			want{"a": {"t": {0, 1}, "u": {0, 1}}, "b": {"u": {2}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := assignSticky(tc.members, tc.partitions)
			require.Equal(t, tc.want, got)
			require.Equal(t, got, assignSticky(tc.members, tc.partitions), "deterministic")
		})
	}
}

// Balance and stickiness over many shapes: every partition assigned once,
// counts differ by at most 1, and a member keeps min(owned, its quota).
func TestAssignStickyProperties(t *testing.T) {
	t.Parallel()
	for parts := 1; parts <= 12; parts++ {
		for members := 1; members <= 5; members++ {
			all := make([]int, parts)
			for i := range all {
				all[i] = i
			}
			// Each member owns a range-style share of a group one larger.
			in := make([]stickyMember, members)
			for i := range in {
				var owned []int
				for p := i * parts / (members + 1); p < (i+1)*parts/(members+1); p++ {
					owned = append(owned, p)
				}
				in[i] = stickyMember{id: string(rune('a' + i)), topics: []string{"t"}, owned: map[string][]int{"t": owned}}
			}
			got := assignSticky(in, map[string][]int{"t": all})
			seen := map[int]bool{}
			lo, hi := parts, 0
			for _, m := range in {
				mine := got[m.id]["t"]
				lo, hi = min(lo, len(mine)), max(hi, len(mine))
				for _, p := range mine {
					require.False(t, seen[p], "partition %d twice", p)
					seen[p] = true
				}
				kept := 0
				for _, p := range m.owned["t"] {
					for _, q := range mine {
						if p == q {
							kept++
						}
					}
				}
				require.GreaterOrEqual(t, kept, min(len(m.owned["t"]), parts/members), "%d partitions, %d members: %s kept too little", parts, members, m.id)
			}
			require.Len(t, seen, parts)
			require.LessOrEqual(t, hi-lo, 1, "%d partitions, %d members", parts, members)
		}
	}
}

func TestStickyGroupBalancer(t *testing.T) {
	t.Parallel()
	b := StickyGroupBalancer{Owned: func() map[string][]int { return map[string][]int{"t": {2}} }}
	require.Equal(t, "sluice-sticky", b.ProtocolName())
	data, err := b.UserData()
	require.NoError(t, err)
	require.JSONEq(t, `{"v":1,"owned":{"t":[2]}}`, string(data))
	empty, err := StickyGroupBalancer{}.UserData()
	require.NoError(t, err)
	require.JSONEq(t, `{"v":1}`, string(empty))

	garbage, _ := json.Marshal("not sluice's")
	got := b.AssignGroups([]kafka.GroupMember{
		{ID: "x", Topics: []string{"t"}, UserData: garbage}, // owns nothing
		{ID: "y", Topics: []string{"t"}, UserData: data},
		{ID: "z", Topics: []string{"u"}},
	}, []kafka.Partition{{Topic: "t", ID: 0}, {Topic: "t", ID: 1}, {Topic: "t", ID: 2}, {Topic: "t", ID: 3}})
	require.Equal(t, kafka.GroupMemberAssignments{
		"x": {"t": {0, 1}},
		"y": {"t": {2, 3}},
		"z": {},
	}, got)
}
