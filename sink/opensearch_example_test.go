package sink_test

import (
	"fmt"

	"github.com/sluicehq/sluice/sink"
)

// The Cloud Storage and OpenSearch sinks' URLs: the bucket and prefix, the
// node and index; credentials never come from the URL.
func ExampleCheckURL_gcsAndOpenSearch() {
	for _, u := range []string{
		"gs://quakes/2025-05?layout=batch&gzip=true",
		"gs://quakes/2025-05?create_bucket=true",
		"opensearchs://search.example.com/quakes?action=index&max_bytes=10MiB",
		"elasticsearch://127.0.0.1:9200/quakes",
		"opensearch://127.0.0.1:9200/quakes?max_bytes=200MiB",
	} {
		fmt.Println(sink.CheckURL(u))
	}
	// Output:
	// <nil>
	// sink URL: "gs://quakes/2025-05?create_bucket=true": create_bucket=true needs project=<project ID>
	// <nil>
	// <nil>
	// sink URL: "opensearch://127.0.0.1:9200/quakes?max_bytes=200MiB": max_bytes=200MiB: want 1 to 100MiB (bytes, or a number with a KiB or MiB suffix)
}
