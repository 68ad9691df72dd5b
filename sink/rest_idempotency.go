package sink

import (
	"slices"

	"github.com/sluicehq/sluice/placeholder"
)

// RESTUnseenID reports whether a rest+http(s):// --sink writes records
// without showing the API their identity: the record ID ({$id}), the sink
// key ({$key}) and the ID field ({idField}, when one is named) appear in
// neither the URL template nor a body template, and opts does not say the
// API honours the Idempotency-Key header. Such an API assigns its own IDs,
// and a rerun or a redelivery stores a record twice. False for other
// schemes, and for templates that do not parse (Open reports those).
func RESTUnseenID(sinkURL string, opts RESTOptions, idField string) bool {
	raw, ok := restTarget(sinkURL)
	if !ok || opts.IdempotencyKey {
		return false
	}
	shows := func(name string) bool {
		return name == placeholder.ID || name == placeholder.Key || (idField != "" && name == idField)
	}
	t, err := parseURLTemplate(raw)
	if err != nil {
		return false
	}
	for i := 1; i < len(t.parts); i += 2 {
		if shows(t.parts[i]) {
			return false
		}
	}
	if opts.Body == "" {
		return true
	}
	b, err := parseBodyTemplate(opts.Body)
	if err != nil {
		return false
	}
	return !slices.ContainsFunc(b.segs, func(s bodySeg) bool { return shows(s.field) })
}

// RESTUnseenIDFix says how to show a REST API the record's identity, for
// the warning about RESTUnseenID.
const RESTUnseenIDFix = "put {$id} in the URL and write with --sink-method PUT (rest+https://api.example.com/items/{$id}), " +
	`or give a --sink-body template that carries it ({"id": "{$id}", ...}); if the API honours the Idempotency-Key header ` +
	"every request carries, say so with --sink-idempotency-key"
