package mockllm

import (
	"encoding/json"
	"strings"
	"testing"
)

// A scripted tool call: a conversation that does not end with a tool's
// result gets the call, in each dialect's form; one that does gets the
// reply.
func TestToolCallScript(t *testing.T) {
	tc := &ToolCall{Name: "get_weather", Arguments: json.RawMessage(`{"city":"Paris"}`)}
	for _, c := range []struct {
		dialect, path, ask, answer, call, result string
	}{
		{"openai", "/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":"Weather?"}]}`,
			`{"model":"m","messages":[{"role":"user","content":"Weather?"},{"role":"assistant","tool_calls":[]},{"role":"tool","tool_call_id":"c","content":"sunny"}]}`,
			`"finish_reason":"tool_calls"`, `"arguments":"{\"city\":\"Paris\"}"`},
		{"anthropic", "/v1/messages",
			`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"Weather?"}]}`,
			`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":[]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"sunny"}]}]}`,
			`"stop_reason":"tool_use"`, `"input":{"city":"Paris"}`},
		{"openai", "/v1/responses",
			`{"model":"m","input":[{"role":"user","content":"Weather?"}]}`,
			`{"model":"m","input":[{"role":"user","content":"Weather?"},{"type":"function_call","call_id":"c","name":"get_weather","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"sunny"}]}`,
			`"type":"function_call"`, `"arguments":"{\"city\":\"Paris\"}"`},
	} {
		s := serve(t, Handler{Dialect: c.dialect, Reply: "Sunny.", ToolCall: tc}, nil)
		got := readAll(t, s.post(t, c.path, c.ask))
		if !strings.Contains(got, c.call) || !strings.Contains(got, c.result) || !strings.Contains(got, "get_weather") {
			t.Errorf("%s %s: expected the call, got %s", c.dialect, c.path, got)
		}
		if got := readAll(t, s.post(t, c.path, c.answer)); !strings.Contains(got, "Sunny.") || strings.Contains(got, "get_weather") {
			t.Errorf("%s %s: expected the reply after the result, got %s", c.dialect, c.path, got)
		}
		stream := strings.Replace(c.ask, `{"model":"m",`, `{"model":"m","stream":true,`, 1)
		if got := readAll(t, s.post(t, c.path, stream)); !strings.Contains(got, "get_weather") || !strings.Contains(got, `{\"city\":\"Paris\"}`) {
			t.Errorf("%s %s: expected the call streamed, got %s", c.dialect, c.path, got)
		}
	}
}

// The prompt cache: a conversation's second turn finds its first turn's
// prefix cached, reported in each dialect's usage; another conversation
// finds nothing.
func TestPromptCache(t *testing.T) {
	turn1 := `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"` + strings.Repeat("long context ", 40) + `"}]}`
	turn2 := strings.TrimSuffix(turn1, "]}") + `,{"role":"assistant","content":"ok"},{"role":"user","content":"more"}]}`
	var first struct {
		Messages []json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal([]byte(turn1), &first)
	prefix := (len(first.Messages[0]) + 3) / 4
	for _, c := range []struct{ dialect, path, field string }{
		{"openai", "/v1/chat/completions", `"cached_tokens":`},
		{"anthropic", "/v1/messages", `"cache_read_input_tokens":`},
	} {
		s := serve(t, Handler{Dialect: c.dialect}, nil)
		if got := readAll(t, s.post(t, c.path, turn1)); strings.Contains(got, c.field) {
			t.Errorf("%s: expected nothing cached at first, got %s", c.dialect, got)
		}
		if got := readAll(t, s.post(t, c.path, turn2)); !strings.Contains(got, c.field+itoa(prefix)) {
			t.Errorf("%s: expected %s%d, got %s", c.dialect, c.field, prefix, got)
		}
		other := strings.Replace(turn2, "long context", "other topic!", 1)
		if got := readAll(t, s.post(t, c.path, other)); strings.Contains(got, c.field) {
			t.Errorf("%s: expected another conversation to find nothing cached, got %s", c.dialect, got)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
