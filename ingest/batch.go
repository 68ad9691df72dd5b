package ingest

// BatchLimits bound an entity-group batch: operations that a store applies
// together, all on one partition key. The defaults are Azure Table
// Storage's entity-group transaction limits ("Performing entity group
// transactions" in its REST reference): 100 operations and 4 MiB.
type BatchLimits struct {
	// MaxOps is the most operations in a batch; default 100.
	MaxOps int
	// MaxBytes is the most payload bytes in a batch, as size reports
	// them; default 4 MiB.
	MaxBytes int
}

// Default entity-group limits (Azure Table Storage).
const (
	DefaultBatchOps   = 100
	DefaultBatchBytes = 4 << 20
)

// GroupBatches splits n operations into entity-group batches and returns
// each batch as the operations' indexes: one partition key per batch (key
// reports operation i's), at most MaxOps operations and MaxBytes of size(i)
// bytes, except that an operation larger than MaxBytes on its own forms a
// batch of one (the store refuses it, with the operation's own error).
// Every operation is in exactly one batch; batches come in the order their
// key first appears, and keep the operations' order. Limits ≤ 0 take the
// defaults.
func GroupBatches(n int, key func(i int) string, size func(i int) int, lim BatchLimits) [][]int {
	if lim.MaxOps <= 0 {
		lim.MaxOps = DefaultBatchOps
	}
	if lim.MaxBytes <= 0 {
		lim.MaxBytes = DefaultBatchBytes
	}
	byKey := map[string][]int{}
	var keys []string
	for i := range n {
		k := key(i)
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	var out [][]int
	for _, k := range keys {
		var cur []int
		bytes := 0
		for _, i := range byKey[k] {
			s := size(i)
			if len(cur) > 0 && (len(cur) == lim.MaxOps || bytes+s > lim.MaxBytes) {
				out, cur, bytes = append(out, cur), nil, 0
			}
			cur, bytes = append(cur, i), bytes+s
		}
		if len(cur) > 0 {
			out = append(out, cur)
		}
	}
	return out
}
