package sink_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink/sinktest"
	"github.com/sluicehq/sluice/sinksim"
)

func TestHTTPConformance(t *testing.T) {
	t.Parallel()
	sinktest.Suite{
		// The emulator, generous enough never to throttle these batches.
		Open: func(t *testing.T) ingest.Sink {
			sim, err := sinksim.New(sinksim.Config{Capacity: 1_000_000, RequiredFields: []string{"mag"}})
			require.NoError(t, err)
			return serve(t, sim.Handler(), 0)
		},
		// The emulator's injected failures: it answers half the records
		// (the same ones in every run) 503 and stores the others.
		Retryable: func(t *testing.T, _ ingest.Sink) (ingest.Sink, []ingest.Record) {
			sim, err := sinksim.New(sinksim.Config{Capacity: 1_000_000, RequiredFields: []string{"mag"}, ErrorRate: 0.5, Seed: 7})
			require.NoError(t, err)
			batch := make([]ingest.Record, 10)
			for i := range batch {
				batch[i] = ingest.Record{ID: fmt.Sprintf("r%d", i), Value: []byte(`{"mag":1}`), Cost: 1}
			}
			return serve(t, sim.Handler(), 0), batch
		},
		// The emulator's own throttling: its bucket is spent first, and
		// it answers 429 for the record that does not fit.
		Throttled: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
			t.Helper()
			_, err := s.Write(t.Context(), []ingest.Record{{ID: "spend", Value: []byte(`{"mag":1}`), Cost: 1_000_000}})
			require.NoError(t, err)
			return s, []ingest.Record{{ID: "r", Value: []byte(`{"mag":1}`), Cost: 1_000_000}}
		},
		// An endpoint that refuses the credentials: 401 for every request.
		Down: func(t *testing.T) ingest.Sink {
			return serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, `{"error":"invalid token"}`, http.StatusUnauthorized)
			}), 0)
		},
	}.Run(t)
}
