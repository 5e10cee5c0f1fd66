package redact

import (
	"encoding/base64"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// A provider (or a hostile one) may echo a secret encoded: JSON-escaped
// in a body that is not whole JSON ("sk\u002dproj..." cut at a bound),
// URL-encoded in a link or a Location ("%2B" for a key's '+'), as an
// HTML character reference in an error page ("sk&#45;proj"), or in
// base64 (an echoed "Authorization: Basic ..."). decode gives the text
// with its escapes decoded, in which a secret is found as in plain text,
// and where each of its bytes came from; encodedForms gives a secret's
// base64 forms.

// decoded is a text with its escapes decoded: s[i] came from the
// original's bytes [from[i], to[i]).
type decoded struct {
	s        string
	from, to []int
}

// original is sp of d.s as a span of the original text: from the start
// of its first byte's escape to the end of its last's.
func (d *decoded) original(sp span) span {
	return span{d.from[sp.from], d.to[sp.to-1]}
}

// htmlNamed are the named character references of the characters keys
// are made of besides letters and digits.
var htmlNamed = map[string]string{"amp": "&", "sol": "/", "plus": "+", "equals": "=", "hyphen": "-", "dash": "-",
	"lowbar": "_", "period": ".", "colon": ":", "quot": `"`, "apos": "'", "lt": "<", "gt": ">", "num": "#", "percnt": "%"}

// decode is s with JSON's \uXXXX and \/, HTML's character references
// (&#45;, &#x2d;, &hyphen;) and URL's %XX escapes decoded, or nil when s
// has none. One pass: a hostile text costs its length.
func decode(s string) *decoded {
	if !strings.ContainsAny(s, `\&%`) {
		return nil
	}
	d := &decoded{from: make([]int, 0, len(s)), to: make([]int, 0, len(s))}
	var b strings.Builder
	b.Grow(len(s))
	changed := false
	for i := 0; i < len(s); {
		out, n := unescape(s[i:])
		if n == 0 {
			out, n = s[i:i+1], 1
		} else {
			changed = true
		}
		b.WriteString(out)
		for range len(out) {
			d.from, d.to = append(d.from, i), append(d.to, i+n)
		}
		i += n
	}
	if !changed {
		return nil
	}
	d.s = b.String()
	return d
}

// unescape decodes the escape s starts with: what it stands for and its
// length, or n 0 when s starts with none.
func unescape(s string) (out string, n int) {
	switch {
	case strings.HasPrefix(s, `\/`):
		return "/", 2
	case len(s) >= 6 && strings.HasPrefix(s, `\u`):
		if v, err := strconv.ParseUint(s[2:6], 16, 32); err == nil {
			return string(rune(v)), 6
		}
	case len(s) >= 3 && s[0] == '%':
		if v, err := strconv.ParseUint(s[1:3], 16, 8); err == nil {
			return string([]byte{byte(v)}), 3
		}
	case strings.HasPrefix(s, "&"):
		return unescapeHTML(s)
	}
	return "", 0
}

// unescapeHTML decodes the character reference s starts with (its ';'
// needed, 12 bytes at most).
func unescapeHTML(s string) (string, int) {
	end := strings.IndexByte(s[:min(len(s), 12)], ';')
	if end < 2 {
		return "", 0
	}
	name := s[1:end]
	if r, ok := strings.CutPrefix(name, "#"); ok {
		base := 10
		if h, ok := strings.CutPrefix(strings.ToLower(r), "x"); ok {
			r, base = h, 16
		}
		if v, err := strconv.ParseUint(r, base, 32); err == nil && utf8.ValidRune(rune(v)) {
			return string(rune(v)), end + 1
		}
		return "", 0
	}
	if v, ok := htmlNamed[strings.ToLower(name)]; ok {
		return v, end + 1
	}
	return "", 0
}

// formsOf keeps each secret's encodedForms: configured secrets are few,
// and looked for in every event of a stream.
var formsOf sync.Map // string to []string

// encodedForms are k's base64 forms (standard and URL alphabets) at each
// of the three alignments it can have in an encoded text ("user:" + k),
// each cut to the characters k alone decides; none that would be
// shorter than AnywhereLength.
func encodedForms(k string) []string {
	if v, ok := formsOf.Load(k); ok {
		return v.([]string)
	}
	out := newEncodedForms(k)
	formsOf.Store(k, out)
	return out
}

func newEncodedForms(k string) []string {
	var out []string
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for o := range 3 {
			e := enc.EncodeToString(append(make([]byte, o), k...))
			// Character i holds bits [6i, 6i+6): those of k alone are
			// the ones after the o bytes before it and within its end.
			from, to := (8*o+5)/6, 8*(o+len(k))/6
			if to-from >= AnywhereLength {
				out = append(out, e[from:to])
			}
		}
	}
	return out
}
