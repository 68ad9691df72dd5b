package sink

import (
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

func TestAnnouncedLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		header map[string]string
		rate   float64
		field  string
		ok     bool
	}{
		{"the draft's policy", map[string]string{"RateLimit-Policy": "500;w=1"}, 500, "RateLimit-Policy", true},
		{"a later draft's named policy", map[string]string{"RateLimit-Policy": `"default";q=600;w=60`}, 10, "RateLimit-Policy", true},
		{"a limit with its window", map[string]string{"X-RateLimit-Limit": "100, 100;w=10"}, 10, "X-RateLimit-Limit", true},
		{"RateLimit-Limit with a window", map[string]string{"RateLimit-Limit": "50;w=1"}, 50, "RateLimit-Limit", true},
		{"a limit without a window says nothing", map[string]string{"X-RateLimit-Limit": "5000"}, 0, "", false},
		{"no headers", nil, 0, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			rate, field, _, ok := announcedLimit(h)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.rate, rate)
			require.Equal(t, tc.field, field)
		})
	}
}

func TestDynamoCapacity(t *testing.T) {
	t.Parallel()
	provisioned := &types.TableDescription{ProvisionedThroughput: &types.ProvisionedThroughputDescription{WriteCapacityUnits: aws.Int64(200)}}
	v, from, err := dynamoCapacity("quakes", provisioned)
	require.NoError(t, err)
	require.Equal(t, 200.0, v)
	require.Equal(t, "from DynamoDB table quakes: 200 WCU", from)

	onDemand := func(max, warm int64) *types.TableDescription {
		t := &types.TableDescription{BillingModeSummary: &types.BillingModeSummary{BillingMode: types.BillingModePayPerRequest},
			ProvisionedThroughput: &types.ProvisionedThroughputDescription{WriteCapacityUnits: aws.Int64(0)}}
		if max != 0 {
			t.OnDemandThroughput = &types.OnDemandThroughput{MaxWriteRequestUnits: aws.Int64(max)}
		}
		if warm != 0 {
			t.WarmThroughput = &types.TableWarmThroughputDescription{WriteUnitsPerSecond: aws.Int64(warm)}
		}
		return t
	}
	v, from, err = dynamoCapacity("quakes", onDemand(1000, 4000))
	require.NoError(t, err)
	require.Equal(t, 1000.0, v, "the configured maximum first")
	require.Contains(t, from, "on-demand, at most 1000 write units/s")
	v, from, err = dynamoCapacity("quakes", onDemand(-1, 4000))
	require.NoError(t, err)
	require.Equal(t, 4000.0, v, "else the warm throughput")
	require.Contains(t, from, "warm for 4000 write units/s")
	_, _, err = dynamoCapacity("quakes", onDemand(0, 0))
	require.ErrorContains(t, err, "on-demand with neither a maximum nor a warm write throughput")
	require.ErrorContains(t, err, "probe")
}

func TestCheckCapacitySource(t *testing.T) {
	t.Parallel()
	require.NoError(t, CheckCapacitySource("dynamodb://quakes?region=eu-west-1", ingest.UnitCost, false))
	require.ErrorContains(t, CheckCapacitySource("dynamodb://quakes?region=eu-west-1", ingest.UnitRecords, false), "--unit cost --cost 1/KiB")
	require.NoError(t, CheckCapacitySource("rest+https://api.example/items/{id}", ingest.UnitRecords, false))
	require.ErrorContains(t, CheckCapacitySource("rest+https://api.example/items", ingest.UnitRecords, true), "one request carries many records")
	require.ErrorContains(t, CheckCapacitySource("rest+https://api.example/items/{id}", ingest.UnitBytes, false), "--unit records")
	err := CheckCapacitySource("postgres://u@db/quakes?table=t", ingest.UnitRecords, false)
	require.ErrorIs(t, err, ErrCapacitySource)
	require.ErrorContains(t, err, "a postgres sink announces no capacity")
	require.ErrorContains(t, err, "give a number, or probe")
}
