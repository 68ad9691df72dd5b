package sink_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink"
)

// BenchmarkRESTSinkWrite measures unthrottled writes through the REST sink
// to an httptest API that answers 201 (one client, one write at a time):
// one request per record in writes of 1, 25, 100 or 500 records (16
// requests in flight), and a JSON array of 25, 100 or 500 records per
// request:
// go test -run '^$' -bench RESTSinkWrite ./sink/
func BenchmarkRESTSinkWrite(b *testing.B) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	b.Cleanup(api.Close)
	value := []byte(`{"id":"ci41234567","mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`)
	for _, tc := range []struct {
		name  string
		size  int
		array bool
	}{
		{"batch=1", 1, false}, {"batch=25", 25, false}, {"batch=100", 100, false}, {"batch=500", 500, false},
		{"array,batch=25", 25, true}, {"array,batch=100", 100, true}, {"array,batch=500", 500, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			target := api.URL + "/v1/quakes/{id}"
			if tc.array {
				target = api.URL + "/v1/quakes"
			}
			s, err := sink.NewREST(sink.RESTConfig{URL: target, Method: http.MethodPut, Array: tc.array})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			n := 0
			for b.Loop() {
				batch := make([]ingest.Record, tc.size)
				for i := range batch {
					n++
					batch[i] = ingest.Record{ID: fmt.Sprintf("r%09d", n), Value: value, Cost: 1}
				}
				res, err := s.Write(b.Context(), batch)
				if err != nil {
					b.Fatal(err)
				}
				if res[0].Outcome != ingest.Delivered {
					b.Fatal(res[0].Reason)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
