package sink

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/data/aztables"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/sink/sinktest"
)

// azuriteKey is the Azure Storage emulator's well-known development account
// key, published by Microsoft for devstoreaccount1; not a secret.
const azuriteKey = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

// azuriteURL is the --sink prefix of a real Azurite Table service,
// "azuretables://127.0.0.1:<port>/devstoreaccount1": SLUICE_TEST_AZURITE_URL,
// or the one scripts/azurite.sh starts (idempotent; the Makefile stops it).
func azuriteURL(t testing.TB) string {
	t.Helper()
	return azuriteService.URL(t)
}

func openAzure(t testing.TB) *AzureTablesSink {
	t.Helper()
	service := "http://" + strings.TrimPrefix(azuriteURL(t), "azuretables://")
	s, err := NewAzureTables(t.Context(), AzureTablesConfig{ServiceURL: service, Account: "devstoreaccount1", Key: azuriteKey, Table: strings.ReplaceAll(freshTable("t"), "_", "")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// azureAnswer is the Table service's JSON error answer with code and
// status, as the service sends it.
func azureAnswer(status int, code, message string) serverAnswer {
	return serverAnswer{status: status,
		header: http.Header{"Content-Type": {"application/json;odata=minimalmetadata;streaming=true;charset=utf-8"}, "X-Ms-Error-Code": {code}},
		body:   `{"odata.error":{"code":"` + code + `","message":{"lang":"en-US","value":"` + message + `\nRequestId:8ab5c6a4-0002-0000-0000-000000000000"}}}`}
}

// azureThrough is a sink on a fresh table of Azurite through a proxy that
// answers the entity-group transactions of partition marker with answer,
// as the Table service answers under load, and forwards the other
// requests to Azurite. At the test's end it checks that the table holds
// the records of azureMixed's other partition, and none of marker's.
func azureThrough(t *testing.T, marker string, answer serverAnswer) *AzureTablesSink {
	t.Helper()
	service := "http://" + strings.TrimPrefix(azuriteURL(t), "azuretables://")
	u, err := url.Parse(service)
	require.NoError(t, err)
	p := newAnswerProxy(t, u.Scheme+"://"+u.Host, func(r *http.Request, body []byte) (serverAnswer, bool) {
		return answer, strings.HasSuffix(r.URL.Path, "/$batch") && bytes.Contains(body, []byte(`"PartitionKey":"`+marker+`"`))
	})
	s, err := NewAzureTables(t.Context(), AzureTablesConfig{ServiceURL: p.url + u.Path, Account: "devstoreaccount1", Key: azuriteKey, Table: strings.ReplaceAll(freshTable("t"), "_", "")})
	require.NoError(t, err)
	t.Cleanup(func() {
		defer s.Close()
		require.Positive(t, p.answered.Load(), "the proxy answered no request itself")
		var stored []string
		pager := s.client.NewListEntitiesPager(nil)
		for pager.More() {
			page, err := pager.NextPage(context.Background())
			require.NoError(t, err)
			for _, e := range page.Entities {
				var ent struct{ ID string }
				require.NoError(t, json.Unmarshal(e, &ent))
				stored = append(stored, ent.ID)
			}
		}
		require.ElementsMatch(t, []string{"cold-0", "cold-1", "cold-2"}, stored, "the transaction forwarded is stored, the answered one is not")
	})
	return s
}

// azureMixed is 3 records in partition "cold" and 2 in partition marker:
// two entity-group transactions.
func azureMixed(marker string) []ingest.Record {
	rec := func(id, pk string) ingest.Record {
		return ingest.Record{ID: id, PartitionKey: pk, Value: []byte(`{"mag":1}`), Cost: 1}
	}
	return []ingest.Record{rec("cold-0", "cold"), rec(marker+"-0", marker), rec("cold-1", "cold"), rec(marker+"-1", marker), rec("cold-2", "cold")}
}

// Azurite does not throttle nor fail a transaction on demand, so the
// retryable and throttled cases put a proxy in front of it that answers
// the transactions of chosen partitions as the Table service does — 500
// OperationTimedOut; 503 ServerBusy — and forwards the others, which
// Azurite stores. A stopped server (nothing listens) is a failure of the
// whole write.
func TestAzureTablesConformance(t *testing.T) {
	t.Parallel()
	sinktest.Suite{
		Open:   func(t *testing.T) ingest.Sink { return openAzure(t) },
		Upsert: true,
		Retryable: func(t *testing.T, _ ingest.Sink) (ingest.Sink, []ingest.Record) {
			fail := azureAnswer(http.StatusInternalServerError, "OperationTimedOut", "Operation could not be completed within the specified time.")
			return azureThrough(t, "fail", fail), azureMixed("fail")
		},
		Throttled: func(t *testing.T, _ ingest.Sink) (ingest.Sink, []ingest.Record) {
			busy := azureAnswer(http.StatusServiceUnavailable, "ServerBusy", "The server is busy.")
			return azureThrough(t, "hot", busy), azureMixed("hot")
		},
		// A wrong account key: every request is refused with 403.
		Down: func(t *testing.T) ingest.Sink {
			cred, err := aztables.NewSharedKeyCredential("devstoreaccount1", "d3Jvbmcga2V5")
			require.NoError(t, err)
			transport := &http.Transport{}
			opts := &aztables.ClientOptions{}
			opts.Retry = policy.RetryOptions{MaxRetries: -1}
			opts.Transport = &http.Client{Transport: transport}
			svc, err := aztables.NewServiceClientWithSharedKey("http://"+strings.TrimPrefix(azuriteURL(t), "azuretables://"), cred, opts)
			require.NoError(t, err)
			s := &AzureTablesSink{client: svc.NewClient("conformance"), transport: transport, timeout: 2 * time.Second}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		// Nothing listens on the port: the transport fails.
		Stopped: func(t *testing.T) ingest.Sink {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			addr := ln.Addr().String()
			require.NoError(t, ln.Close())
			cred, err := aztables.NewSharedKeyCredential("devstoreaccount1", azuriteKey)
			require.NoError(t, err)
			opts := &aztables.ClientOptions{}
			opts.Retry = policy.RetryOptions{MaxRetries: -1}
			transport := &http.Transport{}
			opts.Transport = &http.Client{Transport: transport}
			svc, err := aztables.NewServiceClientWithSharedKey("http://"+addr+"/devstoreaccount1", cred, opts)
			require.NoError(t, err)
			s := &AzureTablesSink{client: svc.NewClient("stopped"), transport: transport, timeout: 2 * time.Second}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		// A string property over Table Storage's 64 KiB limit.
		Bad: func(id string) ingest.Record {
			return ingest.Record{ID: id, Value: []byte(`{"pad":"` + strings.Repeat("x", 70<<10) + `"}`), Cost: 1}
		},
	}.Run(t)
}

func TestAzureTablesKeysAndGrouping(t *testing.T) {
	t.Parallel()
	s := openAzure(t)
	batch := make([]ingest.Record, 0, 250)
	for i := range 250 { // 250 records in 2 partitions: 3 transactions at least
		batch = append(batch, ingest.Record{ID: fmt.Sprintf("id-%d", i), SinkKey: fmt.Sprintf("part%d/row#%d", i%2, i), Value: []byte(`{"mag":1}`)})
	}
	batch = append(batch, batch[0]) // repeated in the batch
	res, err := s.Write(t.Context(), batch)
	require.NoError(t, err)
	for i, r := range res[:250] {
		require.Equal(t, ingest.Delivered, r.Outcome, "record %d: %s", i, r.Reason)
	}
	require.Equal(t, ingest.Duplicate, res[250].Outcome)
	got, err := s.client.GetEntity(t.Context(), "part1", "part1%2Frow%231", nil)
	require.NoError(t, err)
	require.Contains(t, string(got.Value), `"Value":"{\"mag\":1}"`)

	// Lower limits from the config: 7 operations or about 3 entities'
	// bytes a transaction.
	small := openAzure(t)
	small.batch = ingest.BatchLimits{MaxOps: 7, MaxBytes: 3 * (azureOpOverhead + 120)}
	res, err = small.Write(t.Context(), batch[:50])
	require.NoError(t, err)
	for i, r := range res {
		require.Equal(t, ingest.Delivered, r.Outcome, "record %d with small batches: %s", i, r.Reason)
	}

	require.Equal(t, "p"+fmt.Sprintf("%02d", 0)[:0]+AzurePartitionKey(ingest.Record{ID: "x"})[1:], AzurePartitionKey(ingest.Record{ID: "x"}))
	require.Equal(t, "given", AzurePartitionKey(ingest.Record{ID: "x", SinkKey: "a/b", PartitionKey: "given"}))
	require.Equal(t, "a%2Fb%5C%23%3F%25", EscapeAzureKey(`a/b\#?%`))
}

func TestNewAzureTablesRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []AzureTablesConfig{
		{Account: "a", Key: "k", Table: "tab"},
		{ServiceURL: "http://127.0.0.1:1/a", Key: "k", Table: "tab"},
		{ServiceURL: "http://127.0.0.1:1/a", Account: "a", Table: "tab"},
		{ServiceURL: "http://127.0.0.1:1/a", Account: "a", Key: "k", Table: "t_1"},
		{ServiceURL: "http://127.0.0.1:1/a", Account: "a", Key: "k", Table: "tab", Batch: ingest.BatchLimits{MaxOps: 101}},
		{ServiceURL: "http://127.0.0.1:1/a", Account: "a", Key: "k", Table: "tab", Batch: ingest.BatchLimits{MaxBytes: 5 << 20}},
	} {
		_, err := NewAzureTables(t.Context(), cfg)
		require.ErrorIs(t, err, ErrAzureConfig, "%+v", cfg)
	}
}

func TestOpenAzureTablesFromURL(t *testing.T) {
	keyFile := t.TempDir() + "/key"
	require.NoError(t, os.WriteFile(keyFile, []byte(azuriteKey+"\n"), 0o600))
	s, err := Open(t.Context(), azuriteURL(t)+"?table=openurl", OpenConfig{AccountKeyFile: keyFile})
	require.NoError(t, err)
	defer s.Close()
	res, err := s.Write(t.Context(), []ingest.Record{{ID: "x", Value: []byte(`{}`)}})
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)

	_, err = Open(t.Context(), azuriteURL(t)+"?table=openurl", OpenConfig{})
	require.ErrorContains(t, err, "the account key is missing")
	s2, err := Open(t.Context(), azuriteURL(t)+"?table=openurl", OpenConfig{AccountKey: azuriteKey})
	require.NoError(t, err)
	require.NoError(t, s2.Close())
	for _, bad := range []string{"azuretables://127.0.0.1:1/a", "azuretables://u:p@127.0.0.1:1/a?table=abc", "azuretables://127.0.0.1:1/a?table=a_b"} {
		_, err := Open(t.Context(), bad, OpenConfig{})
		require.ErrorIs(t, err, ErrSinkURL, bad)
	}
}

// BenchmarkAzureTablesWrite measures unthrottled upserts into Azurite, by
// batch size, over 8 partition keys:
// go test -run '^$' -bench AzureTablesWrite ./sink/
func BenchmarkAzureTablesWrite(b *testing.B) {
	for _, size := range []int{100, 500, 1000} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			s := openAzure(b)
			value := []byte(`{"mag":2.5,"place":"10 km N of Somewhere, CA","depth":7.3,"time":"2025-05-01T00:00:00Z"}`)
			n := 0
			for b.Loop() {
				batch := make([]ingest.Record, size)
				for i := range batch {
					n++
					batch[i] = ingest.Record{ID: fmt.Sprintf("r%09d", n), PartitionKey: fmt.Sprintf("p%d", n%8), Value: value}
				}
				if _, err := s.Write(b.Context(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
