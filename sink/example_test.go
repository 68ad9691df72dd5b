package sink_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink"
	"github.com/sluicehq/sluice/sinksim"
)

func ExamplePolicy() {
	p := sink.Policy{Rand: func() float64 { return 0.5 }} // defaults, jitter factor 1.0
	for attempt := 1; ; attempt++ {
		wait, ok := p.Backoff(attempt, 0)
		if !ok {
			fmt.Printf("after attempt %d: give up\n", attempt)
			break
		}
		fmt.Printf("after attempt %d: wait %v\n", attempt, wait)
	}
	wait, _ := p.Backoff(1, 2e9)
	fmt.Println("with Retry-After 2s:", wait)
	// Output:
	// after attempt 1: wait 100ms
	// after attempt 2: wait 300ms
	// after attempt 3: wait 700ms
	// after attempt 4: wait 1.5s
	// after attempt 5: wait 3.1s
	// after attempt 6: wait 5s
	// after attempt 7: wait 5s
	// after attempt 8: give up
	// with Retry-After 2s: 2s
}

func ExampleSim() {
	sim, err := sinksim.New(sinksim.Config{Capacity: 2, RequiredFields: []string{"mag"}})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()
	client, err := sink.NewHTTP(sink.HTTPConfig{URL: srv.URL})
	if err != nil {
		panic(err)
	}
	results, err := client.Write(context.Background(), []ingest.Record{
		{ID: "nc1", Value: []byte(`{"mag": 2.1}`), Cost: 1},
		{ID: "nc1", Value: []byte(`{"mag": 2.1}`), Cost: 1},
		{ID: "nc2", Value: []byte(`{"depth": 7}`), Cost: 1},
		{ID: "nc3", Value: []byte(`{"mag": 0.4}`), Cost: 1},
	})
	if err != nil {
		panic(err)
	}
	for _, r := range results {
		fmt.Println(strings.TrimSpace(fmt.Sprintln(r.Outcome, r.Throttled, r.RetryAfter, r.Reason)))
	}
	st := sim.Stats()
	fmt.Println("accepted", st.Accepted, "duplicates", st.Duplicates, "max units in 1s", st.MaxUnits1s)
	// Output:
	// delivered false 0s
	// duplicate false 0s
	// permanent false 0s HTTP 400: missing required field "mag"
	// retryable true 500ms HTTP 429: throttled: capacity exhausted
	// accepted 1 duplicates 1 max units in 1s 2
}
