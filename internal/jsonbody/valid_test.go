package jsonbody

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// Valid says what encoding/json.Valid says at each rule's edge (the
// adapters' TestValidJSONIsJSONValid checks it on the recorded streams and
// 100,000 mutations of them).
func TestValidIsJSONValid(t *testing.T) {
	for _, in := range []string{``, ` `, `{}`, `[]`, `{"a":1}`, `{"a":1,}`, `[1,]`, `{"a" 1}`, `{a:1}`, `"x`, `"\u00e9"`, `"\u00g9"`,
		`"\x"`, "\"a\tb\"", `-0`, `01`, `1.`, `1.5e+3`, `.5`, `tru`, ` null `, `{"a":[1,{"b":null}]}`, `{"a":1}}`, `[[[]]`,
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000), strings.Repeat("[", 10001) + strings.Repeat("]", 10001), "\x00", `1 2`} {
		if got, want := Valid([]byte(in)), json.Valid([]byte(in)); got != want {
			t.Errorf("Valid(%.40q) = %v, json.Valid says %v", in, got, want)
		}
	}
}

// Scan notes every string, keys and values, as written and in order, with
// what follows each.
func TestScanNotesEachString(t *testing.T) {
	in := []byte(`{"a":"x\"y","b":[1,"c",{"d":null}],"e" : "f"}`)
	var got []string
	if !Scan(in, func(b []byte, start, end int) {
		got = append(got, string(b[start:end-1])+"|"+string(b[end:min(end+1, len(b))]))
	}) {
		t.Fatal("valid JSON read as invalid")
	}
	want := []string{`a|:`, `x\"y|,`, `b|:`, `c|,`, `d|:`, `e| `, `f|}`}
	if !slices.Equal(got, want) {
		t.Errorf("noted %q, want %q", got, want)
	}
}

// The word-at-a-time string scans (validString, skipString) end where a
// byte-at-a-time reading of the same bytes ends, for strings of every
// length up to 40 at every offset, made of the bytes that matter: the
// quote, the backslash, escape letters, control bytes, DEL and bytes
// above 0x7f.
func TestStringScansMatchByteAtATime(t *testing.T) {
	alphabet := []byte{'a', '"', '\\', 'u', '0', 'f', 'n', 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xff, 0xa2, 0xdc}
	rng := rand.New(rand.NewPCG(32, 1))
	for n := 0; n < 20000; n++ {
		b := make([]byte, 1+rng.IntN(40))
		for k := range b {
			b[k] = alphabet[rng.IntN(len(alphabet))]
		}
		if rng.IntN(2) == 0 {
			for k := range b { // mostly ordinary bytes, as a chunk's strings are
				if rng.IntN(8) != 0 {
					b[k] = 'a' + byte(rng.IntN(26))
				}
			}
		}
		for i := range b {
			if got, want := validString(b, i), validStringBytewise(b, i); got != want {
				t.Fatalf("validString(%q, %d) = %d, byte at a time %d", b, i, got, want)
			}
			if got, want := skipString(b, i), skipStringBytewise(b, i); got != want {
				t.Fatalf("skipString(%q, %d) = %d, byte at a time %d", b, i, got, want)
			}
			if end, escaped := scanString(b, i); end >= 0 && escaped != (bytes.IndexByte(b[i+1:end-1], '\\') >= 0) {
				t.Fatalf("scanString(%q, %d) says escaped %v", b, i, escaped)
			}
		}
		if got, want := Valid(append(append([]byte{'"'}, b...), '"')), json.Valid(append(append([]byte{'"'}, b...), '"')); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid says %v", b, got, want)
		}
	}
}

// validStringBytewise is validString one byte at a time, as it was before
// it read words.
func validStringBytewise(b []byte, i int) int {
	for i < len(b) {
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

// skipStringBytewise is skipString as it was: the first quote after b[i]
// not escaped by an odd run of backslashes.
func skipStringBytewise(b []byte, i int) int {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		n := 0
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
}
