package lease

import (
	"cmp"
	"math"
	"slices"
)

// wantPartitions converts a demand in units/s into the number of partitions
// that cover it: ceil(demand / partitionRate), capped at partitions; +Inf
// asks for all of them, and 0, negative or NaN for none.
func wantPartitions(demand, partitionRate float64, partitions int) int {
	switch {
	case math.IsNaN(demand) || demand <= 0 || partitionRate <= 0:
		return 0
	case math.IsInf(demand, 1):
		return partitions
	}
	// A tiny tolerance so that 3 × rate asks for 3, not 4, after rounding.
	n := math.Ceil(demand/partitionRate - 1e-9)
	if n >= float64(partitions) {
		return partitions
	}
	return max(int(n), 0)
}

// member is one worker's announced demand, in partitions.
type member struct {
	Worker   string
	Want     int // reserved partitions included
	Reserved int
}

// fairShare computes every member's share of partitions with reserved
// capacity: each member first gets its reserved partitions (in worker ID
// order while they last, so an over-reserved pool is split the same way by
// everyone), and the partitions left are shared max-min fair (waterFill)
// over what each member wants beyond its reservation. The result maps each
// worker to its share, reserved partitions included.
func fairShare(partitions int, members []member) map[string]int {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b member) int { return cmp.Compare(a.Worker, b.Worker) })
	left := max(partitions, 0)
	reserved := make(map[string]int, len(ms))
	rest := make([]member, 0, len(ms))
	for _, m := range ms {
		r := min(max(m.Reserved, 0), left)
		reserved[m.Worker] = r
		left -= r
		rest = append(rest, member{Worker: m.Worker, Want: max(m.Want, m.Reserved) - max(m.Reserved, 0)})
	}
	share := waterFill(left, rest)
	for w, r := range reserved {
		share[w] += r
	}
	return share
}

// waterFill computes the max-min fair share of partitions among members:
// every member gets min(its want, a common level), the level being as high
// as the partitions allow; when the level cannot be equal for everyone, the
// extra partitions go to the members that sort first by worker ID. The
// result maps each worker to its share; shares sum to min(partitions, Σ
// wants). Every worker that computes it from the same members gets the same
// answer. Wants below 0 count as 0.
func waterFill(partitions int, members []member) map[string]int {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b member) int {
		return cmp.Or(cmp.Compare(a.Want, b.Want), cmp.Compare(a.Worker, b.Worker))
	})
	share := make(map[string]int, len(ms))
	left := max(partitions, 0)
	for i, m := range ms {
		want := max(m.Want, 0)
		n := len(ms) - i
		level := left / n
		if want <= level {
			share[m.Worker] = want
			left -= want
			continue
		}
		// Everyone from here on wants more than the level: each gets the
		// level, and the remainder goes one each in worker ID order.
		rest := slices.Clone(ms[i:])
		slices.SortFunc(rest, func(a, b member) int { return cmp.Compare(a.Worker, b.Worker) })
		extra := left % n
		for j, r := range rest {
			share[r.Worker] = level
			if j < extra {
				share[r.Worker]++
			}
		}
		break
	}
	return share
}
