// Package placeholder is the one template language of sluice's sink keys
// (recordtype.SinkKey: "{net}/{time}/{id}") and REST requests (the REST
// sink's URL and body templates): literal text with the top-level JSON
// fields of a record's value named in braces, {name}. Three names are the
// record's own: {$id} its ID (the idempotency key), {$key} its sink key
// (its ID when it has none) and {$record} its whole value; a template
// says which of them it accepts.
//
// A field stands in text as a string's value, a number as written, true
// and false as words; a missing or null field, an empty one, an object or
// an array is an error naming the field.
package placeholder

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/ingest"
)

// The record's own names.
const (
	ID     = "$id"
	Key    = "$key"
	Record = "$record"
)

// Parse splits s into literal text and placeholder names: the parts
// alternate literal, name, literal, ... (odd indexes are names), and start
// and end with a literal, which may be empty. A '{' or '}' that does not
// close a non-empty name, or a $-name not in own (the record's own names
// the template accepts), is an error naming s.
func Parse(s string, own ...string) ([]string, error) {
	var parts []string
	for {
		open := strings.IndexAny(s, "{}")
		if open < 0 {
			return append(parts, s), nil
		}
		if s[open] == '}' {
			return nil, fmt.Errorf("unmatched '}' in %q", s)
		}
		end := strings.IndexAny(s[open+1:], "{}")
		if end < 0 || s[open+1+end] == '{' {
			return nil, fmt.Errorf("unclosed '{' in %q", s)
		}
		name := s[open+1 : open+1+end]
		if strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("empty placeholder {} in %q", s)
		}
		if strings.HasPrefix(name, "$") && !slices.Contains(own, name) {
			if len(own) == 0 {
				return nil, fmt.Errorf("unknown placeholder {%s} in %q (field names only here)", name, s)
			}
			return nil, fmt.Errorf("unknown placeholder {%s} in %q (the record's own here: {%s})", name, s, strings.Join(own, "}, {"))
		}
		parts = append(parts, s[:open], name)
		s = s[open+2+end:]
	}
}

// Fields returns the record fields parts name (odd indexes, the record's
// own names left out), in order, without repeats.
func Fields(parts []string) []string {
	var out []string
	for i := 1; i < len(parts); i += 2 {
		if !strings.HasPrefix(parts[i], "$") && !slices.Contains(out, parts[i]) {
			out = append(out, parts[i])
		}
	}
	return out
}

// FieldError is a record that lacks what a template needs: its value is
// not a JSON object, or a field is missing or cannot stand in text.
type FieldError struct {
	// Field names the field; empty when the value itself is at fault.
	Field string
	// Problem says what is wrong, e.g. "is missing".
	Problem string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Problem
	}
	return fmt.Sprintf("field %q %s", e.Field, e.Problem)
}

// Values looks a record's fields up, parsing its value once, at the first
// field asked for.
type Values struct {
	rec    ingest.Record
	obj    map[string]json.RawMessage
	parsed bool
	err    error
}

// Of returns the Values of rec.
func Of(rec ingest.Record) *Values { return &Values{rec: rec} }

// field returns the raw JSON of a top-level field.
func (v *Values) field(name string) (json.RawMessage, error) {
	if !v.parsed {
		v.parsed = true
		if err := json.Unmarshal(v.rec.Value, &v.obj); err != nil || v.obj == nil {
			v.err = &FieldError{Problem: "value is not a JSON object"}
		}
	}
	if v.err != nil {
		return nil, v.err
	}
	raw, ok := v.obj[name]
	if !ok {
		return nil, &FieldError{name, "is missing"}
	}
	return raw, nil
}

// JSON returns the JSON value a name stands for: a field's, the ID or the
// sink key as JSON strings, the whole value for {$record}. Errors are
// *FieldError.
func (v *Values) JSON(name string) (json.RawMessage, error) {
	switch name {
	case ID:
		return json.Marshal(v.rec.ID)
	case Key:
		return json.Marshal(cmp.Or(v.rec.SinkKey, v.rec.ID))
	case Record:
		if !json.Valid(v.rec.Value) {
			return nil, &FieldError{Problem: "value is not valid JSON"}
		}
		return v.rec.Value, nil
	}
	return v.field(name)
}

// Text returns the text a name stands for (see the package doc). Errors
// are *FieldError.
func (v *Values) Text(name string) (string, error) {
	switch name {
	case ID:
		return v.rec.ID, nil
	case Key:
		return cmp.Or(v.rec.SinkKey, v.rec.ID), nil
	}
	raw, err := v.field(name)
	if err != nil {
		return "", err
	}
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0:
		return "", &FieldError{name, "is empty"}
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", &FieldError{name, "is not a valid JSON string"}
		}
		return s, nil
	case raw[0] == '{', raw[0] == '[':
		return "", &FieldError{name, "is an object or array, not a value to put in text"}
	case string(raw) == "null":
		return "", &FieldError{name, "is null"}
	}
	return string(raw), nil
}

// Render fills parts (from Parse) with v's text, each value passed
// through escape (nil: as it is).
func Render(parts []string, v *Values, escape func(name, value string) (string, error)) (string, error) {
	var b strings.Builder
	for i, p := range parts {
		if i%2 == 0 {
			b.WriteString(p)
			continue
		}
		text, err := v.Text(p)
		if err != nil {
			return "", err
		}
		if escape != nil {
			if text, err = escape(p, text); err != nil {
				return "", err
			}
		}
		b.WriteString(text)
	}
	return b.String(), nil
}
