package sink_test

import (
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
		// The emulator's own throttling: its bucket is spent first.
		Retryable: func(t *testing.T, s ingest.Sink) (ingest.Sink, []ingest.Record) {
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
