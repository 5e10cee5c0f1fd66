package chat

import (
	"strings"
	"testing"
)

// A translated answer keeps <, > and & as the provider wrote them (no
// \u003e): an answer's text is often code.
func TestNewCompletionKeepsItsCharacters(t *testing.T) {
	const text = "if a > b && c < d {}"
	out, err := NewCompletion("", "m", text, nil, "stop", nil)
	if err != nil || !strings.Contains(string(out), text) {
		t.Errorf("expected the text %q as it is, got %s (%v)", text, out, err)
	}
}
