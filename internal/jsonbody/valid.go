package jsonbody

import (
	"encoding/binary"
	"math/bits"
)

// Valid reports whether data is one valid JSON value, as
// encoding/json.Valid does (RFC 8259; bytes of strings are not checked as
// UTF-8, and nesting deeper than 10000 is refused), in one pass without
// the scanner's call per byte: about a tenth of its CPU on a request body
// or a stream's chunk, which are mostly string bytes.
func Valid(data []byte) bool { return Scan(data, nil) }

// Scan is Valid that also calls note, when not nil, with each string of
// data (a key or a value) as the pass reads it: b[start:end-1] is the
// string as written (escapes unread), end the index after its closing
// quote, so that b[end:] says what follows it (a key's ':' and value).
func Scan(data []byte, note func(b []byte, start, end int)) bool {
	i := skipWS(data, 0)
	i = validValue(data, i, 0, note)
	return i >= 0 && skipWS(data, i) == len(data)
}

// maxJSONDepth is encoding/json's nesting limit.
const maxJSONDepth = 10000

// skipWS is SkipSpace, but i when i < 0 (what failed stays failed).
func skipWS(b []byte, i int) int {
	if i < 0 {
		return i
	}
	return SkipSpace(b, i)
}

// validValue returns the index after the value at b[i:], -1 when there is
// no valid value there.
func validValue(b []byte, i, depth int, note func(b []byte, start, end int)) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '"':
		end := validString(b, i+1)
		if note != nil && end >= 0 {
			note(b, i+1, end)
		}
		return end
	case c == '{' || c == '[':
		if depth >= maxJSONDepth {
			return -1
		}
		return validContainer(b, i, depth+1, note)
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || c >= '0' && c <= '9':
		return validNumber(b, i)
	}
	return -1
}

// validContainer returns the index after the object or array opening at
// b[i], -1 when it is not valid.
func validContainer(b []byte, i, depth int, note func(b []byte, start, end int)) int {
	object := b[i] == '{'
	end := byte(']')
	if object {
		end = '}'
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == end {
		return i + 1
	}
	for {
		if object {
			if i >= len(b) || b[i] != '"' {
				return -1
			}
			end := validString(b, i+1)
			if note != nil && end >= 0 {
				note(b, i+1, end)
			}
			if i = skipWS(b, end); i < 0 || i >= len(b) || b[i] != ':' {
				return -1
			}
			i = skipWS(b, i+1)
		}
		if i = validValue(b, i, depth, note); i < 0 {
			return -1
		}
		if i = skipWS(b, i); i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case end:
			return i + 1
		default:
			return -1
		}
	}
}

// validString returns the index after the string whose opening quote is
// just before b[i], -1 when it is not valid: no control byte, escapes of
// RFC 8259 only.
func validString(b []byte, i int) int {
	for i < len(b) {
		if i+8 <= len(b) { // eight bytes at a time up to one to look at
			m := stringSpecial(binary.LittleEndian.Uint64(b[i:]))
			if m == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(m) / 8
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			if i+1 >= len(b) {
				return -1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		default:
			i++
		}
	}
	return -1
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// validNumber returns the index after the number at b[i:], -1 when it is
// not valid: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func validNumber(b []byte, i int) int {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		if j := digits(b, i+1); j > i+1 {
			i = j
		} else {
			return -1
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func literal(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}
