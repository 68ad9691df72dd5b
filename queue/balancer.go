package queue

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/segmentio/kafka-go"
)

// StickyProtocol is the consumer-group protocol name of StickyGroupBalancer.
const StickyProtocol = "sluice-sticky"

// StickyGroupBalancer is a kafka-go GroupBalancer that keeps partitions
// where they are across rebalances. Each member announces, in its join
// metadata (UserData), the partitions it owns per topic; the group leader
// then, per topic:
//
//   - keeps every member's owned partitions, dropping partitions the topic
//     does not have and, when two members claim the same partition, giving
//     it to the member whose ID sorts first;
//   - gives each member a quota of ⌊P/M⌋ or ⌈P/M⌉ of the topic's P
//     partitions (M members), the larger quotas going to the members that
//     keep the most, and takes from a member only what exceeds its quota
//     (its highest partitions);
//   - hands the rest (partitions of members that left, never assigned, or
//     taken above a quota) to the least-loaded members, lowest partition
//     first, ties to the member whose ID sorts first.
//
// So partition counts differ by at most 1, and a rebalance moves only the
// partitions it must: when a member leaves, the survivors keep theirs and
// split the leaver's; when a member joins, each of the others gives up at
// most what it holds above its new quota. The assignment is a pure,
// deterministic function of the members (sorted by ID) and partitions.
//
// Every member of a group must offer StickyProtocol, or Kafka picks another
// protocol all members share: Source offers it first and kafka-go's
// RangeGroupBalancer second, so a group with an older member that offers
// only "range" still forms (with range's reshuffling).
type StickyGroupBalancer struct {
	// Owned returns the partitions this member owns, per topic. kafka-go
	// calls it (through UserData) once at the start of every join, that is
	// at every rebalance this member takes part in. Nil owns nothing.
	Owned func() map[string][]int
}

var _ kafka.GroupBalancer = StickyGroupBalancer{}

// stickyUserData is the UserData a member sends: version 1, JSON.
type stickyUserData struct {
	Version int              `json:"v"`
	Owned   map[string][]int `json:"owned,omitempty"`
}

// ProtocolName returns StickyProtocol.
func (StickyGroupBalancer) ProtocolName() string { return StickyProtocol }

// UserData encodes the partitions Owned returns.
func (b StickyGroupBalancer) UserData() ([]byte, error) {
	var owned map[string][]int
	if b.Owned != nil {
		owned = b.Owned()
	}
	data, err := json.Marshal(stickyUserData{Version: 1, Owned: owned})
	if err != nil {
		return nil, fmt.Errorf("encode owned partitions: %w", err)
	}
	return data, nil
}

// AssignGroups assigns partitions as the type's documentation describes. A
// member whose UserData cannot be decoded owns nothing.
func (StickyGroupBalancer) AssignGroups(members []kafka.GroupMember, partitions []kafka.Partition) kafka.GroupMemberAssignments {
	byTopic := map[string][]int{}
	for _, p := range partitions {
		byTopic[p.Topic] = append(byTopic[p.Topic], p.ID)
	}
	in := make([]stickyMember, len(members))
	for i, m := range members {
		var ud stickyUserData
		if json.Unmarshal(m.UserData, &ud) != nil || ud.Version < 1 {
			ud.Owned = nil
		}
		in[i] = stickyMember{id: m.ID, topics: m.Topics, owned: ud.Owned}
	}
	out := kafka.GroupMemberAssignments{}
	for _, m := range members {
		out[m.ID] = map[string][]int{}
	}
	for member, topics := range assignSticky(in, byTopic) {
		for topic, parts := range topics {
			out[member][topic] = parts
		}
	}
	return out
}

// stickyMember is one member's subscription and claims.
type stickyMember struct {
	id     string
	topics []string
	owned  map[string][]int
}

// assignSticky assigns each topic's partitions to the members subscribed
// to it: member ID → topic → sorted partitions. Members with no partition
// of a topic get no entry for it.
func assignSticky(members []stickyMember, partitions map[string][]int) map[string]map[string][]int {
	members = slices.Clone(members)
	slices.SortFunc(members, func(a, b stickyMember) int { return cmp.Compare(a.id, b.id) })
	out := map[string]map[string][]int{}
	topics := make([]string, 0, len(partitions))
	for topic := range partitions {
		topics = append(topics, topic)
	}
	slices.Sort(topics)
	for _, topic := range topics {
		var subs []stickyMember
		for _, m := range members {
			if slices.Contains(m.topics, topic) {
				subs = append(subs, m)
			}
		}
		for i, parts := range assignTopic(subs, topic, partitions[topic]) {
			if len(parts) == 0 {
				continue
			}
			if out[subs[i].id] == nil {
				out[subs[i].id] = map[string][]int{}
			}
			out[subs[i].id][topic] = parts
		}
	}
	return out
}

// assignTopic assigns partitions of topic to members (sorted by ID); the
// result is indexed like members.
func assignTopic(members []stickyMember, topic string, partitions []int) [][]int {
	if len(members) == 0 {
		return nil
	}
	exists := map[int]bool{}
	for _, p := range partitions {
		exists[p] = true
	}
	// Keep each member's claims, first claimer (by ID) wins.
	kept := make([][]int, len(members))
	taken := map[int]bool{}
	for i, m := range members {
		claims := slices.Clone(m.owned[topic])
		slices.Sort(claims)
		for _, p := range slices.Compact(claims) {
			if exists[p] && !taken[p] {
				taken[p] = true
				kept[i] = append(kept[i], p)
			}
		}
	}
	// Quotas: the members keeping the most get the ⌈P/M⌉ ones.
	base, extra := len(exists)/len(members), len(exists)%len(members)
	order := make([]int, len(members))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(len(kept[b]), len(kept[a])) })
	quota := make([]int, len(members))
	for rank, i := range order {
		quota[i] = base
		if rank < extra {
			quota[i]++
		}
	}
	// Take what exceeds a quota, highest partitions first.
	for i := range kept {
		if len(kept[i]) > quota[i] {
			for _, p := range kept[i][quota[i]:] {
				delete(taken, p)
			}
			kept[i] = kept[i][:quota[i]]
		}
	}
	// Hand the rest out, least-loaded member first.
	for _, p := range slices.Sorted(maps.Keys(exists)) {
		if taken[p] {
			continue
		}
		best := -1
		for i := range members {
			if len(kept[i]) < quota[i] && (best < 0 || len(kept[i]) < len(kept[best])) {
				best = i
			}
		}
		kept[best] = append(kept[best], p)
		taken[p] = true
	}
	for i := range kept {
		slices.Sort(kept[i])
	}
	return kept
}
