package excerpt

import (
	"testing"
	"unicode/utf8"
)

func TestOf(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"a longer message", 8, "a longer..."},
		{"naïve", 3, "na..."}, // "ï" is two bytes: the cut moves back before it
		{"日本語", 4, "日..."},
		{"abc", 0, "..."},
		{"abc", -1, "..."},
	} {
		got := Of(c.s, c.n)
		if got != c.want {
			t.Errorf("Of(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("Of(%q, %d) = %q is not valid UTF-8", c.s, c.n, got)
		}
	}
}
