package api_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/recordtype"
)

// printProducer stands in for the Kafka producer (queue.Producer): it
// prints what it would append to the topic.
type printProducer struct{}

func (printProducer) Produce(_ context.Context, topic string, recs []ingest.Record) error {
	for _, r := range recs {
		fmt.Printf("produce to %s: id %s\n", topic, r.ID)
	}
	return nil
}

// An upstream producer posts a batch of two earthquakes as NDJSON. Every
// record is validated against its type's schema before any is produced;
// the answer names the records accepted.
func Example() {
	types, err := recordtype.Load(filepath.Join("..", "examples", "types.yaml"))
	if err != nil {
		fmt.Println(err)
		return
	}
	h, err := api.New(api.Config{
		Types:    types,
		Producer: printProducer{},
		Tokens:   map[[32]byte][]string{api.HashToken("s3cret"): {"earthquake"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	body := `{"id":"nc75191211","time":"2025-05-01T00:02:11Z","place":"7 km NW of The Geysers, CA"}
{"id":"ak025a1b2c3","time":"2025-05-01T00:03:40Z","place":"52 km SE of Denali, Alaska"}
`
	req := httptest.NewRequest(http.MethodPost, "/v1/records/earthquake", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer s3cret")
	req.Header.Set("Content-Type", "application/x-ndjson")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)

	answer, _ := io.ReadAll(w.Result().Body)
	fmt.Println(w.Code, strings.TrimSpace(string(answer)))
	// Output:
	// produce to earthquakes: id nc75191211
	// produce to earthquakes: id ak025a1b2c3
	// 202 {"accepted":2,"ids":["nc75191211","ak025a1b2c3"]}
}
