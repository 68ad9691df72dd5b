// Package recordtype loads record types: the types file (YAML) that says,
// for each kind of record producers submit, its Kafka topic, its capacity
// pool, its ID field, its JSON Schema, its cost rule, its sink and its sink
// key rule. A Type's Processor validates a fetched record against the
// schema, adds the enrichments the type lists and sets the record's sink key
// and partition key.
//
// Sink key rules follow the storage vendors' partitioning guidance against
// hotspots: a key template of record fields and a strategy (a hash prefix,
// a reversed key, a bit-reversed sequence, a UUIDv4 derived from the key, or
// a shard prefix) that spreads monotonically growing keys over key ranges.
//
// Load returns errors wrapping ErrInvalid that name the file, the type and
// the field at fault; a sink key rule's errors wrap ErrSinkKey.
package recordtype
