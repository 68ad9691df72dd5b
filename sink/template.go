package sink

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/placeholder"
)

// The REST sink's templates speak package placeholder's language: {name}
// is the top-level JSON field name of the record's value; {$id} its ID,
// {$key} its sink key and, in a body template only, {$record} its whole
// value.

// urlTemplate is a request URL with placeholders in its path or query.
type urlTemplate struct {
	parts  []string // literal, name, literal, ...
	query  []bool   // per name: in the query (else in the path)
	fields []string // record fields named, in order, without repeats
	shown  string   // scheme://host/path, for messages (no query: it may hold a key)
}

// parseURLTemplate checks an http:// or https:// URL template.
func parseURLTemplate(raw string) (*urlTemplate, error) {
	parts, err := placeholder.Parse(raw, placeholder.ID, placeholder.Key, placeholder.Record)
	if err != nil {
		return nil, err
	}
	t := &urlTemplate{parts: parts}
	var sample strings.Builder
	inQuery := false
	for i, p := range parts {
		if i%2 == 0 {
			if strings.Contains(p, "#") {
				return nil, fmt.Errorf("url %q: a fragment is never sent", raw)
			}
			inQuery = inQuery || strings.Contains(p, "?")
			sample.WriteString(p)
			continue
		}
		if p == placeholder.Record {
			return nil, fmt.Errorf("url %q: {$record} belongs in a body template", raw)
		}
		t.query = append(t.query, inQuery)
		if !strings.HasPrefix(p, "$") && !slices.Contains(t.fields, p) {
			t.fields = append(t.fields, p)
		}
		// A marker no host or scheme may hold shows where the placeholder
		// landed once parsed.
		sample.WriteString("sluice-placeholder")
	}
	u, err := url.Parse(sample.String())
	if err != nil {
		return nil, fmt.Errorf("url %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("url %q: want an absolute http:// or https:// URL", raw)
	}
	if strings.Contains(u.Host, "sluice-placeholder") || u.User != nil {
		return nil, fmt.Errorf("url %q: placeholders go in the path or query, never the host; credentials never in the URL", raw)
	}
	t.shown = u.Scheme + "://" + u.Host + strings.ReplaceAll(u.Path, "sluice-placeholder", "{…}")
	return t, nil
}

// render fills the template with a record's fields: path-escaped in the
// path (a value's '/' cannot add a segment; "", "." and ".." are refused),
// query-escaped in the query.
func (t *urlTemplate) render(f *placeholder.Values) (string, error) {
	if len(t.parts) == 1 {
		return t.parts[0], nil
	}
	n := 0
	return placeholder.Render(t.parts, f, func(name, v string) (string, error) {
		inQuery := t.query[n]
		n++
		switch {
		case inQuery:
			return url.QueryEscape(v), nil
		case v == "" || v == "." || v == "..":
			// An empty or dot segment would address another resource.
			return "", &placeholder.FieldError{Field: name, Problem: fmt.Sprintf("is %q, which cannot name a resource in the URL's path", v)}
		}
		return url.PathEscape(v), nil
	})
}

// bodyTemplate is a JSON document in which a string that is exactly one
// placeholder, "{mag}", stands for the field's JSON value (any type;
// "{$record}" the whole record), and placeholders inside a longer string,
// "quake {id}", for the fields' text. It renders as compact JSON.
type bodyTemplate struct {
	segs   []bodySeg
	fields []string
}

// bodySeg is literal JSON, then optionally a field: its raw JSON value,
// or its text escaped for the inside of a JSON string.
type bodySeg struct {
	lit   []byte
	field string
	raw   bool
}

// parseBodyTemplate compiles a JSON body template.
func parseBodyTemplate(src string) (*bodyTemplate, error) {
	dec := json.NewDecoder(strings.NewReader(src))
	dec.UseNumber()
	t := &bodyTemplate{}
	var lit bytes.Buffer
	type frame struct {
		object bool
		n      int // tokens so far: keys and values in an object
	}
	var stack []frame
	values := 0 // top-level values
	emitString := func(s string, whole bool) error {
		parts, err := placeholder.Parse(s, placeholder.ID, placeholder.Key, placeholder.Record)
		if err != nil {
			return err
		}
		if whole && len(parts) == 3 && parts[0] == "" && parts[2] == "" {
			t.addField(&lit, parts[1], true)
			return nil
		}
		lit.WriteByte('"')
		for i, p := range parts {
			if i%2 == 0 {
				appendJSONText(&lit, p)
				continue
			}
			if p == placeholder.Record {
				return errors.New("{$record} must be a whole string value: \"{$record}\"")
			}
			t.addField(&lit, p, false)
		}
		lit.WriteByte('"')
		return nil
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("body template: %w", err)
		}
		isKey := false
		if d, ok := tok.(json.Delim); !ok || d == '{' || d == '[' {
			if len(stack) == 0 {
				if values++; values > 1 {
					return nil, errors.New("body template: more than one JSON value")
				}
			} else {
				f := &stack[len(stack)-1]
				isKey = f.object && f.n%2 == 0
				switch {
				case f.object && !isKey:
					lit.WriteByte(':')
				case f.n > 0:
					lit.WriteByte(',')
				}
				f.n++
			}
		}
		switch v := tok.(type) {
		case json.Delim:
			lit.WriteRune(rune(v))
			switch v {
			case '{', '[':
				stack = append(stack, frame{object: v == '{'})
			default:
				stack = stack[:len(stack)-1]
			}
		case string:
			if err := emitString(v, !isKey); err != nil {
				return nil, fmt.Errorf("body template: %w", err)
			}
		case json.Number:
			lit.WriteString(v.String())
		case bool:
			fmt.Fprint(&lit, v)
		case nil:
			lit.WriteString("null")
		}
	}
	if len(stack) > 0 {
		return nil, errors.New("body template: unexpected end of JSON")
	}
	if values == 0 {
		return nil, errors.New("body template: empty")
	}
	t.segs = append(t.segs, bodySeg{lit: bytes.Clone(lit.Bytes())})
	return t, nil
}

// addField ends the literal run in lit with a field segment.
func (t *bodyTemplate) addField(lit *bytes.Buffer, name string, raw bool) {
	t.segs = append(t.segs, bodySeg{lit: bytes.Clone(lit.Bytes()), field: name, raw: raw})
	lit.Reset()
	if !strings.HasPrefix(name, "$") && !slices.Contains(t.fields, name) {
		t.fields = append(t.fields, name)
	}
}

// render appends the body for one record to buf.
func (t *bodyTemplate) render(f *placeholder.Values, buf *bytes.Buffer) error {
	for _, s := range t.segs {
		buf.Write(s.lit)
		switch {
		case s.field == "":
		case s.raw:
			v, err := f.JSON(s.field)
			if err != nil {
				return err
			}
			buf.Write(v)
		default:
			v, err := f.Text(s.field)
			if err != nil {
				return err
			}
			appendJSONText(buf, v)
		}
	}
	return nil
}

// appendJSONText appends s escaped for the inside of a JSON string (no
// quotes); invalid UTF-8 becomes U+FFFD.
func appendJSONText(buf *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				buf.WriteByte('\\')
				buf.WriteByte(c)
			case c == '\n':
				buf.WriteString(`\n`)
			case c == '\r':
				buf.WriteString(`\r`)
			case c == '\t':
				buf.WriteString(`\t`)
			case c < 0x20:
				buf.WriteString(`\u00`)
				buf.WriteByte(hex[c>>4])
				buf.WriteByte(hex[c&0xf])
			default:
				buf.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			buf.WriteString(`\ufffd`)
		} else {
			buf.WriteString(s[i : i+size])
		}
		i += size
	}
}

// TemplateFields returns the record fields a REST sink's templates read:
// those of the URL of a rest+http(s):// --sink (nil for another scheme)
// and those of a body template ("" for none). Bulk loads check them
// against the file's columns before producing anything. It returns an
// error for a template that does not parse.
func TemplateFields(sinkURL, body string) (urlFields, bodyFields []string, err error) {
	if raw, ok := restTarget(sinkURL); ok {
		t, err := parseURLTemplate(raw)
		if err != nil {
			return nil, nil, err
		}
		urlFields = t.fields
	}
	if body != "" {
		t, err := parseBodyTemplate(body)
		if err != nil {
			return nil, nil, err
		}
		bodyFields = t.fields
	}
	return urlFields, bodyFields, nil
}
