package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefinitionMode says what a worker does when the pool definition it was
// started with differs from the one stored in Redis (DefinePool).
type DefinitionMode string

// The definition modes.
const (
	// DefinitionAdopt runs with the stored definition when it was changed
	// live (`sluice pool set`, a capacity source's decision, a definition
	// applied by another deployment) and refuses any other difference:
	// the behaviour of EnsurePool, and the CLI's default.
	DefinitionAdopt DefinitionMode = "adopt"
	// DefinitionApply applies the worker's definition as a live change
	// (SetPool's rule: lower at once, raise at a switch instant); peers
	// follow it as they follow `sluice pool set`. For GitOps, where the
	// deployment's values are the declaration. A pool changed back and
	// forth by two deployments is refused (ErrPoolFlapping).
	DefinitionApply DefinitionMode = "apply"
	// DefinitionRefuse refuses to start on any difference, even one made
	// live.
	DefinitionRefuse DefinitionMode = "refuse"
)

// ParseDefinitionMode reads "apply", "adopt" or "refuse".
func ParseDefinitionMode(s string) (DefinitionMode, error) {
	switch m := DefinitionMode(strings.ToLower(strings.TrimSpace(s))); m {
	case DefinitionAdopt, DefinitionApply, DefinitionRefuse:
		return m, nil
	}
	return "", fmt.Errorf("want apply, adopt or refuse, got %q", s)
}

// ErrPoolFlapping is wrapped by DefinePool's error when applying the
// definition would change the pool back for the second time within
// FlapWindow: two deployments keep disagreeing about it.
var ErrPoolFlapping = errors.New("lease: pool definition flapping")

// FlapWindow is how far back DefinePool looks for a pool changed back and
// forth: 10 minutes.
const FlapWindow = 10 * time.Minute

// changeHistory is how many applied changes a definition keeps.
const changeHistory = 4

// Change is one definition applied to a pool from a worker's flags.
type Change struct {
	// By is the worker ID that applied it.
	By string `json:"by"`
	// Def is what was applied: the live part of the definition (capacity
	// or its source, and partitions), as Pool.declared renders it.
	Def string `json:"def"`
	// AtUnixMS is when, in Unix milliseconds.
	AtUnixMS int64 `json:"at_unix_ms"`
}

func (c Change) String() string {
	return fmt.Sprintf("%s by %s at %s", c.Def, c.By, time.UnixMilli(c.AtUnixMS).UTC().Format(time.RFC3339))
}

// Defined is what DefinePool did.
type Defined int

// DefinePool outcomes.
const (
	// Created: the pool was not defined; the worker's definition is.
	Created Defined = iota
	// Same: the stored definition agrees with the worker's.
	Same
	// Adopted: the stored definition, changed live, differs; the worker
	// runs with it.
	Adopted
	// Applied: the worker's definition was applied as a live change.
	Applied
)

// declared renders the part of a definition that can change live: the
// capacity (or its source) and the partitions, e.g. "capacity 2000
// records/s, 20 partitions".
func (p Pool) declared() string {
	p = p.withDefaults()
	if p.Source.On() {
		return fmt.Sprintf("%s, %d partitions", p.Source, p.Partitions)
	}
	return fmt.Sprintf("capacity %v %s/s, %d partitions", p.Capacity, p.Unit, p.Partitions)
}

// sameDeclared reports whether a and b declare the same live part: the
// same source and partitions, and for a number the same capacity (a
// source's capacity moves by itself).
func sameDeclared(a, b Pool) bool {
	a, b = a.withDefaults(), b.withDefaults()
	if a.Source != b.Source || a.Partitions != b.Partitions {
		return false
	}
	return a.Source.On() || a.Capacity == b.Capacity
}

// sameFixed reports whether a and b agree on what cannot change live: the
// unit, the lease TTL and the ramp.
func sameFixed(a, b Pool) bool {
	return a.Unit == b.Unit && a.TTL == b.TTL && a.Ramp == b.Ramp
}

// DefinePool is EnsurePool with a mode for a definition that differs from
// the stored one (see DefinitionMode). by names the worker (its ID) in the
// pool's change history, now is the time of the call, and lead is how far
// ahead an applied raise switches (see SetPool; e.g. a renewal interval).
// A definition that differs in what cannot change live (the unit, the
// lease TTL, the ramp) is refused in every mode. For a pool whose capacity
// comes from a source, the source's settings are compared, not the
// capacity it decided. It returns the definition in force and what was
// done, or an error wrapping ErrInvalidPool, ErrPoolMismatch (naming both
// definitions and what to do), ErrPoolFlapping (naming both deployments'
// definitions and the workers that applied them), ErrSwitchPending (an
// earlier change is still ahead; try again after it), or a Redis error.
// A peer's write between its read and its write is judged anew (8 tries,
// then an error wrapping ErrChangedConcurrently). With several
// independent Redis masters, call it for each.
func DefinePool(ctx context.Context, client redis.UniversalClient, prefix string, p Pool, mode DefinitionMode, by string, lead time.Duration, now time.Time) (Pool, Defined, error) {
	if _, err := ParseDefinitionMode(string(mode)); err != nil {
		return Pool{}, 0, fmt.Errorf("%w: pool %q: definition mode: %w", ErrInvalidPool, p.Name, err)
	}
	if err := p.Validate(); err != nil {
		return Pool{}, 0, err
	}
	p = p.withDefaults()
	if p.Source.On() && p.From == "" && p.Source.Kind == SourceProbe {
		p.From = "probing"
	}
	// A peer that writes between this read and this write (workers of one
	// rollout applying the same definition at once) makes the write lose
	// its compare-and-set: judge again against what the peer wrote, which
	// is most often this very definition (Same).
	for try := 1; ; try++ {
		inForce, outcome, err := definePool(ctx, client, prefix, p, mode, by, lead, now)
		if try == definePoolTries || !errors.Is(err, ErrChangedConcurrently) {
			return inForce, outcome, err
		}
	}
}

// definePoolTries bounds DefinePool's reads again after a lost
// compare-and-set: each loss means another writer succeeded, so a few
// suffice for any rollout.
const definePoolTries = 8

// definePool is one try of DefinePool: read (or create), judge, apply.
func definePool(ctx context.Context, client redis.UniversalClient, prefix string, p Pool, mode DefinitionMode, by string, lead time.Duration, now time.Time) (Pool, Defined, error) {
	key := keysOn(client, prefix, p.Name).def()
	created := p
	created.Changes = []Change{{By: by, Def: p.declared(), AtUnixMS: now.UnixMilli()}}
	stored, isNew, err := storeIfMissing(ctx, client, key, created)
	if err != nil {
		return Pool{}, 0, err
	}
	if isNew {
		return created, Created, nil
	}
	inForce, outcome, apply, err := judge(stored, p, mode, key)
	if !apply {
		return inForce, outcome, err
	}
	change := Change{By: by, Def: p.declared(), AtUnixMS: now.UnixMilli()}
	u := Update{Capacity: p.Capacity, Partitions: p.Partitions, Source: &p.Source, From: &p.From, Lead: lead, Change: &change,
		Check: func(stored Pool) error { return checkFlap(stored, change, now) }}
	if stored.Source.On() && p.Source == stored.Source {
		u.Capacity, u.From = 0, nil // the partitions alone changed: the source keeps its capacity
	}
	next, err := UpdatePool(ctx, client, prefix, p.Name, u, now)
	if err != nil {
		return Pool{}, 0, err
	}
	return next, Applied, nil
}

// judge decides what DefinePool does with p when Redis holds stored
// under key: run with stored (Same, or Adopted with DefinitionAdopt and a
// stored definition changed live), apply p as a live change (apply), or
// refuse with an error wrapping ErrPoolMismatch naming both.
func judge(stored, p Pool, mode DefinitionMode, key string) (inForce Pool, outcome Defined, apply bool, err error) {
	stored.Name = p.Name
	if !sameFixed(stored, p) {
		return Pool{}, 0, false, fmt.Errorf("%w: pool %q is defined in Redis (%s) with %s; this worker was started with %s (the unit, lease TTL and ramp cannot change while workers run: use another pool, or the same values)",
			ErrPoolMismatch, p.Name, key, stored, p)
	}
	if sameDeclared(stored, p) {
		return stored, Same, false, nil
	}
	switch mode {
	case DefinitionAdopt:
		if stored.Switch != nil || stored.Source.On() {
			return stored, Adopted, false, nil
		}
		fallthrough
	case DefinitionRefuse:
		return Pool{}, 0, false, fmt.Errorf("%w: pool %q is defined in Redis (%s) with %s; this worker was started with %s (apply it as a live change, or start the worker with the stored values)",
			ErrPoolMismatch, p.Name, key, stored, p)
	}
	return Pool{}, 0, true, nil
}

// checkFlap refuses a change that would change the pool back for the
// second time within FlapWindow: the history ends X (by one deployment),
// D (by another), X, and the change sets D again.
func checkFlap(stored Pool, c Change, now time.Time) error {
	var recent []Change
	for _, h := range stored.Changes {
		if now.Sub(time.UnixMilli(h.AtUnixMS)) <= FlapWindow {
			recent = append(recent, h)
		}
	}
	n := len(recent)
	if n < 3 {
		return nil
	}
	x, d, x2 := recent[n-3], recent[n-2], recent[n-1]
	if d.Def != c.Def || x.Def != x2.Def || x.Def == d.Def {
		return nil
	}
	return fmt.Errorf("%w: pool %q was changed to %s, back to %s, to %s again, and %s would change it back once more: two deployments keep disagreeing about the pool; give both the same capacity and partitions, or let one adopt the stored definition",
		ErrPoolFlapping, stored.Name, x, d, x2, c)
}

// storeIfMissing stores p under key unless a definition is there, and
// returns the one stored (p when it stored it).
func storeIfMissing(ctx context.Context, client redis.UniversalClient, key string, p Pool) (Pool, bool, error) {
	data, err := p.MarshalJSON()
	if err != nil {
		return Pool{}, false, err
	}
	for range 3 {
		set, err := client.SetNX(ctx, key, data, 0).Result()
		if err != nil {
			return Pool{}, false, fmt.Errorf("lease: store pool %q definition: %w", p.Name, err)
		}
		if set {
			return p, true, nil
		}
		stored, err := loadPool(ctx, client, key)
		if errors.Is(err, redis.Nil) {
			continue // deleted in between: try to store it again
		}
		return stored, false, err
	}
	return Pool{}, false, fmt.Errorf("lease: store pool %q definition: key %s keeps disappearing", p.Name, key)
}
