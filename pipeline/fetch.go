package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/ingest"
)

// maxLetterBacklog is how many records may wait for the dead-letter topic
// before the fetcher pauses: while the topic is unreachable, the records
// already fetched are still delivered, and no more are taken.
const maxLetterBacklog = 1000

// rawQueue is how many fetched records may wait for prepare.
const rawQueue = 256

// fetch reads the source while the in-flight bound has room, fewer than
// the prefetch target are waiting, and the dead letters keep up, and hands
// what it reads to prepareAll through raw, which it closes when it
// returns. The two run side by side, so reading the queue and checking
// records (a pass over every byte) use two cores when there are two.
func (p *Pipeline) fetch(ctx context.Context, raw chan<- *item) {
	defer close(raw)
	if p.cfg.Start != nil {
		select {
		case <-p.cfg.Start:
		case <-ctx.Done():
			return
		}
	}
	for {
		for int64(len(p.fetched)+len(raw)) >= max(p.prefetch.Load(), 1) || p.letters.len() >= maxLetterBacklog || !p.inFlight.room() {
			if p.inFlight.held.Load() {
				// As far as it can fill: a slice waiting to settle
				// need not wait longer.
				p.signalFilled()
			}
			select {
			case <-p.wake:
			case <-p.inFlight.freed:
			case <-ctx.Done():
				return
			}
		}
		p.demand.fetchingSince.Store(time.Now().UnixNano())
		rec, err := p.p.Source.Fetch(ctx)
		p.demand.fetchingSince.Store(0)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.fetchFailing.CompareAndSwap(0, time.Now().UnixNano())
			p.fetchErrLog.Do(func() { p.log.Error("fetch failed, retrying", "err", err) })
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
			continue
		}
		p.fetchFailing.Store(0)
		p.c.NoteFetch(time.Now())
		p.demand.started.Store(true)
		it := &item{rec: rec, bytes: recordBytes(rec)}
		p.inFlight.add(it.bytes)
		raw <- it // never blocks long: prepareAll keeps up or the bound stops the fetcher
	}
}

// prepareAll prepares the records fetch reads, in their order, into
// p.fetched, until raw is closed.
func (p *Pipeline) prepareAll(raw <-chan *item) {
	for it := range raw {
		p.prepare(it)
		p.demand.fetched.Add(it.rec.Cost)
		p.fetched <- it
		if n := len(p.fetched); int64(n) >= p.prefetch.Load() || n+1 >= p.cfg.MaxBatch {
			// The prefetch target, or a batch, for a slice topping up.
			p.signalFilled()
		}
	}
}

// signalFilled tells a settling slice that the fetcher has filled what it
// may.
func (p *Pipeline) signalFilled() {
	select {
	case p.filled <- struct{}{}:
	default:
	}
}

// prepare validates a fetched record and sets its ID and cost.
func (p *Pipeline) prepare(it *item) {
	rec := it.rec
	rec.Cost, it.base = p.price(rec.Value)
	// One pass over the raw bytes checks the value is a JSON object and
	// reads its ID field; nothing is decoded unless a Processor asks.
	field := p.cfg.IDField
	if rec.ID != "" {
		field = ""
	}
	id, err := ingest.ScanObject(rec.Value, field)
	switch {
	case errors.Is(err, ingest.ErrNotObject):
		it.invalid = fmt.Sprintf("%s: value is %v", describe(rec), err)
	case err != nil:
		it.invalid = fmt.Sprintf("%s: %v", describe(rec), err)
	}
	if rec.ID == "" {
		if id == "" {
			id = ingest.ContentID(rec.Value)
		}
		rec.ID = id
	}
	if p.cfg.Processor != nil && it.invalid == "" {
		out, err := p.cfg.Processor.Process(rec)
		if err != nil {
			it.invalid = fmt.Sprintf("%s: %v", describe(rec), err)
		} else {
			rec = out
			rec.Cost, it.base = p.price(rec.Value)
		}
	}
	if p.cfg.MaxRecordCost > 0 && rec.Cost > p.cfg.MaxRecordCost {
		it.invalid = fmt.Sprintf("%s costs %d %s, more than one second of the whole pool (%d)",
			describe(rec), rec.Cost, p.cfg.Pricing.Unit, p.cfg.MaxRecordCost)
	}
	it.rec = rec
}

// price returns the record's cost: its base price by the pricing rule,
// scaled by what the sink has been charging per unit of base price when it
// reports charges, so that estimates follow the sink's real rule and the
// corrections stay small.
func (p *Pipeline) price(value []byte) (cost, base int64) {
	base = p.cfg.Pricing.Price(value)
	cost = base
	if f := p.charges.factor(); f != 1 {
		cost = max(int64(math.Ceil(f*float64(base)-1e-9)), 1)
	}
	return cost, base
}
