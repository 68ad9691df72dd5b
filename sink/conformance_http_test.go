package sink

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func TestHTTPConformance(t *testing.T) {
	t.Parallel()
	conformance{
		// The emulator, generous enough never to throttle these batches.
		open: func(t *testing.T) ingest.Sink {
			sim, err := NewSim(SimConfig{Capacity: 1_000_000, RequiredFields: []string{"mag"}})
			require.NoError(t, err)
			return serve(t, sim.Handler(), 0)
		},
		// The emulator's own throttling: its bucket is spent first.
		retryable: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			t.Helper()
			_, err := s.Write(t.Context(), []ingest.Record{{ID: "spend", Value: []byte(`{"mag":1}`), Cost: 1_000_000}})
			require.NoError(t, err)
			return s, []ingest.Record{{ID: "r", Value: []byte(`{"mag":1}`), Cost: 1_000_000}}
		},
	}.run(t)
}
