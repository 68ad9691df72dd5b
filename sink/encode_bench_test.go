package sink

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ingest"
)

// BenchmarkEncodeBatch encodes a batch of 100 records of 1 KiB for the
// wire, as every write to the emulator's protocol does.
func BenchmarkEncodeBatch(b *testing.B) {
	batch := make([]ingest.Record, 100)
	for i := range batch {
		id := fmt.Sprintf("nc%08d", i)
		head := fmt.Sprintf(`{"id":%q,"mag":1.2,"place":"12 km SW of Somewhere, CA","pad":"`, id)
		batch[i] = ingest.Record{ID: id, Cost: 1, Value: []byte(head + strings.Repeat("x", 1024-len(head)-2) + `"}`)}
	}
	b.ReportAllocs()
	b.SetBytes(100 * 1024)
	for b.Loop() {
		encodeBatch(batch, false)
	}
}
