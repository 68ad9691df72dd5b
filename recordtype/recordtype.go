package recordtype

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/ingest"
	"github.com/sluicehq/sluice/lease"
)

// ErrInvalid is wrapped by every error Load returns about a types
// file or one of its schemas.
var ErrInvalid = errors.New("recordtype: invalid types file")

// Type describes one kind of record submitted by producers: where it
// is queued, how it is identified, validated and enriched, and where it is
// written. Pool, Cost, Sink and the sink key rule are carried as strings for
// the commands to interpret.
type Type struct {
	// Name is the type's name, the {type} of the intake API's path.
	Name string `yaml:"-"`
	// Topic is the Kafka topic the type's records are produced to. Required.
	Topic string `yaml:"topic"`
	// Pool names the capacity pool the type's writes draw from.
	Pool string `yaml:"pool"`
	// PoolSpec is Pool's definition when the file's pools section has one;
	// nil otherwise (the pool flags then define it).
	PoolSpec *PoolSpec `yaml:"-"`
	// IDField is the JSON field holding the record's ID; empty: none.
	IDField string `yaml:"id_field"`
	// Schema is the path of a JSON Schema file, relative to the types file;
	// empty: records are only checked to be JSON objects.
	Schema string `yaml:"schema"`
	// Cost is the cost rule, as a string (interpreted by the pool).
	Cost string `yaml:"cost"`
	// Sink is the sink URL the type's worker writes to.
	Sink string `yaml:"sink"`
	// SinkKey is the sink key rule: a template and a strategy.
	SinkKey struct {
		Template string `yaml:"template"`
		Strategy string `yaml:"strategy"`
	} `yaml:"sink_key"`
	// Enrich lists fields the processor adds. Supported: "ingested_at"
	// (RFC 3339 UTC time of processing).
	Enrich []string `yaml:"enrich"`

	schema *jsonschema.Schema
	now    func() time.Time
}

// PoolSpec is a capacity pool as a types file defines it, so that one
// worker can serve several record types, each from its own pool (bulk and
// interactive traffic on one service, say). Field meanings, units and
// defaults are those of the pool flags (--capacity, --unit, --partitions,
// --lease-ttl, --reserved-partitions, --priority, --weight).
type PoolSpec struct {
	// Capacity is the pool's rate in Unit per second; required, > 0.
	Capacity float64 `yaml:"capacity"`
	// Unit is records, bytes or cost; empty: records.
	Unit string `yaml:"unit"`
	// Partitions is the number of capacity partitions; 0: 20
	// (lease.DefaultPartitions).
	Partitions int `yaml:"partitions"`
	// LeaseTTL is the lease time-to-live, e.g. "15s"; 0: 15 s
	// (lease.DefaultTTL).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Reserved is the number of partitions a worker holds for its lifetime.
	Reserved int `yaml:"reserved_partitions"`
	// Priority is the priority class of the worker pods that serve the
	// pool's types: "high", "normal" or "low" (lease.ParsePriority);
	// empty: the command's default (worker: normal). A bulk load runs at
	// its own --priority (default low) whatever the file says, so a
	// backfill of a type stays below its live traffic.
	Priority string `yaml:"priority"`
	// Weight is the worker pods' weight inside their class, ≥ 1; 0: 1
	// (lease.DefaultWeight). Like Priority, it is the pods'.
	Weight int `yaml:"weight"`
}

// Pool returns the lease pool named name that p defines, with the lease
// package's defaults for the fields p leaves zero.
func (p *PoolSpec) Pool(name string) lease.Pool {
	return lease.Pool{
		Name:       name,
		Capacity:   p.Capacity,
		Unit:       ingest.Unit(cmp.Or(p.Unit, string(ingest.UnitRecords))),
		Partitions: cmp.Or(p.Partitions, lease.DefaultPartitions),
		TTL:        cmp.Or(p.LeaseTTL, lease.DefaultTTL),
	}
}

// Load reads a YAML types file mapping type names to Type under
// "types", and pool names to PoolSpec under "pools", and compiles the
// schemas. A type whose pool the file defines gets it as PoolSpec. Errors
// name the file and, for YAML errors, the line.
func Load(path string) (map[string]*Type, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var doc struct {
		Types map[string]*Type     `yaml:"types"`
		Pools map[string]*PoolSpec `yaml:"pools"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, path, err)
	}
	if len(doc.Types) == 0 {
		return nil, fmt.Errorf("%w: %s: no types defined under \"types\"", ErrInvalid, path)
	}
	for name, p := range doc.Pools {
		if p == nil {
			return nil, fmt.Errorf("%w: %s: pool %q is empty", ErrInvalid, path, name)
		}
		if err := p.Pool(name).Validate(); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, path, err)
		}
		if p.Priority != "" {
			if _, err := lease.ParsePriority(p.Priority); err != nil {
				return nil, fmt.Errorf("%w: %s: pool %q: priority: %w", ErrInvalid, path, name, err)
			}
		}
		if p.Weight < 0 {
			return nil, fmt.Errorf("%w: %s: pool %q: weight must be a positive integer, got %d", ErrInvalid, path, name, p.Weight)
		}
	}
	for name, t := range doc.Types {
		if t == nil || t.Topic == "" {
			return nil, fmt.Errorf("%w: %s: type %q: topic is required", ErrInvalid, path, name)
		}
		t.Name = name
		t.PoolSpec = doc.Pools[t.Pool]
		if t.SinkKey.Template != "" || t.SinkKey.Strategy != "" {
			if _, err := NewSinkKey(t.SinkKey.Template, t.SinkKey.Strategy); err != nil {
				return nil, fmt.Errorf("%w: %s: type %q: %w", ErrInvalid, path, name, err)
			}
		}
		for _, e := range t.Enrich {
			if e != "ingested_at" {
				return nil, fmt.Errorf("%w: %s: type %q: unknown enrichment %q (want ingested_at)", ErrInvalid, path, name, e)
			}
		}
		if t.Schema != "" {
			sp := t.Schema
			if !filepath.IsAbs(sp) {
				sp = filepath.Join(filepath.Dir(path), sp)
			}
			s, err := compileSchema(sp)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: type %q: schema %s: %w", ErrInvalid, path, name, sp, err)
			}
			t.schema = s
		}
	}
	return doc.Types, nil
}

func compileSchema(path string) (*jsonschema.Schema, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(path, doc); err != nil {
		return nil, err
	}
	return c.Compile(path)
}

// Validate checks that value is a JSON object satisfying the type's schema.
func (t *Type) Validate(value []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(value))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if _, ok := v.(map[string]any); !ok {
		return errors.New("not a JSON object")
	}
	if t.schema != nil {
		if err := t.schema.Validate(v); err != nil {
			return schemaError(err)
		}
	}
	return nil
}

// FieldTypes returns the JSON types the type's JSON Schema declares for
// its top-level properties: for each property with a "type" keyword, its
// names ("integer", "number", "boolean", "string", "null", "object",
// "array"). It follows "$ref" and "allOf" (the first declaration of a
// property wins). A bulk load converts CSV fields to these types before
// validating. Nil without a schema.
func (t *Type) FieldTypes() map[string][]string {
	if t.schema == nil {
		return nil
	}
	out := map[string][]string{}
	seen := map[*jsonschema.Schema]bool{}
	var walk func(s *jsonschema.Schema)
	walk = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		for name, p := range s.Properties {
			if _, done := out[name]; !done {
				if types := declaredTypes(p); len(types) > 0 {
					out[name] = types
				}
			}
		}
		walk(s.Ref)
		for _, sub := range s.AllOf {
			walk(sub)
		}
	}
	walk(t.schema)
	return out
}

// declaredTypes returns the "type" names of s, following "$ref".
func declaredTypes(s *jsonschema.Schema) []string {
	for range 32 { // a chain of references, not a cycle
		if s == nil {
			return nil
		}
		if s.Types != nil && !s.Types.IsEmpty() {
			return s.Types.ToStrings()
		}
		s = s.Ref
	}
	return nil
}

// schemaError says what a record violates, by JSON pointer into the record
// ("(root)" for the record itself), without the schema's file location,
// which a server must not reveal to its clients.
func schemaError(err error) error {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	var msgs []string
	for _, u := range ve.BasicOutput().Errors {
		if u.Error == nil {
			continue
		}
		at := u.InstanceLocation
		if at == "" {
			at = "(root)"
		}
		msgs = append(msgs, at+": "+u.Error.String())
	}
	if len(msgs) == 0 {
		return errors.New("schema validation failed")
	}
	return fmt.Errorf("schema: %s", strings.Join(msgs, "; "))
}

// Processor returns the type's processing step: it validates the record
// and applies the enrichment. Safe for concurrent use.
func (t *Type) Processor() ingest.Processor {
	return ingest.ProcessorFunc(func(rec ingest.Record) (ingest.Record, error) {
		if err := t.Validate(rec.Value); err != nil {
			return rec, fmt.Errorf("record type %s: %w", t.Name, err)
		}
		if len(t.Enrich) == 0 {
			return rec, nil
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(rec.Value, &obj); err != nil {
			return rec, fmt.Errorf("record type %s: %w", t.Name, err)
		}
		now := time.Now
		if t.now != nil {
			now = t.now
		}
		ts, _ := json.Marshal(now().UTC().Format(time.RFC3339Nano))
		obj["ingested_at"] = ts
		out, err := json.Marshal(obj)
		if err != nil {
			return rec, fmt.Errorf("record type %s: %w", t.Name, err)
		}
		rec.Value = out
		return rec, nil
	})
}
