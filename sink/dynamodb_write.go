package sink

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/sluicehq/sluice/ingest"
)

// How the DynamoDB sink writes a batch: one conditional PutItem per record,
// or BatchWriteItem requests of up to 25 items, and how it reads their
// answers and charges.

// putAll writes every op with a conditional PutItem, up to dynamoParallel
// at once, and sets their results; it returns the requests that failed as
// a whole.
func (d *DynamoDBSink) putAll(ctx context.Context, ops []dynamoOp, out []ingest.Result) []failure {
	var (
		mu    sync.Mutex
		fails []failure
	)
	unstarted := fanOut(ctx, len(ops), dynamoParallel, func(k int) {
		res, err := d.put(ctx, ops[k].key, ops[k].item)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			fails = append(fails, failure{recs: []int{ops[k].i}, err: err})
			return
		}
		out[ops[k].i] = res
	})
	for _, k := range unstarted {
		fails = append(fails, failure{recs: []int{ops[k].i}, err: context.Cause(ctx)})
	}
	return fails
}

// put writes one item unless its key is stored; err is a failure of the
// request as a whole (not about the record). A key found stored is a
// Duplicate, or Delivered when a put of it here went unanswered before
// (see unanswered).
func (d *DynamoDBSink) put(ctx context.Context, key string, item map[string]types.AttributeValue) (ingest.Result, error) {
	in := &dynamodb.PutItemInput{
		TableName:                aws.String(d.table),
		Item:                     item,
		ConditionExpression:      aws.String(d.condition),
		ExpressionAttributeNames: map[string]string{"#k": d.hashKey.name},
	}
	if d.charge {
		in.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	resp, err := d.client.PutItem(rctx, in)
	if err == nil {
		d.pending.take(key)
		res := ingest.Result{Outcome: ingest.Delivered}
		if d.charge && resp.ConsumedCapacity != nil {
			res.Charge = wcu(aws.ToFloat64(resp.ConsumedCapacity.CapacityUnits))
		}
		return res, nil
	}
	if _, dup := errors.AsType[*types.ConditionalCheckFailedException](err); dup {
		if d.pending.take(key) {
			return ingest.Result{Outcome: ingest.Delivered}, nil
		}
		return ingest.Result{Outcome: ingest.Duplicate}, nil
	}
	if res, perRecord := classifyDynamo(err); perRecord {
		return res, nil
	}
	if !hasAnswer(err) {
		d.pending.add(key)
	}
	return ingest.Result{}, err
}

// wcu rounds consumed capacity up to whole units.
func wcu(units float64) int64 { return int64(math.Ceil(units - 1e-9)) }

// writeBatches writes ops in BatchWriteItems of at most 25 items and 16
// MiB, up to dynamoParallel at once, and sets their results; it returns the
// requests that failed as a whole.
func (d *DynamoDBSink) writeBatches(ctx context.Context, ops []dynamoOp, batch []ingest.Record, out []ingest.Result) []failure {
	groups := ingest.GroupBatches(len(ops), func(int) string { return "" }, func(k int) int { return ops[k].size },
		ingest.BatchLimits{MaxOps: DynamoDBBatchItems, MaxBytes: DynamoDBBatchBytes})
	var (
		mu    sync.Mutex
		fails []failure
	)
	unstarted := fanOut(ctx, len(groups), dynamoParallel, func(n int) {
		f := d.batchWrite(ctx, ops, groups[n], batch, out, &mu)
		mu.Lock()
		fails = append(fails, f...)
		mu.Unlock()
	})
	for _, n := range unstarted {
		f := failure{err: context.Cause(ctx)}
		for _, k := range groups[n] {
			f.recs = append(f.recs, ops[k].i)
		}
		fails = append(fails, f)
	}
	return fails
}

// batchWrite writes ops[g] with one BatchWriteItem; when DynamoDB refuses
// it for one of its items (ValidationException), it writes the two halves
// apart, down to single items, which are then Permanent. It returns the
// requests that failed as a whole. mu guards out.
func (d *DynamoDBSink) batchWrite(ctx context.Context, ops []dynamoOp, g []int, batch []ingest.Record, out []ingest.Result, mu *sync.Mutex) []failure {
	reqs := make([]types.WriteRequest, len(g))
	for j, k := range g {
		reqs[j] = types.WriteRequest{PutRequest: &types.PutRequest{Item: ops[k].item}}
	}
	in := &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{d.table: reqs}}
	if d.charge {
		in.ReturnConsumedCapacity = types.ReturnConsumedCapacityTotal
	}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	resp, err := d.client.BatchWriteItem(rctx, in)
	cancel()
	if err != nil {
		res, perRecord := classifyDynamo(err)
		switch {
		case !perRecord:
			f := failure{err: err}
			for _, k := range g {
				f.recs = append(f.recs, ops[k].i)
			}
			return []failure{f}
		case res.Outcome == ingest.Permanent && len(g) > 1:
			// One item spoilt the request: find it by halves.
			h := len(g) / 2
			return append(d.batchWrite(ctx, ops, g[:h], batch, out, mu), d.batchWrite(ctx, ops, g[h:], batch, out, mu)...)
		}
		mu.Lock()
		for _, k := range g {
			out[ops[k].i] = res
		}
		mu.Unlock()
		return nil
	}
	unprocessed := map[string]bool{}
	for _, wr := range resp.UnprocessedItems[d.table] {
		if wr.PutRequest != nil {
			unprocessed[d.itemKey(wr.PutRequest.Item)] = true
		}
	}
	var consumed float64
	for _, c := range resp.ConsumedCapacity {
		consumed += aws.ToFloat64(c.CapacityUnits)
	}
	mu.Lock()
	defer mu.Unlock()
	var stored []int
	for _, k := range g {
		i := ops[k].i
		if unprocessed[d.itemKey(ops[k].item)] {
			out[i] = ingest.Result{Outcome: ingest.Retryable, Throttled: true, Reason: "dynamodb: unprocessed item (the table's or partition's write capacity is used up)"}
			continue
		}
		out[i] = ingest.Result{Outcome: ingest.Delivered}
		stored = append(stored, i)
	}
	if d.charge {
		shareCharge(out, batch, stored, wcu(consumed))
	}
	return nil
}

// shareCharge splits a request's charge among the records it stored in
// proportion to their estimated costs (largest remainders, so the shares
// add up to total): each record's Charge then says what the sink charged
// per unit of estimate, which is what the worker learns its estimates from.
func shareCharge(out []ingest.Result, batch []ingest.Record, stored []int, total int64) {
	var estimate int64
	for _, i := range stored {
		estimate += max(batch[i].Cost, 1)
	}
	if total <= 0 || estimate == 0 {
		return
	}
	type rem struct {
		i    int
		frac int64
	}
	var given int64
	rems := make([]rem, 0, len(stored))
	for _, i := range stored {
		c := max(batch[i].Cost, 1) * total
		out[i].Charge = c / estimate
		given += out[i].Charge
		rems = append(rems, rem{i, c % estimate})
	}
	slices.SortStableFunc(rems, func(a, b rem) int { return cmp.Compare(b.frac, a.frac) })
	for k := 0; given < total; k++ {
		out[rems[k].i].Charge++
		given++
	}
}

// itemKey is the key string of a stored item, as Write's dedupe makes it.
func (d *DynamoDBSink) itemKey(item map[string]types.AttributeValue) string {
	k := keyString(item[d.hashKey.name])
	if d.rangeKey.name != "" {
		k += "\x00" + keyString(item[d.rangeKey.name])
	}
	return k
}

// classifyDynamo maps a DynamoDB error to a per-record result; perRecord
// is false for failures of the whole request or the sink (a missing table,
// refused credentials, a transport error), which fail the attempt. Error
// codes: "Error handling with DynamoDB" in the DynamoDB developer guide.
func classifyDynamo(err error) (res ingest.Result, perRecord bool) {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return ingest.Result{}, false
	}
	reason := "dynamodb: " + ae.ErrorCode() + ": " + ae.ErrorMessage()
	switch ae.ErrorCode() {
	case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded":
		return ingest.Result{Outcome: ingest.Retryable, Throttled: true, Reason: reason}, true
	case "ValidationException", "ItemCollectionSizeLimitExceededException", "SerializationException":
		return ingest.Result{Outcome: ingest.Permanent, Reason: reason}, true
	case "InternalServerError", "InternalFailure", "ServiceUnavailable", "TransactionConflictException":
		return ingest.Result{Outcome: ingest.Retryable, Reason: reason}, true
	}
	return ingest.Result{}, false
}
