package chat

import (
	"encoding/json"
	"testing"
)

// A chat.completion the router builds (from an Anthropic, Gemini or
// Bedrock answer) has message.refusal: required by the OpenAI spec's
// ChatCompletionResponseMessage, null when there is none.
func TestNewCompletionRefusalNull(t *testing.T) {
	for _, text := range []string{"hi", ""} {
		out, err := NewCompletion("", "m", text, nil, "stop", nil)
		if err != nil {
			t.Fatal(err)
		}
		var c struct {
			Choices []struct {
				Message map[string]json.RawMessage `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(out, &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("expected one choice, got %s", out)
		}
		if r, ok := c.Choices[0].Message["refusal"]; !ok || string(r) != "null" {
			t.Errorf("text %q: expected message.refusal null, got %s", text, out)
		}
	}
}

// A message's several text parts (a tool message's, a system prompt's)
// are joined by a newline, not run together.
func TestContentStringJoinsParts(t *testing.T) {
	var c Content
	if err := json.Unmarshal([]byte(`[{"type":"text","text":"line one"},{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"line two"}]`), &c); err != nil {
		t.Fatal(err)
	}
	if got := c.String(); got != "line one\nline two" {
		t.Errorf("expected %q, got %q", "line one\nline two", got)
	}
}
