package bulkload

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluicehq/sluice/ingest"
)

// CSVTypes says which JSON type each CSV field becomes. An empty field is
// always null. A column whose record type's JSON Schema declares types
// (Columns) is converted to them: "integer", "number" and "boolean" are
// parsed (a value that does not parse is a schema error naming the column
// and file:line), "object" and "array" must be JSON of that kind, and a
// column that may be a "string" stays one. The other columns are strings,
// or, with Auto, numbers when they are JSON number literals (4.2, -17,
// 1e-3; not 007 or +5) and booleans when they are true or false (any case).
// The zero value keeps every field a string, as a CSV file holds it.
type CSVTypes struct {
	// Columns maps a column to the JSON Schema type names its record
	// type declares for it (recordtype.Type.FieldTypes).
	Columns map[string][]string
	// Auto infers numbers and booleans in the columns Columns does not
	// name. Default false: strings.
	Auto bool
}

// ParseCSVTypes parses the --csv-types value: "string" (every field a
// string, the default) or "auto" (numbers and booleans inferred).
func ParseCSVTypes(s string) (auto bool, err error) {
	switch s {
	case "", "string":
		return false, nil
	case "auto":
		return true, nil
	}
	return false, fmt.Errorf("want auto or string, got %q", s)
}

// JSON types a column may take, as a set.
type jsonKinds uint8

const (
	kindString jsonKinds = 1 << iota
	kindInteger
	kindNumber
	kindBoolean
	kindObject
	kindArray
	kindNull
	kindAuto // no declared type: numbers and booleans inferred
)

func kindsOf(types []string) jsonKinds {
	var k jsonKinds
	for _, t := range types {
		switch t {
		case "string":
			k |= kindString
		case "integer":
			k |= kindInteger
		case "number":
			k |= kindNumber
		case "boolean":
			k |= kindBoolean
		case "object":
			k |= kindObject
		case "array":
			k |= kindArray
		case "null":
			k |= kindNull
		}
	}
	return k
}

// describe names the types a value failed to convert to: "a number", "an
// integer or a boolean".
func (k jsonKinds) describe() string {
	var names []string
	for _, n := range []struct {
		k    jsonKinds
		name string
	}{{kindNumber, "a number"}, {kindInteger, "an integer"}, {kindBoolean, "a boolean"}, {kindObject, "a JSON object"}, {kindArray, "a JSON array"}} {
		if k&n.k != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "null"
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// column is one CSV column as the encoder writes it.
type column struct {
	name  string
	index int    // field index in the row
	key   []byte // the JSON-encoded name and a colon
	kinds jsonKinds
}

// rowEncoder writes a CSV row as a JSON object keyed by the header, keys
// sorted as encoding/json sorts a map's (a repeated column name keeps its
// last field, as a map would). With every column a string (the default)
// its output is byte for byte what json.Marshal makes of the row as a
// map[string]any of strings and nils, so content-hash IDs (ingest.ContentID)
// stay what they were when rows were encoded that way.
type rowEncoder struct {
	cols  []column
	idCol int // the ID column's position in cols; -1: none
}

// ConversionError is a CSV field that does not convert to the JSON type
// its column declares.
type ConversionError struct {
	Column, Value, Want string
}

func (e *ConversionError) Error() string {
	return fmt.Sprintf("schema: column %q: %q is not %s", e.Column, e.Value, e.Want)
}

func newRowEncoder(header []string, types CSVTypes, idField string) *rowEncoder {
	last := map[string]int{}
	for i, h := range header {
		last[h] = i
	}
	e := &rowEncoder{idCol: -1}
	for name, i := range last {
		k := kindsOf(types.Columns[name])
		if k&^kindNull == 0 {
			// Nothing but null declared, or nothing at all: the
			// default for undeclared columns.
			k = kindString
			if types.Auto {
				k = kindAuto
			}
		}
		e.cols = append(e.cols, column{name: name, index: i, key: append(appendJSONString(nil, name), ':'), kinds: k})
	}
	slices.SortFunc(e.cols, func(a, b column) int { return strings.Compare(a.name, b.name) })
	for i, c := range e.cols {
		if c.name == idField && idField != "" {
			e.idCol = i
		}
	}
	return e
}

// encode appends the JSON object of fields to dst and returns it with the
// record ID when idField is set: the ID column's value as its JSON text
// would give it (a string's content, a number's literal). It returns a
// *ConversionError for a field that does not convert, and an error
// wrapping ingest.ErrNoID for a row without an ID.
func (e *rowEncoder) encode(dst []byte, fields []string, idField string) (_ []byte, id string, err error) {
	dst = append(dst, '{')
	for i, c := range e.cols {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, c.key...)
		v := fields[c.index]
		start := len(dst)
		if dst, err = appendField(dst, v, c.kinds); err != nil {
			var ce *ConversionError
			if errors.As(err, &ce) {
				ce.Column = c.name
			}
			return dst, "", err
		}
		if i == e.idCol {
			if id, err = idOf(dst[start:], v, idField); err != nil {
				return dst, "", err
			}
		}
	}
	return append(dst, '}'), id, nil
}

// idOf is ingest.RecordID for one field already encoded as JSON text.
func idOf(text []byte, v, idField string) (string, error) {
	switch {
	case string(text) == "null":
		return "", fmt.Errorf("%w: field %q is missing", ingest.ErrNoID, idField)
	case text[0] == '"':
		// A string field: its content (never empty here), copied so it
		// does not keep the whole row's text alive.
		return strings.Clone(v), nil
	case text[0] == '-' || (text[0] >= '0' && text[0] <= '9'):
		return string(text), nil
	}
	return "", fmt.Errorf("id field %q is neither a string nor a number: %s", idField, text)
}

// appendField appends the JSON value of one CSV field: null when empty,
// else converted to the first of kinds it fits (see CSVTypes).
func appendField(dst []byte, v string, kinds jsonKinds) ([]byte, error) {
	if v == "" {
		return append(dst, "null"...), nil
	}
	switch {
	case kinds&kindString != 0:
		return appendJSONString(dst, v), nil
	case kinds == kindAuto:
		if isJSONNumber(v) {
			return append(dst, v...), nil
		}
		if b, ok := autoBool(v); ok {
			return strconv.AppendBool(dst, b), nil
		}
		return appendJSONString(dst, v), nil
	}
	t := strings.TrimSpace(v)
	if kinds&kindNumber != 0 {
		if out, ok := appendNumber(dst, t); ok {
			return out, nil
		}
	} else if kinds&kindInteger != 0 {
		if out, ok := appendInteger(dst, t); ok {
			return out, nil
		}
	}
	if kinds&kindBoolean != 0 {
		if b, err := strconv.ParseBool(t); err == nil {
			return strconv.AppendBool(dst, b), nil
		}
	}
	if kinds&(kindObject|kindArray) != 0 && t != "" && json.Valid([]byte(t)) {
		if (t[0] == '{' && kinds&kindObject != 0) || (t[0] == '[' && kinds&kindArray != 0) {
			return append(dst, t...), nil
		}
	}
	return dst, &ConversionError{Value: v, Want: kinds.describe()}
}

func autoBool(v string) (value, ok bool) {
	switch {
	case strings.EqualFold(v, "true"):
		return true, true
	case strings.EqualFold(v, "false"):
		return false, true
	}
	return false, false
}

// appendNumber appends t as a JSON number: as written when it is a JSON
// number literal, else as strconv reads it (+5, .5, 5.), refusing NaN and
// infinities.
func appendNumber(dst []byte, t string) ([]byte, bool) {
	if isJSONNumber(t) {
		return append(dst, t...), true
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || strings.ContainsAny(t, "xX_") {
		return dst, false
	}
	return strconv.AppendFloat(dst, f, 'g', -1, 64), true
}

// appendInteger appends t as a JSON integer: as written when it is a JSON
// number literal with no fraction (1.0 and 1e3 are integers to JSON
// Schema too), else as strconv reads it (+5, 007).
func appendInteger(dst []byte, t string) ([]byte, bool) {
	if isJSONNumber(t) {
		f, err := strconv.ParseFloat(t, 64)
		if err == nil && f == math.Trunc(f) && !math.IsInf(f, 0) {
			return append(dst, t...), true
		}
		if !strings.ContainsAny(t, ".eE") { // beyond float64's range, still an integer
			return append(dst, t...), true
		}
		return dst, false
	}
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		return strconv.AppendInt(dst, n, 10), true
	}
	return dst, false
}

// isJSONNumber reports whether s is a JSON number literal (RFC 8259):
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i == len(s) || s[i] < '0' || s[i] > '9' {
			return false
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i == len(s) || s[i] < '0' || s[i] > '9' {
			return false
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	return i == len(s)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string the way encoding/json
// writes one: <, > and & escaped as \u003c, \u003e and \u0026, control
// characters as \n, \r, \t, \b, \f or \u00XX, invalid UTF-8 as \ufffd, and
// U+2028 and U+2029 escaped.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
