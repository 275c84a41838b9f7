package webhook

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// Gitea bodies are read with github.com/valyala/fastjson (pinned in
// go.mod) instead of encoding/json. A pull request delivery is 12 KB of
// JSON of which the trigger reads a dozen fields; encoding/json scans
// such a body twice (Unmarshal validates it first, then decodes) with a
// byte-at-a-time state machine, and under load that was a third of the
// gateway's CPU. fastjson validates and indexes the body in two passes
// several times cheaper, and a pooled parser reuses its tree, so a
// delivery allocates only the strings it keeps. Its encoding/json
// semantics are kept below: the body must be valid JSON as
// encoding/json.Valid defines it, a field read with the wrong JSON type is
// an error, null leaves a field as it is (and clears a pointer), of two
// members with the same name the last wins, and invalid UTF-8 in a string
// becomes U+FFFD. Two differences remain: member names match exactly (as
// Gitea sends them, lowercase), not case-insensitively, and nesting deeper
// than fastjson.MaxDepth (300) is refused.

// parsers are reused across deliveries; a parser is not safe for
// concurrent use, a pool hands each delivery its own.
var parsers fastjson.ParserPool

// parseJSON parses body with p after checking it is valid JSON. The
// returned value lives until p parses again.
func parseJSON(p *fastjson.Parser, body []byte) (*fastjson.Value, error) {
	// Parse first: it refuses deep nesting before the recursive Validate
	// walks it.
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, err
	}
	if err := fastjson.ValidateBytes(body); err != nil {
		return nil, err
	}
	if controlInString(body) {
		return nil, errors.New("control character in string")
	}
	return v, nil
}

// validJSON reports whether body is valid JSON, as encoding/json.Valid
// does, with fastjson's depth limit.
func validJSON(body []byte) bool {
	p := parsers.Get()
	defer parsers.Put(p)
	_, err := parseJSON(p, body)
	return err == nil
}

// controlInString reports a raw control character inside a string, which
// JSON forbids and fastjson.Validate lets through. body must otherwise be
// valid JSON: then a quote outside a string opens one, and a quote inside
// ends it unless an odd run of backslashes comes before it.
func controlInString(body []byte) bool {
	for {
		i := bytes.IndexByte(body, '"')
		if i < 0 {
			return false
		}
		body = body[i+1:]
		for {
			j := bytes.IndexByte(body, '"')
			if j < 0 {
				return false
			}
			if hasControl(body[:j]) {
				return true
			}
			k := j
			for k > 0 && body[k-1] == '\\' {
				k--
			}
			body = body[j+1:]
			if (j-k)%2 == 0 {
				break
			}
		}
	}
}

// hasControl reports a byte below 0x20 in s, eight bytes at a time: a
// byte below n sets its top bit in (x - n per byte) &^ x, and only such a
// byte does, for n up to 0x80.
func hasControl(s []byte) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for len(s) >= 8 {
		x := binary.LittleEndian.Uint64(s)
		if (x-0x20*ones)&^x&highs != 0 {
			return true
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// reader copies fields out of a parsed body and keeps the first error.
type reader struct {
	err error
	// path holds the names of the objects being read, for the error.
	path [][]byte
}

func (r *reader) wrong(key []byte, v *fastjson.Value, want string) {
	if r.err == nil {
		r.err = fmt.Errorf("%s is %s, want %s", bytes.Join(append(r.path, key), []byte(".")), v.Type(), want)
	}
}

// object calls f for each member of v in order, so the last of two
// members with the same name wins. null is an empty object.
func (r *reader) object(key []byte, v *fastjson.Value, f func(key []byte, v *fastjson.Value)) {
	if r.err != nil || v.Type() == fastjson.TypeNull {
		return
	}
	o, err := v.Object()
	if err != nil {
		r.wrong(key, v, "object")
		return
	}
	if key != nil {
		r.path = append(r.path, key)
		defer func() { r.path = r.path[:len(r.path)-1] }()
	}
	o.Visit(func(k []byte, v *fastjson.Value) {
		if r.err == nil {
			f(k, v)
		}
	})
}

// ptr decodes the object v into *p, allocating it first; null sets *p to
// nil.
func ptr[T any](r *reader, key []byte, v *fastjson.Value, p **T, decode func(r *reader, key []byte, v *fastjson.Value, t *T)) {
	if v.Type() == fastjson.TypeNull {
		*p = nil
		return
	}
	if *p == nil {
		*p = new(T)
	}
	decode(r, key, v, *p)
}

func (r *reader) str(key []byte, v *fastjson.Value, dst *string) {
	switch v.Type() {
	case fastjson.TypeNull:
	case fastjson.TypeString:
		b, _ := v.StringBytes()
		*dst = text(b)
	default:
		r.wrong(key, v, "string")
	}
}

func (r *reader) int64(key []byte, v *fastjson.Value, dst *int64) {
	switch v.Type() {
	case fastjson.TypeNull:
	case fastjson.TypeNumber:
		n, err := v.Int64()
		if err != nil {
			r.wrong(key, v, "an integer")
			return
		}
		*dst = n
	default:
		r.wrong(key, v, "number")
	}
}

func (r *reader) int(key []byte, v *fastjson.Value, dst *int) {
	switch v.Type() {
	case fastjson.TypeNull:
	case fastjson.TypeNumber:
		n, err := v.Int()
		if err != nil {
			r.wrong(key, v, "an integer")
			return
		}
		*dst = n
	default:
		r.wrong(key, v, "number")
	}
}

func (r *reader) bool(key []byte, v *fastjson.Value, dst *bool) {
	switch v.Type() {
	case fastjson.TypeNull:
	case fastjson.TypeTrue:
		*dst = true
	case fastjson.TypeFalse:
		*dst = false
	default:
		r.wrong(key, v, "boolean")
	}
}

// text copies b, with each byte of invalid UTF-8 replaced by U+FFFD as
// encoding/json does.
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	for _, c := range string(b) {
		sb.WriteRune(c)
	}
	return sb.String()
}
