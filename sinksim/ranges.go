package sinksim

import (
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinkwire"
)

// Range partition defaults of the emulator (Config.PartitionLimit and
// the fields after it).
const (
	// DefaultPartitionLimit is the per-range limit sink-sim applies when
	// asked for range partitions without a limit: 2,000 operations/s, the
	// per-partition target of Azure Table Storage and of Alibaba Cloud OSS.
	DefaultPartitionLimit = 2000
	// DefaultSplitAfter is how long a range must stay hot before it splits,
	// standing in for the "few minutes" a real store takes to split.
	DefaultSplitAfter = 5 * time.Second
	// DefaultMaxPartitions caps the number of ranges.
	DefaultMaxPartitions = 64

	// hotShare is the share of its limit a range must use in the last
	// second to count as hot (or it throttled in the last second). Half:
	// a client that backs off when throttled keeps a busy range above it.
	hotShare = 0.5
	// rangeSample is how many recent keys a range keeps to find its median.
	rangeSample = 512
)

// keyRange is one range partition: the keys from low (inclusive) to the
// next range's low (exclusive).
type keyRange struct {
	low      string
	ops      ingest.Window // operations admitted in the last second
	sample   []string      // ring of recently admitted keys
	next     int           // the ring's next slot
	hotSince time.Duration
	hot      bool
	lastHit  time.Duration // last throttle; meaningful when throttles > 0

	accepted, throttled int64
}

// ranges is the emulator's range partitioning: keys are ordered
// lexicographically and cut into ranges, each admitting at most limit
// operations in any sliding second. A range that stays hot (≥ 50 % of its
// limit used, or throttling, through every request for splitAfter) splits
// at the median of its recent keys, up to maxParts ranges. Sequential keys
// keep landing in the last range, so they stay capped at one range's limit
// however often it splits; spread keys fill every range.
type ranges struct {
	limit      int64
	splitAfter time.Duration
	maxParts   int
	parts      []*keyRange // by low; parts[0].low == ""
	splits     int
}

func newRanges(limit int64, splitAfter time.Duration, maxParts int) *ranges {
	return &ranges{limit: limit, splitAfter: splitAfter, maxParts: maxParts, parts: []*keyRange{newKeyRange("")}}
}

func newKeyRange(low string) *keyRange {
	return &keyRange{low: low, ops: ingest.NewWindow(time.Second)}
}

// find returns the index of the range holding key.
func (r *ranges) find(key string) int {
	return sort.Search(len(r.parts), func(i int) bool { return r.parts[i].low > key }) - 1
}

// wait returns 0 if one more operation fits range i at at, on top of
// pending ones of the same request, else how long until it would.
func (r *ranges) wait(at time.Duration, i int, pending int64) time.Duration {
	p := r.parts[i]
	p.ops.Expire(at)
	return p.ops.WaitFor(at, pending, 1, r.limit)
}

// admit records an admitted operation on key in range i.
func (r *ranges) admit(at time.Duration, i int, key string) {
	p := r.parts[i]
	p.ops.Add(at, 1)
	p.accepted++
	if len(p.sample) < rangeSample {
		p.sample = append(p.sample, key)
	} else {
		p.sample[p.next] = key
		p.next = (p.next + 1) % rangeSample
	}
}

// throttle records an operation range i refused.
func (r *ranges) throttle(at time.Duration, i int) {
	p := r.parts[i]
	p.throttled++
	p.lastHit = at
}

// settle updates which ranges are hot after a request at at and splits the
// ones hot for splitAfter, while there is room for more ranges.
func (r *ranges) settle(at time.Duration) {
	for i := 0; i < len(r.parts); i++ {
		p := r.parts[i]
		p.ops.Expire(at)
		hot := float64(p.ops.Sum(at)) >= hotShare*float64(r.limit) || (p.throttled > 0 && at-p.lastHit < time.Second)
		switch {
		case !hot:
			p.hot = false
		case !p.hot:
			p.hot, p.hotSince = true, at
		case at-p.hotSince >= r.splitAfter && len(r.parts) < r.maxParts:
			if r.split(i) {
				i++ // the new right half starts cool
			}
		}
	}
}

// split cuts range i at the median of its recent keys; false when they
// cannot be cut (the median is their least key, or the range's own low).
func (r *ranges) split(i int) bool {
	p := r.parts[i]
	keys := slices.Clone(p.sample)
	slices.Sort(keys)
	if len(keys) < 2 {
		return false
	}
	median := keys[len(keys)/2]
	if median <= p.low || keys[0] == median {
		return false
	}
	// Both halves keep the last second's operations: which half they fell
	// in is not recorded, and a split must not hand the hot keys a fresh
	// second of limit.
	right := newKeyRange(median)
	right.ops = p.ops.Clone()
	var left []string
	for _, k := range keys {
		if k < median {
			left = append(left, k)
		} else {
			right.sample = append(right.sample, k)
		}
	}
	p.sample, p.next, p.hot = left, 0, false
	r.parts = slices.Insert(r.parts, i+1, right)
	r.splits++
	return true
}

// stats returns the layout and counters of every range.
func (r *ranges) stats() []sinkwire.PartitionStats {
	out := make([]sinkwire.PartitionStats, len(r.parts))
	for i, p := range r.parts {
		out[i] = sinkwire.PartitionStats{Low: p.low, Accepted: p.accepted, Throttled: p.throttled, MaxOps1s: p.ops.Max()}
		if i+1 < len(r.parts) {
			out[i].High = r.parts[i+1].low
		}
	}
	return out
}
