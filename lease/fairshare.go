package lease

import (
	"cmp"
	"container/heap"
	"maps"
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
	// Need is the fewest partitions the worker can use at all: the record
	// at the head of its line costs more than a smaller share lets its
	// pacer's one-second account ever hold. 0 or 1: any share will do.
	Need int
	// NeedSince is when the worker began waiting for Need, in Unix
	// milliseconds: needs are served longest-waiting first.
	NeedSince int64
	// Priority is the worker's class: classes are served in order,
	// highest first.
	Priority Priority
	// Weight is the worker's weight inside its class (≥ 1; 0 counts as
	// DefaultWeight).
	Weight int
}

// fairShare computes every member's share of partitions with reserved
// capacity, priority classes, weights and needs. Each member first gets
// its reserved partitions, whatever its class (in worker ID order while
// they last, so an over-reserved pool is split the same way by everyone).
// The partitions left are then given class by class, highest first: each
// class shares what the classes above it left, weighted max-min fair
// (waterFill) over what each of its members wants beyond its reservation,
// and the next class gets what it did not want. Inside a class there is
// one exception to the fill: a member whose Need exceeds its reservation
// and any fair share gets at least its Need, longest-waiting first while
// the class's partitions last, and one whose Need does not fit gets
// nothing beyond its reservation (a share short of its need could only sit
// idle while it waits its turn). The result maps each worker to its share,
// reserved partitions included. Every worker that computes it from the
// same members gets the same answer.
func fairShare(partitions int, members []member) map[string]int {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b member) int { return cmp.Compare(a.Worker, b.Worker) })
	left := max(partitions, 0)
	reserved := make(map[string]int, len(ms))
	classes := map[Priority][]member{}
	for _, m := range ms {
		r := min(max(m.Reserved, 0), left)
		reserved[m.Worker] = r
		left -= r
		classes[m.Priority] = append(classes[m.Priority], member{Worker: m.Worker, Want: max(m.Want, m.Reserved) - max(m.Reserved, 0),
			Need: min(m.Need, m.Want) - r, NeedSince: m.NeedSince, Weight: m.Weight})
	}
	order := slices.Collect(maps.Keys(classes))
	slices.SortFunc(order, func(a, b Priority) int { return cmp.Compare(b, a) }) // highest first
	share := make(map[string]int, len(ms))
	for _, p := range order {
		got := classShare(left, classes[p])
		for w, n := range got {
			share[w] = n
			left -= n
		}
	}
	for w, r := range reserved {
		share[w] += r
	}
	return share
}

// classShare shares partitions among the members of one class: needs
// first (see fairShare), then the weighted water fill.
func classShare(partitions int, rest []member) map[string]int {
	// Needs beyond the reservation, longest-waiting first: a floor while
	// the partitions last, nothing beyond the reservation after.
	byWait := slices.Clone(rest)
	slices.SortStableFunc(byWait, func(a, b member) int { return cmp.Compare(a.NeedSince, b.NeedSince) })
	floors := make(map[string]int, len(rest))
	free := partitions
	for _, m := range byWait {
		if m.Need <= 1 || m.Want <= 0 {
			continue
		}
		if m.Need <= free {
			floors[m.Worker] = m.Need
			free -= m.Need
		} else {
			floors[m.Worker] = -1 // waits its turn
		}
	}
	for i, m := range rest {
		if floors[m.Worker] < 0 {
			rest[i].Want, floors[m.Worker] = 0, 0
		}
	}
	return waterFill(partitions, rest, floors)
}

// waterFill computes the weighted max-min fair share of partitions among
// members with floors: every member starts at its floor (which the caller
// keeps within the partitions), and each further partition goes to the
// member still below its want whose share, taken as share + 1/2 over its
// weight, is lowest (ties to the lowest worker ID): the Sainte-Laguë
// rounding of the continuous fill in which every member gets min(its
// want, weight × a common level), the level as high as the partitions
// allow. With equal weights every member gets min(its want, the level),
// the remainder going one each to the lowest worker IDs at the level;
// with weights 2 and 1 two members with backlogs split 2:1. The result
// maps each worker to its share; shares sum to min(partitions, Σ max(want,
// floor)). Every worker that computes it from the same members gets the
// same answer. Wants below 0 count as 0, weights below 1 as DefaultWeight.
func waterFill(partitions int, members []member, floors map[string]int) map[string]int {
	share := make(map[string]int, len(members))
	left := max(partitions, 0)
	h := make(fillHeap, 0, len(members))
	for _, m := range members {
		f := max(floors[m.Worker], 0)
		share[m.Worker] = f
		left -= f
		if m.Want > f {
			w := m.Weight
			if w < 1 {
				w = DefaultWeight
			}
			h = append(h, &filling{worker: m.Worker, share: f, want: m.Want, weight: w})
		}
	}
	heap.Init(&h)
	for ; left > 0 && h.Len() > 0; left-- {
		next := h[0]
		next.share++
		share[next.worker] = next.share
		if next.share >= next.want {
			heap.Pop(&h)
		} else {
			heap.Fix(&h, 0)
		}
	}
	return share
}

// filling is a member still below its want, in waterFill's heap.
type filling struct {
	worker              string
	share, want, weight int
}

// fillHeap orders members by (2 × share + 1) / weight, then worker ID:
// its head gets the next partition. The ratios are compared by cross
// multiplication, exactly.
type fillHeap []*filling

func (h fillHeap) Len() int { return len(h) }
func (h fillHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	return cmp.Or(cmp.Compare(int64(2*a.share+1)*int64(b.weight), int64(2*b.share+1)*int64(a.weight)), cmp.Compare(a.worker, b.worker)) < 0
}
func (h fillHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *fillHeap) Push(x any)   { *h = append(*h, x.(*filling)) }
func (h *fillHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
