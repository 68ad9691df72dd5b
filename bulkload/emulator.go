package bulkload

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sinkwire"
)

// EmulatorStats is the sink emulator's statistics (`sluice sink-sim`, the
// http:// and https:// sinks): its counts, and its 200 ms series, from
// which a load at an emulator that served others before reports its own
// peaks (see Summary.SinkStatsScope).
type EmulatorStats struct {
	ingest.StatsSink
	// URL is the emulator's base URL, as --sink gives it.
	URL string
	// Client reads the series; default http.DefaultClient.
	Client *http.Client
}

var _ SeriesSink = EmulatorStats{}

// Series implements SeriesSink: GET /v1/stats?series=1.
func (e EmulatorStats) Series(ctx context.Context) (time.Time, []int64, error) {
	client := e.Client
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(e.URL, "/")+sinkwire.PathStats+"?series=1", nil)
	if err != nil {
		return time.Time{}, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("bulkload: the emulator's series: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Time{}, nil, fmt.Errorf("bulkload: the emulator's series: HTTP %d", resp.StatusCode)
	}
	var st sinkwire.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return time.Time{}, nil, fmt.Errorf("bulkload: the emulator's series: %w", err)
	}
	if st.SeriesStart.IsZero() {
		return time.Time{}, nil, fmt.Errorf("bulkload: the emulator reports no series")
	}
	return st.SeriesStart, st.UnitsPer200ms, nil
}
