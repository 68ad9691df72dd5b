package sink_test

import (
	"fmt"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink"
)

// Where the Azure Table Storage sink stores records: the given partition
// key, else the sink key's first segment, else a hash bucket of the ID; the
// RowKey is the sink key with '/', '\', '#', '?' and '%' percent-encoded.
func ExampleAzurePartitionKey() {
	fmt.Println(sink.AzurePartitionKey(ingest.Record{ID: "us7000abcd", SinkKey: "2025-05/us7000abcd"}))
	fmt.Println(sink.AzurePartitionKey(ingest.Record{ID: "us7000abcd", PartitionKey: "west"}))
	fmt.Println(sink.EscapeAzureKey("2025-05/us7000abcd"))
	// Output:
	// 2025-05
	// west
	// 2025-05%2Fus7000abcd
}

// The --sink URL's scheme selects the sink; CheckURL names what is missing.
func ExampleCheckURL() {
	for _, u := range []string{
		"http://127.0.0.1:8088",
		"postgres://sluice@127.0.0.1:15432/app?table=quakes",
		"postgres://sluice@127.0.0.1:15432/app",
		"azuretables://127.0.0.1:10102/devstoreaccount1?table=quakes",
	} {
		fmt.Println(sink.CheckURL(u))
	}
	// Output:
	// <nil>
	// <nil>
	// sink URL: "postgres://sluice@127.0.0.1:15432/app" needs ?table=<name>
	// <nil>
}
