package pipeline

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/ingest"
)

// recordBytes is what rec counts against the in-flight byte budget.
func recordBytes(rec ingest.Record) int64 {
	return int64(len(rec.Key)+len(rec.Value)+len(rec.ID)) + ingest.RecordOverhead
}

// inFlight counts the records fetched and not finished, and their bytes
// (recordBytes). The fetcher waits while it is full; a record may take it
// past its byte bound by its own size, never more (its size is known only
// once it is fetched).
type inFlight struct {
	maxBytes, maxRecords int64 // maxRecords 0: no bound of its own

	mu      sync.Mutex
	bytes   int64
	records int64
	waiting bool          // the fetcher waits for room
	freed   chan struct{} // poked when room is made while the fetcher waits
	held    atomic.Bool   // the fetcher is waiting for room (read by settle)
}

func (f *inFlight) init(maxBytes, maxRecords int64) {
	f.maxBytes, f.maxRecords = maxBytes, maxRecords
	f.freed = make(chan struct{}, 1)
}

// room reports whether one more record may be fetched; if not, it marks
// the fetcher waiting, so the next release pokes freed.
func (f *inFlight) room() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ok := f.bytes < f.maxBytes && (f.maxRecords == 0 || f.records < f.maxRecords)
	f.waiting = !ok
	f.held.Store(!ok)
	return ok
}

// add counts a fetched record of n bytes.
func (f *inFlight) add(n int64) {
	f.mu.Lock()
	f.bytes += n
	f.records++
	f.mu.Unlock()
}

// release uncounts a finished record of n bytes.
func (f *inFlight) release(n int64) {
	f.mu.Lock()
	f.bytes -= n
	f.records--
	poke := f.waiting
	f.waiting = false
	f.mu.Unlock()
	if poke {
		select {
		case f.freed <- struct{}{}:
		default:
		}
	}
}

// load returns the records and bytes in flight.
func (f *inFlight) load() (records, bytes int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.records, f.bytes
}
