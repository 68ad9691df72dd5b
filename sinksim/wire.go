package sinksim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/sluicehq/sluice/sinkwire"
)

// lenient accepts what encoding/json accepts: repeated names (the last
// counts) and invalid UTF-8 in strings (read as U+FFFD).
var lenient = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

// element is one request element as read from the body: the wire record's
// fields, as encoding/json would fill a sink.WireRecord (names matched
// without regard to case, null leaving a field unset), and the first
// field of the wrong type, if any.
type element struct {
	rec     sinkwire.Record
	value   []byte // a copy of the value, kept only when asked for
	valueN  int    // the value's length
	first   byte   // the value's first byte; 0 when absent
	typeErr error
	object  bool // the element is a JSON object
}

// readBody reads a request body, a JSON array of wire records, in one pass
// over its bytes: the records' values are checked and measured, not
// decoded. keepValues keeps a copy of each value (for the required-fields
// check and the charge rule). The error says why the body is not a JSON
// array.
func readBody(body []byte, keepValues bool) ([]element, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(body), lenient...)
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, err
	}
	if tok.Kind() != '[' {
		return nil, errors.New("the body is not a JSON array")
	}
	var out []element
	for dec.PeekKind() != ']' {
		var el element
		if dec.PeekKind() != '{' {
			if err := dec.SkipValue(); err != nil {
				return nil, err
			}
			out = append(out, el)
			continue
		}
		el.object = true
		if _, err := dec.ReadToken(); err != nil {
			return nil, err
		}
		for dec.PeekKind() != '}' {
			tok, err := dec.ReadToken()
			if err != nil {
				return nil, err
			}
			if err := el.readField(dec, tok.String(), keepValues); err != nil {
				return nil, err
			}
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, err
		}
		out = append(out, el)
	}
	if _, err := dec.ReadToken(); err != nil {
		return nil, err
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		if err == nil {
			err = errors.New("more than one JSON value")
		}
		return nil, err
	}
	return out, nil
}

// readField reads the value of the field named name into el. It returns an
// error only when the body is not valid JSON.
func (el *element) readField(dec *jsontext.Decoder, name string, keepValues bool) error {
	field := ""
	for _, f := range []string{"id", "cost", "value", "key"} {
		if len(name) == len(f) && bytes.EqualFold([]byte(name), []byte(f)) {
			field = f
		}
	}
	wrong := func(want string) {
		if el.typeErr == nil {
			el.typeErr = fmt.Errorf("field %q: want %s", field, want)
		}
	}
	kind := dec.PeekKind()
	switch {
	case field == "":
		return dec.SkipValue()
	case field == "value":
		v, err := dec.ReadValue()
		if err != nil {
			return err
		}
		el.valueN, el.first = len(v), v[0]
		if keepValues {
			el.value = bytes.Clone(v)
		}
		return nil
	case kind == 'n': // null leaves the field as it is
		_, err := dec.ReadToken()
		return err
	case kind != '"' && kind != '0':
		if err := dec.SkipValue(); err != nil {
			return err
		}
		wrong(map[string]string{"id": "a string", "key": "a string", "cost": "a whole number"}[field])
		return nil
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	switch field {
	case "id", "key":
		if kind != '"' {
			wrong("a string")
			return nil
		}
		if field == "id" {
			el.rec.ID = tok.String()
		} else {
			el.rec.Key = tok.String()
		}
	case "cost":
		n, err := strconv.ParseInt(tok.String(), 10, 64)
		if kind != '0' || err != nil {
			wrong("a whole number")
			return nil
		}
		el.rec.Cost = &n
	}
	return nil
}
