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
		"rest+https://api.example.com/v1/quakes/{id}?net={net}",
		"rest+https://{net}.example.com/v1/quakes",
	} {
		fmt.Println(sink.CheckURL(u))
	}
	// Output:
	// <nil>
	// <nil>
	// sink URL: "postgres://sluice@127.0.0.1:15432/app" needs ?table=<name>
	// <nil>
	// <nil>
	// sink URL: url "https://{net}.example.com/v1/quakes": placeholders go in the path or query, never the host; credentials never in the URL
}

// The record fields a REST sink's URL and body templates read, which a
// bulk load finds in the file's columns before it produces anything.
func ExampleTemplateFields() {
	urlFields, bodyFields, err := sink.TemplateFields("rest+https://api.example.com/v1/{net}/quakes/{id}",
		`{"magnitude": "{mag}", "title": "M{mag} {place}", "source": "{$record}"}`)
	fmt.Println(urlFields, bodyFields, err)
	// Output:
	// [net id] [mag place] <nil>
}
