package bench

import (
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
)

// pool is a capacity pool's definition, named per trial.
type pool struct {
	capacity   float64 // units/s
	unit       ingest.Unit
	partitions int
	ttl        time.Duration // default 15 s
}

func (p pool) lease(name string) lease.Pool {
	return lease.Pool{Name: name, Capacity: p.capacity, Unit: p.unit, Partitions: p.partitions, TTL: p.ttl}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
