package sink

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/sluicehq/sluice/ingest"
)

// ErrCapacitySource is wrapped by CheckCapacitySource's errors: the sink
// cannot tell its capacity in the pool's unit.
var ErrCapacitySource = errors.New("sink: cannot tell its capacity")

// CheckCapacitySource reports whether the sink at raw can tell its
// capacity in unit (a pool with `--capacity sink`), and otherwise returns
// an error wrapping ErrCapacitySource that says what to use instead:
//
//   - dynamodb://: a table's write throughput is in write capacity units
//     (1 WCU writes up to 1 KiB, per the DynamoDB developer guide's
//     "Read/write capacity mode"), so the pool must count cost with the
//     rule 1/KiB (unit cost);
//   - rest+http(s)://: an API's announced limit counts requests, one a
//     record (not with array, where one request carries many), so the
//     pool must count records;
//   - any other sink announces nothing: use a number or probe.
func CheckCapacitySource(raw string, unit ingest.Unit, array bool) error {
	if _, ok := restTarget(raw); ok {
		switch {
		case array:
			return fmt.Errorf("%w: a REST API's limit counts requests, and with an array body one request carries many records: give a number, or probe", ErrCapacitySource)
		case unit != ingest.UnitRecords:
			return fmt.Errorf("%w: a REST API's limit counts requests (one a record): use --unit records, or give a number, or probe", ErrCapacitySource)
		}
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSinkURL, err)
	}
	switch u.Scheme {
	case "dynamodb":
		if unit != ingest.UnitCost {
			return fmt.Errorf("%w: a DynamoDB table's capacity is in write capacity units: use --unit cost --cost 1/KiB, or give a number, or probe", ErrCapacitySource)
		}
		return nil
	}
	return fmt.Errorf("%w: a %s sink announces no capacity (DynamoDB tables and REST APIs with RateLimit headers do): give a number, or probe", ErrCapacitySource, strings.TrimSuffix(u.Scheme, "ql"))
}

// SinkCapacity reads the table's write throughput (DescribeTable), in WCU
// per second, for a pool counting WCU (lease.CapacityReader): the
// provisioned write capacity of a provisioned table; for an on-demand
// table its maximum write request units (OnDemandThroughput, as set with
// UpdateTable), else its warm write throughput (WarmThroughput). An
// on-demand table with neither has no limit to read: that is an error
// naming what to use instead. Indexes are not counted.
func (d *DynamoDBSink) SinkCapacity(ctx context.Context) (float64, string, error) {
	out, err := d.client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(d.table)})
	if err != nil {
		return 0, "", fmt.Errorf("sink: dynamodb: describe table %s: %w", d.table, err)
	}
	return dynamoCapacity(d.table, out.Table)
}

// dynamoCapacity is the write throughput a table's description gives.
func dynamoCapacity(table string, t *types.TableDescription) (float64, string, error) {
	if t == nil {
		return 0, "", fmt.Errorf("sink: dynamodb: table %s: no description", table)
	}
	onDemand := t.BillingModeSummary != nil && t.BillingModeSummary.BillingMode == types.BillingModePayPerRequest
	if pt := t.ProvisionedThroughput; !onDemand && pt != nil && aws.ToInt64(pt.WriteCapacityUnits) > 0 {
		wcu := aws.ToInt64(pt.WriteCapacityUnits)
		return float64(wcu), fmt.Sprintf("from DynamoDB table %s: %d WCU", table, wcu), nil
	}
	if od := t.OnDemandThroughput; od != nil && aws.ToInt64(od.MaxWriteRequestUnits) > 0 {
		n := aws.ToInt64(od.MaxWriteRequestUnits)
		return float64(n), fmt.Sprintf("from DynamoDB table %s: on-demand, at most %d write units/s", table, n), nil
	}
	if wt := t.WarmThroughput; wt != nil && aws.ToInt64(wt.WriteUnitsPerSecond) > 0 {
		n := aws.ToInt64(wt.WriteUnitsPerSecond)
		return float64(n), fmt.Sprintf("from DynamoDB table %s: on-demand, warm for %d write units/s", table, n), nil
	}
	return 0, "", fmt.Errorf("sink: dynamodb: table %s is on-demand with neither a maximum nor a warm write throughput: set one (UpdateTable OnDemandThroughput), or give --capacity a number, or probe", table)
}
