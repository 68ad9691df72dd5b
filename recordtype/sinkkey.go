package recordtype

import (
	"cmp"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/placeholder"
)

// ErrSinkKey is wrapped by every error NewSinkKey returns about a rule.
var ErrSinkKey = errors.New("recordtype: sink key rule")

// SinkKey builds the key a sink stores a record under from the record's
// fields, then applies a strategy that spreads keys which grow monotonically
// (timestamps, sequences) over a range-partitioned store's key ranges,
// instead of sending every write to the range that holds the latest key (a
// hotspot capped at one partition's limit: about 2,000 entities/s on Azure
// Table Storage, 2,000 ops/s on OSS, 1,000 writes/s per new key range on
// Cloud Storage).
//
// The template names top-level JSON fields in braces, with literal text
// between them: "{net}/{time}/{id}". A string field is used as it is, a
// number as written, true and false as words; a missing or null field, an
// object or an array is an error naming the field.
//
// The strategies, and the guidance each follows:
//
//   - "none": the key as built.
//   - "hash-prefix:N" (1 ≤ N ≤ 32): the first N hex digits of the key's MD5,
//     then "/", then the key. Cloud Storage and Alibaba Cloud OSS recommend
//     a short hash prefix for sequentially named objects: 4 hex digits give
//     65,536 prefixes the store can split ranges on.
//   - "reverse": the key's first component (up to its first "/") reversed
//     character by character, then the rest. OSS recommends reversing a
//     timestamp prefix, so that its fastest-changing digits come first.
//   - "bit-reverse": the first component, an unsigned 64-bit decimal
//     sequence number, with its 64 bits reversed, as 20 zero-padded digits,
//     then the rest. Cloud Spanner's bit-reversed sequences spread a
//     sequence over the key space this way.
//   - "uuid4": a UUID in version-4 form derived from the key's SHA-256,
//     then "/", then the key. Spanner recommends UUIDv4 primary keys for
//     their spread; deriving the UUID from the key instead of drawing it at
//     random keeps it the same when a record is delivered twice, so sinks
//     that key rows by it still store the record once.
//   - "shard:N" (1 ≤ N ≤ 1,000,000): a shard number in [0, N) from the
//     key's 64-bit FNV-1a hash (its high bits: ⌊hash × N / 2^64⌋),
//     zero-padded to the width of N−1, then "/", then the key: Spanner's
//     ShardId column (hash mod N), a prefix with N values.
//
// Every strategy is deterministic: the same record always gets the same
// key. A SinkKey is safe for concurrent use.
type SinkKey struct {
	parts    []string // literal, field, literal, ... (placeholder.Parse)
	strategy string
	n        int // N of hash-prefix and shard
	apply    func(k *SinkKey, key string) (string, error)
}

// NewSinkKey parses a template and a strategy name ("" means "none"). Its
// errors wrap ErrSinkKey and name the template or strategy.
func NewSinkKey(template, strategy string) (*SinkKey, error) {
	parts, err := parseTemplate(template)
	if err != nil {
		return nil, err
	}
	k := &SinkKey{parts: parts, strategy: strategy}
	name, arg, hasArg := strings.Cut(strategy, ":")
	needN := func(lo, hi int) error {
		n, err := strconv.Atoi(arg)
		if !hasArg || err != nil || n < lo || n > hi {
			return fmt.Errorf("%w: strategy %q: want %s:N with N in %d..%d", ErrSinkKey, strategy, name, lo, hi)
		}
		k.n = n
		return nil
	}
	switch name {
	case "", "none":
		k.apply = func(_ *SinkKey, key string) (string, error) { return key, nil }
	case "hash-prefix":
		err, k.apply = needN(1, 32), hashPrefix
	case "shard":
		err, k.apply = needN(1, 1_000_000), shard
	case "reverse":
		k.apply = reverseHead
	case "bit-reverse":
		k.apply = bitReverseHead
	case "uuid4":
		k.apply = uuid4
	default:
		return nil, fmt.Errorf("%w: unknown strategy %q (want none, hash-prefix:N, reverse, bit-reverse, uuid4 or shard:N)", ErrSinkKey, strategy)
	}
	if err != nil {
		return nil, err
	}
	if hasArg && (name == "reverse" || name == "bit-reverse" || name == "uuid4" || name == "none") {
		return nil, fmt.Errorf("%w: strategy %q takes no argument", ErrSinkKey, name)
	}
	return k, nil
}

func parseTemplate(template string) ([]string, error) {
	if template == "" {
		return nil, fmt.Errorf("%w: the template is empty (want e.g. {time}/{id})", ErrSinkKey)
	}
	parts, err := placeholder.Parse(template)
	if err != nil {
		return nil, fmt.Errorf("%w: template: %w", ErrSinkKey, err)
	}
	return parts, nil
}

// Fields returns the record fields the template reads, in template order.
func (k *SinkKey) Fields() []string { return placeholder.Fields(k.parts) }

// String returns the rule as "template strategy".
func (k *SinkKey) String() string {
	var b strings.Builder
	for i, p := range k.parts {
		if i%2 == 1 {
			p = "{" + p + "}"
		}
		b.WriteString(p)
	}
	return b.String() + " " + cmp.Or(k.strategy, "none")
}

// Key returns the sink key of a JSON object record, never empty. Errors
// name the field that is missing or not a scalar, or say why the strategy
// cannot apply (an empty key, bit-reverse of a non-number).
func (k *SinkKey) Key(value []byte) (string, error) {
	key, err := placeholder.Render(k.parts, placeholder.Of(ingest.Record{Value: value}), nil)
	switch {
	case err != nil:
		return "", fmt.Errorf("sink key: %w", err)
	case key == "":
		return "", errors.New("sink key: the template gives an empty key for this record")
	}
	return k.apply(k, key)
}

// Processor returns a processing step that sets a record's SinkKey, and its
// PartitionKey to the key's first component (up to the first "/"; the whole
// key when it has none), which groups records into entity-group batches. A
// record whose key cannot be built fails with the reason (and goes to the
// dead-letter topic).
func (k *SinkKey) Processor() ingest.Processor {
	return ingest.ProcessorFunc(func(rec ingest.Record) (ingest.Record, error) {
		key, err := k.Key(rec.Value)
		if err != nil {
			return rec, err
		}
		rec.SinkKey = key
		rec.PartitionKey, _, _ = strings.Cut(key, "/")
		return rec, nil
	})
}

func hashPrefix(k *SinkKey, key string) (string, error) {
	sum := md5.Sum([]byte(key))
	return hex.EncodeToString(sum[:])[:k.n] + "/" + key, nil
}

func shard(k *SinkKey, key string) (string, error) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	// The high bits of hash × N: FNV's low bits mix poorly (mod 16 of
	// keys that differ in decimal digits takes only 8 values).
	id, _ := bits.Mul64(h.Sum64(), uint64(k.n))
	width := len(strconv.Itoa(k.n - 1))
	return fmt.Sprintf("%0*d/%s", width, id, key), nil
}

func reverseHead(_ *SinkKey, key string) (string, error) {
	head, tail, hasTail := strings.Cut(key, "/")
	r := []rune(head)
	slices.Reverse(r)
	if !hasTail {
		return string(r), nil
	}
	return string(r) + "/" + tail, nil
}

func bitReverseHead(_ *SinkKey, key string) (string, error) {
	head, tail, hasTail := strings.Cut(key, "/")
	n, err := strconv.ParseUint(head, 10, 64)
	if err != nil {
		return "", fmt.Errorf("sink key: bit-reverse needs an unsigned 64-bit number first, got %q", head)
	}
	out := fmt.Sprintf("%020d", bits.Reverse64(n))
	if !hasTail {
		return out, nil
	}
	return out + "/" + tail, nil
}

func uuid4(_ *SinkKey, key string) (string, error) {
	sum := sha256.Sum256([]byte(key))
	u := sum[:16]
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	h := hex.EncodeToString(u)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:] + "/" + key, nil
}
