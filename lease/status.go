package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// PoolStatus is a snapshot of one pool as one Redis sees it, for `sluice
// pool status`.
type PoolStatus struct {
	// Pool is the stored definition.
	Pool Pool `json:"pool"`
	// PartitionRate is EffectiveRate / Partitions, in units/s.
	PartitionRate float64 `json:"partition_rate"`
	// EffectiveRate is the pool's rate now, in units/s: its capacity, or
	// less while a ramp climbs.
	EffectiveRate float64 `json:"effective_rate"`
	// Backlog is the units the members announced waiting for them, -1 when
	// none announced it.
	Backlog float64 `json:"backlog_units"`
	// ETA is Backlog ÷ EffectiveRate, the time to drain the backlog at the
	// pool's full rate; -1 when unknown.
	ETA time.Duration `json:"-"`
	// ETASeconds is ETA in seconds, for JSON.
	ETASeconds float64 `json:"eta_s"`
	// Classes are the priority classes that have members, highest first
	// (the order the pool serves them in).
	Classes []ClassStatus `json:"classes"`
	// Members are the workers announcing demand, by worker ID.
	Members []MemberStatus `json:"members"`
	// Partitions are all P partitions, by index.
	Partitions []PartitionStatus `json:"partitions"`
}

// MemberStatus is one worker's announcement.
type MemberStatus struct {
	Worker string `json:"worker"`
	// Want is the number of partitions the worker asks for (0..P).
	Want int `json:"want_partitions"`
	// Demand is the announced demand in units/s, finite: a worker with a
	// backlog wants all it can get (WantsAll), shown as the pool's
	// effective rate.
	Demand float64 `json:"demand_units_per_s"`
	// WantsAll is true when the worker asks for all it can get (it has a
	// backlog).
	WantsAll bool `json:"wants_all"`
	// Reserved is how many of them the worker holds whatever its demand.
	Reserved int `json:"reserved_partitions"`
	// Holds is how many partitions the worker holds.
	Holds int `json:"holds_partitions"`
	// Backlog is the units waiting for the worker, -1 unknown.
	Backlog float64 `json:"backlog_units"`
	// Priority is the worker's class; Weight its weight inside the class
	// (0 for a holder that is no longer a member).
	Priority Priority `json:"priority"`
	Weight   int      `json:"weight"`
}

// ClassStatus sums one priority class's members.
type ClassStatus struct {
	Priority Priority `json:"priority"`
	// Workers is how many members announce this class.
	Workers int `json:"workers"`
	// Demand is the sum of their demands as MemberStatus shows them, in
	// units/s, at most the pool's effective rate.
	Demand float64 `json:"demand_units_per_s"`
	// WantsAll is true when one of them asks for all it can get.
	WantsAll bool `json:"wants_all"`
	// Holds is how many partitions they hold, reserved ones included;
	// Leased is that in units/s (Holds × PartitionRate).
	Holds  int     `json:"holds_partitions"`
	Leased float64 `json:"leased_units_per_s"`
}

// PartitionStatus is who holds one partition.
type PartitionStatus struct {
	Partition int `json:"partition"`
	// Holder is the worker ID holding the lease, "" when free.
	Holder string `json:"holder,omitempty"`
	// TTLLeft is the lease's remaining TTL in Redis (0 when free).
	TTLLeft time.Duration `json:"-"`
	// TTLLeftMS is TTLLeft in milliseconds, for JSON.
	TTLLeftMS int64 `json:"ttl_left_ms,omitempty"`
}

// Status reads pool's definition, members and partition holders from one
// Redis under prefix (DefaultPrefix when empty). It returns an error
// wrapping ErrNoPool when the pool is not defined there.
func Status(ctx context.Context, client redis.UniversalClient, prefix, pool string) (PoolStatus, error) {
	k := keysOn(client, prefix, pool)
	p, err := loadPool(ctx, client, k.def())
	if errors.Is(err, redis.Nil) {
		return PoolStatus{}, fmt.Errorf("%w: no pool %q in Redis (key %s); a worker defines it on start", ErrNoPool, pool, k.def())
	}
	if err != nil {
		return PoolStatus{}, err
	}
	p.Name = pool
	members, _, err := readMembers(ctx, client, k)
	if err != nil {
		return PoolStatus{}, fmt.Errorf("lease: read members of pool %q: %w", pool, err)
	}
	pipe := client.Pipeline()
	gets := make([]*redis.StringCmd, p.Partitions)
	ttls := make([]*redis.DurationCmd, p.Partitions)
	for i := range p.Partitions {
		gets[i] = pipe.Get(ctx, k.partition(i))
		ttls[i] = pipe.PTTL(ctx, k.partition(i))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return PoolStatus{}, fmt.Errorf("lease: read partitions of pool %q: %w", pool, err)
	}
	sched := schedule{pool: p}
	if p.Ramp.On() {
		if ms, err := client.Get(ctx, k.rampEpoch()).Int64(); err == nil {
			sched.epoch = time.UnixMilli(ms)
		}
	}
	now := time.Now()
	st := PoolStatus{Pool: p, PartitionRate: sched.partitionRate(now), EffectiveRate: sched.effective(now),
		Backlog: -1, ETA: -1, ETASeconds: -1, Partitions: make([]PartitionStatus, p.Partitions)}
	holds := map[string]int{}
	for i := range p.Partitions {
		ps := PartitionStatus{Partition: i}
		if v, err := gets[i].Result(); err == nil {
			ps.Holder = holderOf(v)
			ps.TTLLeft = max(ttls[i].Val(), 0)
			ps.TTLLeftMS = ps.TTLLeft.Milliseconds()
			holds[ps.Holder]++
		}
		st.Partitions[i] = ps
	}
	classes := map[Priority]*ClassStatus{}
	for w, a := range members {
		demand, all := a.Demand, math.IsInf(a.Demand, 1) || math.IsNaN(a.Demand)
		if all {
			demand = st.EffectiveRate
		}
		st.Members = append(st.Members, MemberStatus{Worker: w, Want: a.Want, Demand: demand, WantsAll: all, Reserved: a.Reserved, Holds: holds[w], Backlog: a.Backlog,
			Priority: a.Priority, Weight: max(a.Weight, DefaultWeight)})
		c := classes[a.Priority]
		if c == nil {
			c = &ClassStatus{Priority: a.Priority}
			classes[a.Priority] = c
		}
		c.Workers++
		c.Holds += holds[w]
		c.Demand = min(c.Demand+max(demand, 0), st.EffectiveRate)
		c.WantsAll = c.WantsAll || all
		delete(holds, w)
		if a.Backlog >= 0 {
			st.Backlog = max(st.Backlog, 0) + a.Backlog
		}
	}
	if st.Backlog >= 0 && st.EffectiveRate > 0 {
		st.ETASeconds = st.Backlog / st.EffectiveRate
		st.ETA = time.Duration(st.ETASeconds * float64(time.Second))
	}
	for w, n := range holds { // holders that are no longer members (crashed, or just leaving)
		st.Members = append(st.Members, MemberStatus{Worker: w, Holds: n, Backlog: -1})
	}
	for _, c := range classes {
		c.Leased = float64(c.Holds) * st.PartitionRate
		st.Classes = append(st.Classes, *c)
	}
	slices.SortFunc(st.Classes, func(a, b ClassStatus) int { return cmp.Compare(b.Priority, a.Priority) })
	slices.SortFunc(st.Members, func(a, b MemberStatus) int { return cmp.Compare(a.Worker, b.Worker) })
	return st, nil
}

// String renders the status as text: the pool, its classes (highest
// first), then one line per worker (its partitions summarised, its class),
// then the free partitions.
func (s PoolStatus) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pool %s: %s (%v %s/s per partition)\n", s.Pool.Name, s.Pool, s.PartitionRate, s.Pool.Unit)
	if s.Pool.Source.On() || s.Pool.From != "" {
		fmt.Fprintf(&b, "%s\n", s.Pool.CapacityLine())
	}
	if s.EffectiveRate != s.Pool.Capacity {
		fmt.Fprintf(&b, "effective rate: %v %s/s (ramping up)\n", s.EffectiveRate, s.Pool.Unit)
	}
	if sw := s.Pool.Switch; sw != nil && sw.At.After(time.Now()) {
		fmt.Fprintf(&b, "switching at %s (until then: capacity %v, %d partitions)\n", sw.At.Format(time.RFC3339), sw.Capacity, sw.Partitions)
	}
	if s.Backlog >= 0 {
		fmt.Fprintf(&b, "backlog: %v %s, ETA %v at the pool's rate\n", s.Backlog, s.Pool.Unit, s.ETA.Round(100*time.Millisecond))
	}
	if len(s.Classes) > 0 {
		b.WriteString("classes (served highest first):\n")
	}
	for _, c := range s.Classes {
		workers := "workers"
		if c.Workers == 1 {
			workers = "worker"
		}
		demand := fmt.Sprintf("demand %v %s/s", c.Demand, s.Pool.Unit)
		if c.WantsAll {
			demand = "demand: all it can get (a backlog)"
		}
		fmt.Fprintf(&b, "  %-6s  %d %s, %s, leased %v %s/s (%d partitions)\n",
			c.Priority, c.Workers, workers, demand, c.Leased, s.Pool.Unit, c.Holds)
	}
	held := map[string][]PartitionStatus{}
	var free []int
	for _, p := range s.Partitions {
		if p.Holder == "" {
			free = append(free, p.Partition)
			continue
		}
		held[p.Holder] = append(held[p.Holder], p)
	}
	fmt.Fprintf(&b, "workers (%d):\n", len(s.Members))
	for _, m := range s.Members {
		fmt.Fprintf(&b, "  %s  holds %d of %d partitions", m.Worker, m.Holds, len(s.Partitions))
		if ps := held[m.Worker]; len(ps) > 0 {
			idx := make([]int, len(ps))
			least := ps[0].TTLLeft
			for i, p := range ps {
				idx[i], least = p.Partition, min(least, p.TTLLeft)
			}
			fmt.Fprintf(&b, " (%s; %v %s/s; leases %v left at least)", ranges(idx), float64(len(ps))*s.PartitionRate, s.Pool.Unit, least.Round(100*time.Millisecond))
		}
		fmt.Fprintf(&b, ", wants %d", m.Want)
		if m.Reserved > 0 {
			fmt.Fprintf(&b, " (%d reserved)", m.Reserved)
		}
		switch {
		case m.WantsAll:
			fmt.Fprintf(&b, ", demand: all it can get (a backlog)")
		default:
			fmt.Fprintf(&b, ", demand %v %s/s", m.Demand, s.Pool.Unit)
		}
		if m.Backlog >= 0 {
			fmt.Fprintf(&b, ", backlog %v %s", m.Backlog, s.Pool.Unit)
		}
		if m.Weight > 0 { // a member, not a leftover holder
			fmt.Fprintf(&b, ", %s", m.Priority)
			if m.Weight != DefaultWeight {
				fmt.Fprintf(&b, " weight %d", m.Weight)
			}
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "free partitions: %d of %d", len(free), len(s.Partitions))
	if len(free) > 0 {
		fmt.Fprintf(&b, " (%s)", ranges(free))
	}
	b.WriteString("\n")
	return b.String()
}

// ranges writes sorted partition indexes as runs: "0-3, 7, 9-10".
func ranges(idx []int) string {
	slices.Sort(idx)
	var parts []string
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", idx[i], idx[j]))
		} else {
			parts = append(parts, strconv.Itoa(idx[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

// PoolSummary is one pool of ListPools.
type PoolSummary struct {
	Pool    Pool `json:"pool"`
	Members int  `json:"members"` // workers announcing demand
}

// ListPools reads every pool defined under prefix (DefaultPrefix when
// empty) in one Redis, by name, for `sluice pool list`.
func ListPools(ctx context.Context, client redis.UniversalClient, prefix string) ([]PoolSummary, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	var names []string
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, prefix+":*:def", 1000).Iterator()
		for it.Next(ctx) {
			name := strings.TrimSuffix(strings.TrimPrefix(it.Val(), prefix+":"), ":def")
			names = append(names, strings.TrimSuffix(strings.TrimPrefix(name, "{"), "}"))
		}
		return it.Err()
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, node)
		})
	case *redis.Client:
		err = scan(ctx, c)
	default:
		return nil, fmt.Errorf("lease: list pools: unsupported Redis client %T", client)
	}
	if err != nil {
		return nil, fmt.Errorf("lease: list pools: %w", err)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	out := make([]PoolSummary, 0, len(names))
	for _, name := range names {
		st, err := Status(ctx, client, prefix, name)
		if errors.Is(err, ErrNoPool) {
			continue // deleted in between
		}
		if err != nil {
			return nil, err
		}
		out = append(out, PoolSummary{Pool: st.Pool, Members: len(st.Members)})
	}
	return out, nil
}

// CheckPool says how pool p stands in one Redis without storing anything
// (a dry run): the definition a worker started with p and mode would run
// with (the stored one, or p when Redis has none or mode applies it),
// whether Redis holds one, and the error DefinePool would return (wrapping
// ErrPoolMismatch, naming both, or ErrInvalidPool).
func CheckPool(ctx context.Context, client redis.UniversalClient, prefix string, p Pool, mode DefinitionMode) (inForce Pool, stored bool, err error) {
	if err := p.Validate(); err != nil {
		return Pool{}, false, err
	}
	p = p.withDefaults()
	key := keysOn(client, prefix, p.Name).def()
	have, err := loadPool(ctx, client, key)
	if errors.Is(err, redis.Nil) {
		return p, false, nil
	}
	if err != nil {
		return Pool{}, false, err
	}
	inForce, _, apply, err := judge(have, p, mode, key)
	if apply {
		inForce = p
	}
	return inForce, true, err
}
