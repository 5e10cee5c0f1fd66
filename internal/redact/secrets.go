package redact

import (
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// AnywhereLength is the length, in bytes, from which a configured secret
// is redacted even inside a word (see the package's rules).
const AnywhereLength = 8

// maskRun is a mask in a key's middle, for a configured secret: any run
// of mask characters and of two or more ASCII dots.
var maskRun = regexp.MustCompile(`(?:[` + mask + `]|` + dots + `)+`)

// span is a part of a text to redact: [from, to) in bytes.
type span struct{ from, to int }

// secretSpans are the parts of s that show one of the secrets, whole or
// masked, in order, overlapping ones joined.
func secretSpans(s string, secrets []string) []span {
	var out []span
	var runs [][]int
	var rev string
	for _, k := range secrets {
		if k == "" {
			continue
		}
		out = appendWhole(out, s, k)
		out = appendCut(out, s, k)
		for _, e := range encodedForms(k) {
			out = appendWhole(out, s, e)
		}
		if runs == nil {
			if runs = maskRun.FindAllStringIndex(s, -1); runs == nil {
				runs = [][]int{}
			} else {
				rev = reverse(s)
			}
		}
		if len(runs) > 0 {
			out = appendMasked(out, s, rev, k, runs)
		}
	}
	return join(out)
}

// appendWhole appends where k stands whole in s (see the rules above).
func appendWhole(out []span, s, k string) []span {
	for i := 0; i <= len(s)-len(k); {
		j := strings.Index(s[i:], k)
		if j < 0 {
			break
		}
		j += i
		if len(k) >= AnywhereLength || isToken(s, k, j) {
			out = append(out, span{j, j + len(k)})
			i = j + len(k)
		} else {
			i = j + 1
		}
	}
	return out
}

// appendCut appends the end of s when it is k's start, AnywhereLength
// bytes or more of it but not all: a text cut at a bound (an error body
// read to 64 KiB) in the middle of a secret.
func appendCut(out []span, s, k string) []span {
	for n := min(len(k)-1, len(s)); n >= AnywhereLength; n-- {
		if strings.HasSuffix(s, k[:n]) {
			return append(out, span{len(s) - n, len(s)})
		}
	}
	return out
}

// isToken reports whether k, found at s[at:], stands as a token there.
func isToken(s, k string, at int) bool {
	first, _ := utf8.DecodeRuneInString(k)
	last, _ := utf8.DecodeLastRuneInString(k)
	return startsToken(s, at, first) && endsToken(s, at+len(k), last)
}

// startsToken reports whether text that starts with first at s[at:] is
// not inside a word there: first is no word character, or the one
// before it is none.
func startsToken(s string, at int, first rune) bool {
	before, _ := utf8.DecodeLastRuneInString(s[:at])
	return at == 0 || !isWord(first) || !isWord(before)
}

// endsToken is startsToken for text that ends with last at s[:end].
func endsToken(s string, end int, last rune) bool {
	after, _ := utf8.DecodeRuneInString(s[end:])
	return end == len(s) || !isWord(last) || !isWord(after)
}

func isWord(r rune) bool {
	return r == '_' || r == '-' || unicode.IsLetter(r) || unicode.IsDigit(r)
}

// appendMasked appends where a mask of s (runs) shows enough of k around
// it (see the rules above), the characters shown starting and ending
// tokens: "Thread..." shows nothing of a key that starts with "ead". rev
// is s reversed, byte by byte.
func appendMasked(out []span, s, rev, k string, runs [][]int) []span {
	kr := reverse(k)
	fail, failRev := failure(k), failure(kr)
	starts, ends := make([]int, len(runs)), make([]int, len(runs))
	for i, r := range runs {
		starts[i], ends[len(runs)-1-i] = r[0], len(s)-r[1]
	}
	before, after := shownBefore(s, k, fail, starts), shownBefore(rev, kr, failRev, ends)
	first, _ := utf8.DecodeRuneInString(k)
	last, _ := utf8.DecodeLastRuneInString(k)
	for i, r := range runs {
		p := bordered(before[i], fail, func(p int) bool { return startsToken(s, r[0]-p, first) })
		q := bordered(after[len(runs)-1-i], failRev, func(q int) bool { return endsToken(s, r[1]+q, last) })
		if p >= 3 || q >= 3 || p >= 2 && q >= 2 {
			out = append(out, span{r[0] - p, r[1] + q})
		}
	}
	return out
}

// bordered is the longest of n and its borders in a failure table (the
// shorter prefixes that end where it ends) that ok accepts, or 0.
func bordered(n int, fail []int, ok func(int) bool) int {
	for n > 0 && !ok(n) {
		n = fail[n-1]
	}
	return n
}

// shownBefore gives, at each position of at (ascending), the length of
// the longest prefix of k that ends there in s: one pass of the
// Knuth-Morris-Pratt matcher (fail is k's table), so that a hostile text
// full of masks costs no more than its length.
func shownBefore(s, k string, fail, at []int) []int {
	out := make([]int, len(at))
	n, a := 0, 0
	for i := 0; a < len(at); i++ {
		for a < len(at) && at[a] == i {
			out[a] = n
			a++
		}
		if i == len(s) {
			break
		}
		if n == len(k) {
			n = fail[n-1]
		}
		for n > 0 && s[i] != k[n] {
			n = fail[n-1]
		}
		if s[i] == k[n] {
			n++
		}
	}
	return out
}

// failure is the Knuth-Morris-Pratt table of k: for each prefix k[:i+1],
// the length of its longest proper prefix that is also its suffix.
func failure(k string) []int {
	fail := make([]int, len(k))
	for i, n := 1, 0; i < len(k); i++ {
		for n > 0 && k[i] != k[n] {
			n = fail[n-1]
		}
		if k[i] == k[n] {
			n++
		}
		fail[i] = n
	}
	return fail
}

func reverse(s string) string {
	b := []byte(s)
	slices.Reverse(b)
	return string(b)
}

// join sorts spans and joins those that overlap or touch.
func join(spans []span) []span {
	if len(spans) < 2 {
		return spans
	}
	slices.SortFunc(spans, func(a, b span) int { return a.from - b.from })
	out := spans[:1]
	for _, sp := range spans[1:] {
		if last := &out[len(out)-1]; sp.from <= last.to {
			last.to = max(last.to, sp.to)
		} else {
			out = append(out, sp)
		}
	}
	return out
}

// replace puts Placeholder in place of each span of s.
func replace(s string, spans []span) string {
	b := make([]byte, 0, len(s))
	at := 0
	for _, sp := range spans {
		b = append(b, s[at:sp.from]...)
		b = append(b, Placeholder...)
		at = sp.to
	}
	return string(append(b, s[at:]...))
}
