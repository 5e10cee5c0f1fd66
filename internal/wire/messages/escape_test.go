package messages

import (
	"strings"
	"testing"
)

// A translated answer keeps <, > and & as the provider wrote them (no
// \u003e): an answer's text is often code.
func TestTranslatedAnswerKeepsItsCharacters(t *testing.T) {
	const text = "if a > b && c < d {}"
	out, err := FromChatAnswer([]byte(`{"id":"x","model":"m","choices":[{"message":{"role":"assistant","content":"if a > b && c < d {}"},"finish_reason":"stop"}]}`))
	if err != nil || !strings.Contains(string(out), text) {
		t.Errorf("expected the text %q as it is, got %s (%v)", text, out, err)
	}
}
