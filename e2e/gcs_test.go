//go:build e2e

package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
)

// gcsEndpoint is the Cloud Storage emulator (fake-gcs-server) that make
// e2e starts with scripts/gcs.sh.
var gcsEndpoint = cmp.Or(os.Getenv("SLUICE_E2E_GCS_URL"), "http://127.0.0.1:"+cmp.Or(os.Getenv("SLUICE_GCS_PORT"), "14443"))

// gcsUnits counts uploads of objects (the JSON API's POST /upload/...).
func gcsUnits(r *http.Request, _ []byte) int64 {
	if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/upload/storage/v1/b/") {
		return 1
	}
	return 0
}

// The USGS file into fake-gcs-server twice, one object per record named by
// a hash-prefix:2 sink key (the names Cloud Storage's request-rate
// guidance asks for), uploads as the pool's unit: 9,366 objects spread
// over the 256 two-hex-digit prefixes, each stored once (the second run's
// uploads answer 412 to ifGenerationMatch=0).
func TestBulkLoadIntoGCSTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 200, 4, 5*time.Second)
	m := newMeter(t, gcsEndpoint, gcsUnits)
	bucket := fmt.Sprintf("e2e-quakes-%d", rand.IntN(1_000_000))
	sinkURL := "gs://" + bucket + "/quakes?create_bucket=true&endpoint=" + url.QueryEscape(m.srv.URL)
	loadTwice(t, e, m, sinkURL, "--sink-key", "{id}", "--sink-key-strategy", "hash-prefix:2")

	client, err := storage.NewClient(t.Context(), option.WithEndpoint(gcsEndpoint+"/storage/v1/"), option.WithoutAuthentication())
	require.NoError(t, err)
	defer client.Close()
	prefixes := map[string]int{}
	objects, sample := 0, ""
	it := client.Bucket(bucket).Objects(t.Context(), &storage.Query{Prefix: "quakes/"})
	for {
		o, err := it.Next()
		if err == iterator.Done {
			break
		}
		require.NoError(t, err)
		objects++
		sample = o.Name
		name := strings.TrimPrefix(o.Name, "quakes/")
		require.Regexp(t, `^[0-9a-f]{2}/[a-z0-9]+\.json$`, name)
		prefixes[name[:2]]++
	}
	require.Equal(t, usgsRecords, objects, "objects in the bucket")
	busiest := 0
	for _, n := range prefixes {
		busiest = max(busiest, n)
	}
	t.Logf("%d objects over %d prefixes, the fullest with %d", objects, len(prefixes), busiest)
	require.Len(t, prefixes, 256, "the names reach every two-hex-digit prefix")

	// One object holds its record's JSON.
	r, err := client.Bucket(bucket).Object(sample).NewReader(t.Context())
	require.NoError(t, err)
	defer r.Close()
	var rec map[string]any
	require.NoError(t, json.NewDecoder(r).Decode(&rec))
	require.Contains(t, rec, "mag")
}
