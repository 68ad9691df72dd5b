//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bulkload"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/recordtype"
)

// typed is a world with two record types, each with its own topic, pool and
// sink emulator (provisioned at its pool's capacity), behind sluice api.
type typed struct {
	*env
	types   string // the types file
	api     string // base URL
	sims    map[string]*env
	records map[string]int // records to post per type
}

// Two record types: "fast" draws from a 600 records/s pool, "slow" from a
// 300 records/s pool; each is written to its own emulator.
func newTyped(t *testing.T) *typed {
	e := newEnv(t, 600, 6, 5*time.Second)
	slow := &env{t: t, name: e.name + "-slow", redis: redisAddr, capacity: 300, parts: 3, ttl: 5 * time.Second}
	slow.startSim()
	w := &typed{env: e, sims: map[string]*env{"fast": e, "slow": slow}, records: map[string]int{"fast": 3000, "slow": 1500}}
	schema, err := filepath.Abs("../examples/earthquake.schema.json")
	require.NoError(t, err)
	var types bytes.Buffer
	fmt.Fprintf(&types, "pools:\n")
	for _, name := range []string{"fast", "slow"} {
		sim := w.sims[name]
		fmt.Fprintf(&types, "  %s: {capacity: %d, partitions: %d, lease_ttl: %s}\n", sim.name, sim.capacity, sim.parts, sim.ttl)
	}
	fmt.Fprintf(&types, "types:\n")
	for _, name := range []string{"fast", "slow"} {
		sim := w.sims[name]
		fmt.Fprintf(&types, "  %s:\n    topic: %s-topic\n    pool: %s\n    id_field: id\n    schema: %s\n    sink: %s\n    enrich: [ingested_at]\n",
			name, sim.name, sim.name, schema, sim.sim)
	}
	dir := t.TempDir()
	w.types = filepath.Join(dir, "types.yaml")
	require.NoError(t, os.WriteFile(w.types, types.Bytes(), 0o600))
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("e2e-secret fast,slow\n"), 0o600))
	addr := freeAddr(t)
	e.start("api", "api", "--brokers", brokers, "--listen", addr, "--types", w.types, "--tokens-file", tokens)
	w.api = "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := http.Get(w.api + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "sluice api did not start")
	return w
}

// worker starts a worker process serving the comma-separated types. These
// cases post to the API while the workers drain, so the two cores also run
// the API, its producer and the broker's writes: a 60 ms send guard (the
// pacer's allowance for send-to-accept jitter) keeps a late request from
// sharing a sliding second at the sink with the next five slices.
func (w *typed) worker(id, types string) {
	w.start(id, "worker", "--worker-id", id, "--brokers", brokers, "--redis-addr", w.redis, "--types", w.types, "--type", types, "--send-guard", "60ms")
}

// awaitGroups waits until each type's consumer group has a member.
func (w *typed) awaitGroups() {
	for _, sim := range w.sims {
		require.Eventually(w.t, func() bool {
			ctx, cancel := context.WithTimeout(w.t.Context(), 5*time.Second)
			defer cancel()
			members, stable, err := queue.GroupMembers(ctx, []string{brokers}, "sluice-"+sim.name+"-topic")
			return err == nil && stable && members == 1
		}, 60*time.Second, 100*time.Millisecond, "the group of %s did not settle", sim.name)
	}
}

// post posts the first records of the USGS file to the API, 100 a request
// as NDJSON, for both types at once.
func (w *typed) post() {
	w.t.Helper()
	errc := make(chan error, len(w.records))
	for name, n := range w.records {
		go func() { errc <- w.postType(name, n) }()
	}
	for range w.records {
		require.NoError(w.t, <-errc)
	}
}

func (w *typed) postType(typ string, n int) error {
	types, err := recordtype.Load(w.types)
	if err != nil {
		return err
	}
	// The CSV fields as the type's schema declares them (mag a number).
	file, err := bulkload.Open([]string{usgs}, bulkload.InputConfig{Format: "csv", IDField: "id",
		CSV: bulkload.CSVTypes{Columns: types[typ].FieldTypes()}})
	if err != nil {
		return err
	}
	defer file.Close()
	var batch bytes.Buffer
	flush := func() error {
		req, _ := http.NewRequest(http.MethodPost, w.api+"/v1/records/"+typ, bytes.NewReader(batch.Bytes()))
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Authorization", "Bearer e2e-secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("POST %s: %s: %s", typ, resp.Status, body)
		}
		batch.Reset()
		return nil
	}
	for i := range n {
		rec, err := file.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		batch.Write(rec.Value)
		batch.WriteByte('\n')
		if (i+1)%100 == 0 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if batch.Len() > 0 {
		return flush()
	}
	return nil
}

// check waits for every type's records at its sink and checks each sink
// against its own pool: every record once, no sliding second over the
// pool's capacity, and the pool's capacity used while its backlog lasted.
func (w *typed) check() {
	for name, sim := range w.sims {
		st := sim.awaitAccepted(int64(w.records[name]), 60*time.Second)
		w.t.Logf("type %s:", name)
		sim.report(st)
		require.EqualValues(w.t, w.records[name], st.Accepted, "type %s: every record at its sink", name)
		require.Zero(w.t, st.Duplicates, "type %s: every record once", name)
		elapsed := st.LastChargeAt.Sub(st.FirstChargeAt).Seconds()
		ideal := float64(w.records[name]) / float64(sim.capacity)
		w.t.Logf("type %s: utilization of its pool %.2f s / %.2f s = %.3f", name, ideal, elapsed, ideal/elapsed)
		require.GreaterOrEqual(w.t, ideal/elapsed, 0.85, "type %s drew its own pool's capacity", name)
	}
}

// Records posted to the API for two types, drained by two workers each
// serving one type: every record once at its type's sink.
func TestAPIRecordsOfTwoTypesDrainedByTheirWorkers(t *testing.T) {
	w := newTyped(t)
	w.worker("fast-worker", "fast")
	w.worker("slow-worker", "slow")
	w.awaitGroups()
	require.Equal(t, http.StatusOK, w.get("/readyz").StatusCode, "the broker is reachable")
	w.post()
	w.check()
	resp := w.get("/metrics")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for typ, n := range w.records {
		require.Contains(t, string(body), fmt.Sprintf("sluice_api_records_accepted_total{type=%q} %d", typ, n))
	}
}

// get GETs an API path; the body is closed at cleanup.
func (w *typed) get(path string) *http.Response {
	w.t.Helper()
	resp, err := http.Get(w.api + path)
	require.NoError(w.t, err)
	w.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// One worker serving both types: each type drains at its own pool's rate,
// independently of the other.
func TestOneWorkerServesTwoTypesFromTwoPools(t *testing.T) {
	w := newTyped(t)
	w.worker("both", "fast,slow")
	w.awaitGroups()
	w.post()
	w.check()
}
