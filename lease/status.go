package lease

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
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
	// Demand is the announced demand in units/s; +Inf means a backlog
	// (encoded as the string "+Inf" in JSON).
	Demand float64 `json:"-"`
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
	// Demand is the sum of their announced demands in units/s; +Inf when
	// one of them has a backlog (the string "+Inf" in JSON).
	Demand float64 `json:"-"`
	// Holds is how many partitions they hold, reserved ones included;
	// Leased is that in units/s (Holds × PartitionRate).
	Holds  int     `json:"holds_partitions"`
	Leased float64 `json:"leased_units_per_s"`
}

// MarshalJSON encodes the demand as a number, or "+Inf".
func (s ClassStatus) MarshalJSON() ([]byte, error) {
	type plain ClassStatus
	return json.Marshal(struct {
		plain
		Demand any `json:"demand_units_per_s"`
	}{plain(s), jsonRate(s.Demand)})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (s *ClassStatus) UnmarshalJSON(b []byte) error {
	type plain ClassStatus
	v := struct {
		*plain
		Demand json.RawMessage `json:"demand_units_per_s"`
	}{plain: (*plain)(s)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return readRate(v.Demand, &s.Demand)
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (s *MemberStatus) UnmarshalJSON(b []byte) error {
	type plain MemberStatus
	v := struct {
		*plain
		Demand json.RawMessage `json:"demand_units_per_s"`
	}{plain: (*plain)(s)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return readRate(v.Demand, &s.Demand)
}

// readRate reads a rate written by jsonRate into v (absent: 0).
func readRate(raw json.RawMessage, v *float64) error {
	if len(raw) == 0 {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		f, err := strconv.ParseFloat(s, 64)
		*v = f
		return err
	}
	return json.Unmarshal(raw, v)
}

// jsonRate is v as a JSON number, or as a string when it is not finite.
func jsonRate(v float64) any {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return v
}

// MarshalJSON encodes the demand as a number, or "+Inf".
func (s MemberStatus) MarshalJSON() ([]byte, error) {
	type plain MemberStatus
	return json.Marshal(struct {
		plain
		Demand any `json:"demand_units_per_s"`
	}{plain(s), jsonRate(s.Demand)})
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
	k := keysFor(prefix, pool)
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
		st.Members = append(st.Members, MemberStatus{Worker: w, Want: a.Want, Demand: a.Demand, Reserved: a.Reserved, Holds: holds[w], Backlog: a.Backlog,
			Priority: a.Priority, Weight: max(a.Weight, DefaultWeight)})
		c := classes[a.Priority]
		if c == nil {
			c = &ClassStatus{Priority: a.Priority}
			classes[a.Priority] = c
		}
		c.Workers++
		c.Holds += holds[w]
		if a.Demand > 0 {
			c.Demand += a.Demand
		}
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

// String renders the status as text.
func (s PoolStatus) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pool %s: %s (%v %s/s per partition)\n", s.Pool.Name, s.Pool, s.PartitionRate, s.Pool.Unit)
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
		fmt.Fprintf(&b, "classes (served highest first):\n")
	}
	for _, c := range s.Classes {
		workers := "workers"
		if c.Workers == 1 {
			workers = "worker"
		}
		fmt.Fprintf(&b, "  %-6s  %d %s, demand %v %s/s, leased %v %s/s (%d partitions)\n",
			c.Priority, c.Workers, workers, c.Demand, s.Pool.Unit, c.Leased, s.Pool.Unit, c.Holds)
	}
	fmt.Fprintf(&b, "members (%d):\n", len(s.Members))
	for _, m := range s.Members {
		reserved := ""
		if m.Reserved > 0 {
			reserved = fmt.Sprintf(" (%d reserved)", m.Reserved)
		}
		class := ""
		if m.Weight > 0 { // a member, not a leftover holder
			class = fmt.Sprintf(", %s", m.Priority)
			if m.Weight != DefaultWeight {
				class += fmt.Sprintf(" weight %d", m.Weight)
			}
		}
		fmt.Fprintf(&b, "  %s  wants %d%s, holds %d partitions, demand %v %s/s%s\n", m.Worker, m.Want, reserved, m.Holds, m.Demand, s.Pool.Unit, class)
	}
	held := 0
	for _, p := range s.Partitions {
		if p.Holder != "" {
			held++
		}
	}
	fmt.Fprintf(&b, "partitions (%d of %d held):\n", held, len(s.Partitions))
	for _, p := range s.Partitions {
		if p.Holder == "" {
			fmt.Fprintf(&b, "  %3d  free\n", p.Partition)
			continue
		}
		fmt.Fprintf(&b, "  %3d  %s  ttl %v\n", p.Partition, p.Holder, p.TTLLeft.Round(time.Millisecond))
	}
	return b.String()
}
