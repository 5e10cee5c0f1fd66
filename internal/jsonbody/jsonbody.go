// Package jsonbody reads and rewrites the top level of JSON request bodies
// without decoding them: a member's value span, a string member, the model
// swapped in one copy, duplicate and miscased keys. The scanners trust
// nothing but bounds: on bytes that are not JSON they fail, never panic.
package jsonbody

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrNotObject is returned when a body is not a JSON object.
var ErrNotObject = errors.New("request body is not a JSON object")

// SetString returns body, a JSON object, with its top-level member key set to
// the string value: replaced in place when present, added first otherwise.
// Only the top level is scanned and nothing else of body is re-encoded, so a
// 4 KB chat body is rewritten with one copy. body must be valid JSON (the
// handler has parsed it); a body that is not an object returns an error.
func SetString(body []byte, key, value string) ([]byte, error) {
	return SetRaw(body, key, strconv.AppendQuote(make([]byte, 0, len(value)+2), value))
}

// SetRaw is SetString with a value given as JSON text (an object, a
// number...), which must be valid.
func SetRaw(body []byte, key string, quoted []byte) ([]byte, error) {
	start, end, err := FindMember(body, key)
	if err != nil {
		return nil, err
	}
	if start < 0 {
		// Insert right after '{'.
		open := SkipSpace(body, 0)
		out := make([]byte, 0, len(body)+len(key)+len(quoted)+4)
		out = append(out, body[:open+1]...)
		out = strconv.AppendQuote(out, key)
		out = append(out, ':')
		out = append(out, quoted...)
		if next := SkipSpace(body, open+1); next < len(body) && body[next] != '}' {
			out = append(out, ',')
		}
		return append(out, body[open+1:]...), nil
	}
	out := make([]byte, 0, len(body)-(end-start)+len(quoted))
	out = append(out, body[:start]...)
	out = append(out, quoted...)
	return append(out, body[end:]...), nil
}

// Without returns body, a JSON object, without its top-level member key
// (every one of that name), and whether it had one; body itself when not.
// Nothing else of body is re-encoded. key holds no ',' nor '{'.
func Without(body []byte, key string) ([]byte, bool) {
	var spans [][2]int // key start .. value end, of each member to drop
	var err error
	walkErr := EachMember(body, func(k []byte, vStart, vEnd int) bool {
		if string(k) == key {
			// The key begins after the '{' or ',' before it.
			j := vStart - 1
			for j > 0 && body[j] != ',' && body[j] != '{' {
				j--
			}
			if n := len(spans); n > 0 && j+1 < spans[n-1][1] {
				err = ErrNotObject // members not apart: not a valid object
				return false
			}
			spans = append(spans, [2]int{j + 1, vEnd})
		}
		return true
	})
	if walkErr != nil || err != nil || len(spans) == 0 {
		return body, false
	}
	out := make([]byte, 0, len(body))
	at := 0
	for _, s := range spans {
		out = append(out, body[at:s[0]]...)
		at = s[1]
		// Drop the comma that followed it, or else the one before it.
		k := SkipSpace(body, at)
		if k < len(body) && body[k] == ',' {
			at = k + 1
		} else if n := len(out); n > 0 {
			trim := len(out)
			for trim > 0 && (out[trim-1] == ' ' || out[trim-1] == '\t' || out[trim-1] == '\n' || out[trim-1] == '\r') {
				trim--
			}
			if trim > 0 && out[trim-1] == ',' {
				out = out[:trim-1]
			}
		}
	}
	return append(out, body[at:]...), true
}

// GetString returns the top-level string member key of a JSON object, and
// whether it is present as a string.
func GetString(body []byte, key string) (string, bool) {
	start, end, err := FindMember(body, key)
	if err != nil || start < 0 || body[start] != '"' {
		return "", false
	}
	return String(body[start:end])
}

// FindMember returns the byte span of the value of the top-level member key,
// or start -1 when the object has no such member.
func FindMember(b []byte, key string) (start, end int, err error) {
	start, end = -1, -1
	err = EachMember(b, func(name []byte, vStart, vEnd int) bool {
		if string(name) == key {
			start, end = vStart, vEnd
			return false
		}
		return true
	})
	return start, end, err
}

// CheckKeys rejects a JSON object that repeats a top-level key, or that
// spells one of names in another case ("Model", "STREAM"): parsers disagree
// on which copy wins (Go's is case-insensitive, most take the last), so the
// router and the provider could read different models or stream modes.
func CheckKeys(b []byte, names ...string) error {
	// A set of the keys seen: a body of 700,000 keys is checked in linear
	// time, not quadratic.
	seen := map[string]struct{}{}
	var err error
	walkErr := EachMember(b, func(key []byte, _, _ int) bool {
		if _, dup := seen[string(key)]; dup {
			err = fmt.Errorf("duplicate key %q in the request body", key)
			return false
		}
		for _, n := range names {
			if string(key) != n && strings.EqualFold(string(key), n) {
				err = fmt.Errorf("key %q must be spelled %q", key, n)
				return false
			}
		}
		seen[string(key)] = struct{}{}
		return true
	})
	if walkErr != nil {
		return walkErr
	}
	return err
}

// EachMember calls fn with each top-level member's key (unescaped; valid
// until fn returns) and the byte span of its value, until fn returns false.
func EachMember(b []byte, fn func(key []byte, vStart, vEnd int) bool) error {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return ErrNotObject
	}
	i++
	for {
		i = SkipSpace(b, i)
		if i >= len(b) {
			return ErrNotObject
		}
		if b[i] == '}' {
			return nil
		}
		if b[i] == ',' {
			i++
			continue
		}
		if b[i] != '"' {
			return ErrNotObject
		}
		kEnd, escaped := scanString(b, i)
		if kEnd < 0 {
			return ErrNotObject
		}
		name := b[i+1 : kEnd-1]
		if escaped {
			s, ok := String(b[i:kEnd])
			if !ok {
				return ErrNotObject
			}
			name = []byte(s)
		}
		i = SkipSpace(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return ErrNotObject
		}
		vStart := SkipSpace(b, i+1)
		vEnd := skipValue(b, vStart)
		if vEnd < 0 {
			return ErrNotObject
		}
		if !fn(name, vStart, vEnd) {
			return nil
		}
		i = vEnd
	}
}

func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"',
// or -1 (a quote after an odd run of backslashes is escaped).
func skipString(b []byte, i int) int {
	end, _ := scanString(b, i)
	return end
}

// scanString is skipString, and whether the string holds a backslash. A
// short string (a key, most of a chunk's values) is read eight bytes at a
// time up to its quote; past 16 bytes without a quote or a backslash it
// jumps from quote to quote (a vectorized search: prompts are long
// strings), a quote after an odd run of backslashes being escaped.
func scanString(b []byte, i int) (end int, escaped bool) {
	j := i + 1
	for words := 0; j < len(b); {
		if j+8 <= len(b) {
			if words == 2 {
				return jumpString(b, i, j)
			}
			m := quoteOrBackslash(binary.LittleEndian.Uint64(b[j:]))
			if m == 0 {
				j, words = j+8, words+1
				continue
			}
			j += bits.TrailingZeros64(m) / 8
		}
		switch b[j] {
		case '"':
			return j + 1, escaped
		case '\\':
			j, escaped = j+2, true
		default:
			j++
		}
	}
	return -1, escaped
}

// jumpString is scanString from b[j] on, where b[i+1:j] holds neither a
// quote nor a backslash.
func jumpString(b []byte, i, j int) (end int, escaped bool) {
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1, bytes.IndexByte(b[i+1:], '\\') >= 0
		}
		j += k
		n := 0
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j + 1, bytes.IndexByte(b[i+1:j], '\\') >= 0
		}
		j++
	}
}

// Word-at-a-time byte tests (the SWAR idiom of "Bit Twiddling Hacks",
// graphics.stanford.edu/~seander/bithacks.html): in each, the lowest set
// bit is the high bit of the first byte of w that matches; bits above it
// may be set without a match.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// zeroByte marks the bytes of w that are 0.
func zeroByte(w uint64) uint64 { return (w - ones) &^ w & highs }

// quoteOrBackslash marks the bytes of w that are '"' or '\\'.
func quoteOrBackslash(w uint64) uint64 {
	return zeroByte(w^(ones*'"')) | zeroByte(w^(ones*'\\'))
}

// stringSpecial marks the bytes of w that a string's check stops at: '"',
// '\\' and control bytes (below 0x20).
func stringSpecial(w uint64) uint64 {
	return quoteOrBackslash(w) | (w-ones*0x20)&^w&highs
}

// skipValue returns the index after the JSON value starting at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				k := skipString(b, j)
				if k < 0 {
					return -1
				}
				j = k - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default:
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\r' && b[j] != '\t' {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}

// String decodes the JSON string literal raw, quotes included, from a
// document already known to be valid JSON (a json.Unmarshaler is handed
// such spans). Without escapes it is one conversion; the common escapes
// (\n, \t, \", \\, ...) are decoded here, and anything else (\u escapes,
// bytes that are not UTF-8) by encoding/json, so the result is always
// the one json.Unmarshal gives. ok is false when raw is not a string.
func String(raw []byte) (s string, ok bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	esc := bytes.IndexByte(in, '\\')
	if esc < 0 && utf8.Valid(in) {
		return string(in), true
	}
	if esc >= 0 && utf8.Valid(in) {
		out := make([]byte, 0, len(in))
		for i := 0; i < len(in); i++ {
			c := in[i]
			if c != '\\' {
				out = append(out, c)
				continue
			}
			i++
			if i == len(in) {
				return "", false
			}
			switch in[i] {
			case '"', '\\', '/':
				out = append(out, in[i])
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			default: // \u: surrogates and all, as encoding/json reads them
				return slowString(raw)
			}
		}
		return string(out), true
	}
	return slowString(raw)
}

func slowString(raw []byte) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// EachElement calls fn with the byte span of each element of the JSON
// array b, until fn returns false. b must be an array.
func EachElement(b []byte, fn func(start, end int) bool) error {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return errNotArray
	}
	i++
	for {
		i = SkipSpace(b, i)
		if i >= len(b) {
			return errNotArray
		}
		switch b[i] {
		case ']':
			return nil
		case ',':
			i++
			continue
		}
		end := skipValue(b, i)
		if end < 0 {
			return errNotArray
		}
		if !fn(i, end) {
			return nil
		}
		i = end
	}
}

// errNotArray is returned when a value is not a JSON array.
var errNotArray = errors.New("not a JSON array")
