// Package excerpt quotes a bounded part of a text, as the adapters and the
// client formats do when an error message quotes a provider's or a
// client's text.
package excerpt

import "unicode/utf8"

// Of returns s when it is at most n bytes long, and otherwise its
// first n bytes or fewer, cut at a UTF-8 character boundary so the
// result stays valid UTF-8, followed by "...". n <= 0 gives "...".
func Of(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < 0 {
		n = 0
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
