// Package strictjson parses JSON into an ordered tree and checks values the way the Python side
// (msgspec with strict=True) does: no type coercion ("1" is not 1, 1.0 is not 1, true is not 1),
// integers of any size compared exactly, and errors worded like msgspec's ("Expected `int` >= 1 -
// at `$.containers[...].gpus[0].memoryMiB`") so one set of test vectors checks both decoders.
//
// Objects keep document order and repeated keys, so a decoder checks every occurrence in order
// and keeps the last, as msgspec does (errors then name the same first offender as Python).
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind is the JSON type of a value.
type Kind int

// The JSON types.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

// Value is one parsed JSON value.
type Value struct {
	Kind Kind
	Bool bool
	Num  string // the literal as written (json.Number)
	Text string
	Arr  []*Value
	Obj  []Member
}

// Member is one key of an object, in document order.
type Member struct {
	Key string
	Val *Value
}

// Error is a validation error at a path; its text is msgspec's ("<what> - at `<path>`").
type Error struct {
	What string
	Path string
}

func (e *Error) Error() string {
	if e.Path == "" || e.Path == "$" {
		return e.What
	}
	return e.What + " - at `" + e.Path + "`"
}

// Errorf builds an Error at path.
func Errorf(path, format string, args ...any) *Error {
	return &Error{What: fmt.Sprintf(format, args...), Path: path}
}

// Parse reads exactly one JSON value (surrounding whitespace allowed, nothing else).
func Parse(data []byte) (*Value, error) {
	// encoding/json would silently turn these into U+FFFD; the Python side refuses them
	if !utf8.Valid(data) {
		return nil, errors.New("JSON is malformed: invalid UTF-8")
	}
	if at := unpairedSurrogate(data); at >= 0 {
		return nil, fmt.Errorf("JSON is malformed: invalid utf-16 surrogate pair (byte %d)", at)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := parseValue(dec)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("JSON is malformed: input data was truncated")
		}
		return nil, fmt.Errorf("JSON is malformed: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("JSON is malformed: trailing characters (byte %d)", dec.InputOffset())
	}
	return v, nil
}

func parseValue(dec *json.Decoder) (*Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case nil:
		return &Value{Kind: Null}, nil
	case bool:
		return &Value{Kind: Bool, Bool: t}, nil
	case json.Number:
		return &Value{Kind: Number, Num: string(t)}, nil
	case string:
		return &Value{Kind: String, Text: t}, nil
	case json.Delim:
		if t == '[' {
			v := &Value{Kind: Array}
			for dec.More() {
				item, err := parseValue(dec)
				if err != nil {
					return nil, err
				}
				v.Arr = append(v.Arr, item)
			}
			_, err := dec.Token() // ']'
			return v, err
		}
		v := &Value{Kind: Object}
		for dec.More() {
			keyTok, err := dec.Token()
			if err != nil {
				return nil, err
			}
			key, _ := keyTok.(string)
			item, err := parseValue(dec)
			if err != nil {
				return nil, err
			}
			v.Obj = append(v.Obj, Member{Key: key, Val: item})
		}
		_, err := dec.Token() // '}'
		return v, err
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}

// unpairedSurrogate returns the offset of a \uD800-\uDFFF escape that is not a high surrogate
// followed at once by a low one, or -1.
func unpairedSurrogate(data []byte) int {
	inString := false
	for i := 0; i < len(data); i++ {
		switch {
		case !inString:
			inString = data[i] == '"'
		case data[i] == '"':
			inString = false
		case data[i] == '\\' && i+1 < len(data):
			if data[i+1] != 'u' {
				i++
				continue
			}
			r, ok := hex4(data, i+2)
			if !ok {
				return -1 // malformed escape: the parser reports it
			}
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return i
			case r >= 0xD800 && r <= 0xDBFF:
				low, ok := hex4(data, i+8)
				if !ok || data[i+6] != '\\' || data[i+7] != 'u' || low < 0xDC00 || low > 0xDFFF {
					return i
				}
				i += 11
			default:
				i += 5
			}
		}
	}
	return -1
}

func hex4(data []byte, at int) (rune, bool) {
	if at+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

var integerLiteral = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// TypeName is msgspec's name for the value's type (`int` and `float` told apart by the literal).
func (v *Value) TypeName() string {
	switch v.Kind {
	case Null:
		return "null"
	case Bool:
		return "bool"
	case Number:
		if integerLiteral.MatchString(v.Num) {
			return "int"
		}
		return "float"
	case String:
		return "str"
	case Array:
		return "array"
	}
	return "object"
}

// BigInt returns the value as an exact integer, or a type error at path.
func (v *Value) BigInt(path string) (*big.Int, error) {
	if v.TypeName() != "int" {
		return nil, Errorf(path, "Expected `int`, got `%s`", v.TypeName())
	}
	n, _ := new(big.Int).SetString(v.Num, 10)
	return n, nil
}

// Int returns the value as an integer in [minimum, maximum], or msgspec's error at path.
func (v *Value) Int(path string, minimum, maximum int64) (int64, error) {
	n, err := v.BigInt(path)
	if err != nil {
		return 0, err
	}
	if n.Cmp(big.NewInt(minimum)) < 0 {
		return 0, Errorf(path, "Expected `int` >= %d", minimum)
	}
	if n.Cmp(big.NewInt(maximum)) > 0 {
		return 0, Errorf(path, "Expected `int` <= %d", maximum)
	}
	return n.Int64(), nil
}

// Pattern is a regular expression with the spelling the Python side reports in its errors.
type Pattern struct {
	re     *regexp.Regexp
	python string
}

// NewPattern compiles an anchored pattern "^...$". Go's `$` without the m flag matches only at
// the very end (Python's `\Z`), which is what the Python side uses to refuse a trailing newline.
func NewPattern(anchored string) *Pattern {
	if !strings.HasPrefix(anchored, "^") || !strings.HasSuffix(anchored, "$") {
		panic("strictjson: pattern must be anchored: " + anchored)
	}
	python := anchored[:len(anchored)-1] + `\Z`
	return &Pattern{re: regexp.MustCompile(anchored), python: python}
}

// MatchString reports whether s matches the pattern.
func (p *Pattern) MatchString(s string) bool { return p.re.MatchString(s) }

// repr is Python's repr() of the pattern text (single quotes, backslashes doubled).
func (p *Pattern) repr() string { return "'" + strings.ReplaceAll(p.python, `\`, `\\`) + "'" }

// StrSpec describes a string field: length bounds (0: none) and an optional pattern.
type StrSpec struct {
	MinLen  int
	MaxLen  int
	Pattern *Pattern
}

// Str returns the value as a string that meets spec (length checked before the pattern, as msgspec does).
func (v *Value) Str(path string, spec StrSpec) (string, error) {
	if v.Kind != String {
		return "", Errorf(path, "Expected `str`, got `%s`", v.TypeName())
	}
	return CheckStr(v.Text, path, spec)
}

// CheckStr checks a string already read (e.g. an object key) against spec.
func CheckStr(s, path string, spec StrSpec) (string, error) {
	n := len([]rune(s))
	if spec.MinLen > 0 && n < spec.MinLen {
		return "", Errorf(path, "Expected `str` of length >= %d", spec.MinLen)
	}
	if spec.MaxLen > 0 && n > spec.MaxLen {
		return "", Errorf(path, "Expected `str` of length <= %d", spec.MaxLen)
	}
	if spec.Pattern != nil && !spec.Pattern.MatchString(s) {
		return "", Errorf(path, "Expected `str` matching regex %s", spec.Pattern.repr())
	}
	return s, nil
}

// Timestamp returns the value as an RFC 3339 time (the agent's files' updatedAt).
func (v *Value) Timestamp(path string) (time.Time, error) {
	s, err := v.Str(path, StrSpec{MinLen: 1, MaxLen: 40})
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, Errorf(path, "Expected an RFC 3339 timestamp")
	}
	return t, nil
}

// Enum returns the value as one of the allowed strings.
func (v *Value) Enum(path string, allowed ...string) (string, error) {
	if v.Kind != String {
		return "", Errorf(path, "Expected `str`, got `%s`", v.TypeName())
	}
	for _, a := range allowed {
		if v.Text == a {
			return a, nil
		}
	}
	return "", Errorf(path, "Invalid enum value %s", pyRepr(v.Text))
}

// Items returns the array's items, with between minLen and maxLen of them (0: no bound).
func (v *Value) Items(path string, minLen, maxLen int) ([]*Value, error) {
	if v.Kind != Array {
		return nil, Errorf(path, "Expected `array`, got `%s`", v.TypeName())
	}
	if minLen > 0 && len(v.Arr) < minLen {
		return nil, Errorf(path, "Expected `array` of length >= %d", minLen)
	}
	if maxLen > 0 && len(v.Arr) > maxLen {
		return nil, Errorf(path, "Expected `array` of length <= %d", maxLen)
	}
	return v.Arr, nil
}

// Members returns the object's members in document order, repeated keys included, with between
// minLen and maxLen distinct keys.
func (v *Value) Members(path string, minLen, maxLen int) ([]Member, error) {
	if v.Kind != Object {
		return nil, Errorf(path, "Expected `object`, got `%s`", v.TypeName())
	}
	n := v.distinctKeys()
	if minLen > 0 && n < minLen {
		return nil, Errorf(path, "Expected `object` of length >= %d", minLen)
	}
	if maxLen > 0 && n > maxLen {
		return nil, Errorf(path, "Expected `object` of length <= %d", maxLen)
	}
	return v.Obj, nil
}

func (v *Value) distinctKeys() int {
	seen := make(map[string]bool, len(v.Obj))
	for _, m := range v.Obj {
		seen[m.Key] = true
	}
	return len(seen)
}

// Fields decodes an object of fixed fields: its members go, in document order (repeated keys
// included), to field with each member's own path, which returns Unknown(path, key) for a key the
// schema does not have; the first error ends the walk. Then every name in required must have been
// seen (RequireFields, in the order given). The one loop every schema's decoder walks.
func (v *Value) Fields(path string, field func(m Member, fieldPath string) error, required ...string) error {
	members, err := v.Members(path, 0, 0)
	if err != nil {
		return err
	}
	got := make(map[string]bool, len(members))
	for _, m := range members {
		if err := field(m, Field(path, m.Key)); err != nil {
			return err
		}
		got[m.Key] = true
	}
	return RequireFields(path, got, required...)
}

// Unknown is the error for a field the schema does not have.
func Unknown(path, key string) error {
	return Errorf(path, "Object contains unknown field `%s`", key)
}

// RequireFields reports the first of fields (in schema order) that is not in got.
func RequireFields(path string, got map[string]bool, fields ...string) error {
	for _, f := range fields {
		if !got[f] {
			return Errorf(path, "Object missing required field `%s`", f)
		}
	}
	return nil
}

// Field is the path of an object field.
func Field(path, name string) string { return path + "." + name }

// Index is the path of an array item.
func Index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

// AnyValue is the path of a map value (msgspec does not name the key).
func AnyValue(path string) string { return path + "[...]" }

// KeyOf is the path msgspec reports for a bad map key.
func KeyOf(path string) string { return "key` in `" + path }

// pyRepr is Python's repr() of a printable string (enough for error messages).
func pyRepr(s string) string {
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		return `"` + strings.ReplaceAll(s, `\`, `\\`) + `"`
	}
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}
