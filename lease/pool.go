package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingest"
)

// DefaultTTL is the lease TTL of a pool that does not set one.
const DefaultTTL = 15 * time.Second

// DefaultPartitions is the number of capacity partitions of a pool that
// does not say: 20.
const DefaultPartitions = 20

// DefaultPrefix is the Redis key prefix used when none is given.
const DefaultPrefix = "sluice"

var (
	// ErrInvalidPool is wrapped by every error about a pool definition that
	// cannot work (capacity ≤ 0, no partitions, bad name, ...).
	ErrInvalidPool = errors.New("lease: invalid pool")
	// ErrPoolMismatch is wrapped by the error EnsurePool returns when Redis
	// already holds a different definition of the pool.
	ErrPoolMismatch = errors.New("lease: pool definition mismatch")
	// ErrNoPool is wrapped by Status when the pool is not defined in Redis.
	ErrNoPool = errors.New("lease: pool not defined")
)

// Pool is one throttled resource whose capacity workers share through
// leases on its partitions.
type Pool struct {
	// Name identifies the pool in Redis keys: letters, digits, '.', '_'
	// and '-', at most 100 characters. Required.
	Name string
	// Capacity is the pool's provisioned rate, in Unit per second. Must be
	// finite and > 0.
	Capacity float64
	// Unit is what Capacity counts. Default ingest.UnitRecords.
	Unit ingest.Unit
	// Partitions is the number of capacity partitions P the capacity is
	// split into; each lease is worth Capacity/P units/s. Must be ≥ 1 and
	// ≤ 10,000.
	Partitions int
	// TTL is how long a lease lives in Redis without renewal. Default 15 s;
	// must be ≥ 100 ms (and, for a Manager, exceed its margin and renewal
	// interval; see Config).
	TTL time.Duration
	// Ramp, when on, ramps the effective rate up from Ramp.Start to
	// Capacity; partitions are worth effective rate / Partitions. Default
	// off.
	Ramp Ramp
	// Switch is set on a definition changed live by SetPool: the values in
	// force before Switch.At. Nil otherwise; EnsurePool ignores it.
	Switch *Switch
	// Source says where Capacity comes from: the number given (the zero
	// Source), the sink, or a probe. With a source, Capacity is the value
	// last decided for the pool (see Controller) and From says how.
	Source Source
	// From describes how the capacity in force was decided, for `sluice
	// pool status`: "probed", "from DynamoDB table quakes: 200 WCU", or
	// "" for a number given.
	From string
	// Changes are the latest changes applied from a worker's flags
	// (ApplyPool), newest last, at most changeHistory: what flap detection
	// reads. EnsurePool ignores them.
	Changes []Change
}

// PartitionRate returns the rate one lease is worth, in units/s:
// Capacity / Partitions.
func (p Pool) PartitionRate() float64 {
	if p.Partitions <= 0 {
		return 0
	}
	return p.Capacity / float64(p.Partitions)
}

// withDefaults fills Unit and TTL.
func (p Pool) withDefaults() Pool {
	if p.Unit == "" {
		p.Unit = ingest.UnitRecords
	}
	if p.TTL == 0 {
		p.TTL = DefaultTTL
	}
	p.Ramp = p.Ramp.withDefaults()
	p.Source = p.Source.withDefaults()
	return p
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// Validate reports, wrapping ErrInvalidPool, the first field of p (after
// defaults) that cannot work, naming it.
func (p Pool) Validate() error {
	p = p.withDefaults()
	invalid := func(field, format string, args ...any) error {
		return &PoolError{Pool: p.Name, Field: field, Err: fmt.Errorf(format, args...)}
	}
	switch {
	case !namePattern.MatchString(p.Name):
		return invalid("Name", "pool name %q must be 1-100 letters, digits, '.', '_' or '-'", p.Name)
	case math.IsNaN(p.Capacity) || math.IsInf(p.Capacity, 0) || p.Capacity <= 0:
		return invalid("Capacity", "capacity must be a finite number > 0 %s/s, got %v", p.Unit, p.Capacity)
	case p.Partitions < 1 || p.Partitions > 10000:
		return invalid("Partitions", "partitions must be between 1 and 10000, got %d", p.Partitions)
	case p.TTL < 100*time.Millisecond:
		return invalid("TTL", "lease TTL must be ≥ 100ms, got %v", p.TTL)
	}
	if _, err := ingest.ParseUnit(string(p.Unit)); err != nil {
		return invalid("Unit", "unit: %v", err)
	}
	if err := p.Ramp.validate(); err != nil {
		return invalid("Ramp", "%v", err)
	}
	if err := p.Source.validate(); err != nil {
		return invalid("Source", "%v", err)
	}
	return nil
}

// PoolError is an invalid field of a pool definition. It wraps
// ErrInvalidPool; Field names the Pool field (Name, Capacity, Partitions,
// TTL, Unit, Ramp or Source) so a caller can name its own setting for it.
type PoolError struct {
	Pool, Field string
	Err         error
}

func (e *PoolError) Error() string {
	return fmt.Sprintf("%v: pool %q: %v", ErrInvalidPool, e.Pool, e.Err)
}

func (e *PoolError) Unwrap() []error { return []error{ErrInvalidPool, e.Err} }

// String describes the definition as the mismatch error shows it, e.g.
// "capacity 2000 records/s, 20 partitions, ttl 15s".
func (p Pool) String() string {
	p = p.withDefaults()
	s := fmt.Sprintf("capacity %v %s/s, %d partitions, ttl %v", p.Capacity, p.Unit, p.Partitions, p.TTL)
	if p.Source.On() {
		s = fmt.Sprintf("%s (%s), %d partitions, ttl %v", p.Source, p.Unit, p.Partitions, p.TTL)
	}
	if p.Ramp.On() {
		s += ", " + p.Ramp.String()
	}
	return s
}

// CapacityLine renders the capacity in force as `sluice pool status` shows
// it: "capacity 1,840 records/s (probed)", "capacity 200 cost/s (from
// DynamoDB table quakes: 200 WCU)", or "capacity 2,000 records/s" for a
// number given.
func (p Pool) CapacityLine() string {
	p = p.withDefaults()
	s := fmt.Sprintf("capacity %s %s/s", formatRate(p.Capacity), p.Unit)
	switch {
	case p.From != "":
		s += " (" + p.From + ")"
	case p.Source.Kind == SourceProbe:
		s += " (probing)"
	case p.Source.Kind == SourceSink:
		s += " (from the sink, not read yet)"
	}
	return s
}

// poolJSON is the stored and printed shape of a Pool. Durations are Go
// duration strings ("15s"); the switch instant is Unix milliseconds.
type poolJSON struct {
	Name       string      `json:"name"`
	Capacity   float64     `json:"capacity"`
	Unit       ingest.Unit `json:"unit"`
	Partitions int         `json:"partitions"`
	TTL        string      `json:"ttl"`
	Ramp       *rampJSON   `json:"ramp,omitempty"`
	Switch     *switchJSON `json:"switch,omitempty"`
	Source     *sourceJSON `json:"source,omitempty"`
	From       string      `json:"from,omitempty"`
	Changes    []Change    `json:"changes,omitempty"`
}

type rampJSON struct {
	Start     float64 `json:"start"`
	Factor    float64 `json:"factor"`
	Period    string  `json:"period"`
	IdleReset string  `json:"idle_reset"`
}

type switchJSON struct {
	AtUnixMS   int64   `json:"at_unix_ms"`
	Capacity   float64 `json:"capacity_before"`
	Partitions int     `json:"partitions_before"`
}

// MarshalJSON encodes p (see poolJSON).
func (p Pool) MarshalJSON() ([]byte, error) {
	j := poolJSON{Name: p.Name, Capacity: p.Capacity, Unit: p.Unit, Partitions: p.Partitions, TTL: p.TTL.String()}
	if p.Ramp.On() {
		j.Ramp = &rampJSON{p.Ramp.Start, p.Ramp.Factor, p.Ramp.Period.String(), p.Ramp.IdleReset.String()}
	}
	if p.Switch != nil {
		j.Switch = &switchJSON{p.Switch.At.UnixMilli(), p.Switch.Capacity, p.Switch.Partitions}
	}
	j.Source, j.From, j.Changes = p.Source.toJSON(), p.From, p.Changes
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (p *Pool) UnmarshalJSON(data []byte) error {
	var j poolJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	ttl, err := time.ParseDuration(j.TTL)
	if err != nil {
		return fmt.Errorf("pool ttl: %w", err)
	}
	out := Pool{Name: j.Name, Capacity: j.Capacity, Unit: j.Unit, Partitions: j.Partitions, TTL: ttl}
	if r := j.Ramp; r != nil {
		out.Ramp = Ramp{Start: r.Start, Factor: r.Factor}
		if out.Ramp.Period, err = time.ParseDuration(r.Period); err != nil {
			return fmt.Errorf("pool ramp period: %w", err)
		}
		if out.Ramp.IdleReset, err = time.ParseDuration(r.IdleReset); err != nil {
			return fmt.Errorf("pool ramp idle reset: %w", err)
		}
	}
	if sw := j.Switch; sw != nil {
		out.Switch = &Switch{At: time.UnixMilli(sw.AtUnixMS), Capacity: sw.Capacity, Partitions: sw.Partitions}
	}
	if out.Source, err = j.Source.source(); err != nil {
		return err
	}
	out.From, out.Changes = j.From, j.Changes
	*p = out
	return nil
}

// keys is the Redis key layout of one pool.
type keys struct{ base string }

func keysFor(prefix, pool string) keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return keys{base: prefix + ":" + pool}
}

func (k keys) def() string            { return k.base + ":def" }
func (k keys) partition(i int) string { return fmt.Sprintf("%s:p:%d", k.base, i) }
func (k keys) handOver(i int) string  { return fmt.Sprintf("%s:h:%d", k.base, i) }
func (k keys) rampEpoch() string      { return k.base + ":ramp" }
func (k keys) live() string           { return k.base + ":live" }
func (k keys) announcements() string  { return k.base + ":ann" }
func (k keys) membersVersion() string { return k.base + ":mver" }
func (k keys) defVersion() string     { return k.base + ":dver" }
func (k keys) capacityState() string  { return k.base + ":cap" }

// observations is the capacity account's bucket b (Unix ms / 500).
func (k keys) observations(b int64) string { return k.base + ":obs:" + strconv.FormatInt(b, 10) }

// changes is the channel membership and definition changes are published
// on: "m <worker>" (membership), "d" (SetPool) or "f" (partitions
// unlocked after a release).
func (k keys) changes() string { return k.base + ":changes" }

// EnsurePool stores p as the definition of pool p.Name under prefix
// (DefaultPrefix when empty) if Redis has none, and otherwise checks that
// the stored one agrees, and returns the definition in force. A stored
// definition changed live (by SetPool, a capacity source, or a definition
// applied by another deployment) wins over p's capacity and partitions (a
// pod restarted with its original flags after `sluice pool set` runs with
// the stored values: the caller should say so); any other difference is a
// conflict. It is DefinePool with DefinitionAdopt. It returns an error
// wrapping ErrInvalidPool if p is invalid, one wrapping ErrPoolMismatch
// naming both definitions if Redis holds a conflicting one, and Redis
// errors as they come. With several independent Redis masters, call it
// for each.
func EnsurePool(ctx context.Context, client redis.UniversalClient, prefix string, p Pool) (Pool, error) {
	p, _, err := DefinePool(ctx, client, prefix, p, DefinitionAdopt, "", MinLead, time.Now())
	return p, err
}

func loadPool(ctx context.Context, client redis.Cmdable, key string) (Pool, error) {
	data, err := client.Get(ctx, key).Bytes()
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return Pool{}, err
		}
		return Pool{}, fmt.Errorf("lease: read pool definition %s: %w", key, err)
	}
	var p Pool
	if err := json.Unmarshal(data, &p); err != nil {
		return Pool{}, fmt.Errorf("lease: pool definition %s is not valid JSON: %w", key, err)
	}
	return p, nil
}
