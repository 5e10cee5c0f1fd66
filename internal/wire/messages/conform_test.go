package messages_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// toolIDPattern is tool_use.id's pattern in the Messages API: an id that
// breaks it makes the next turn, sent to Claude, a 400.
var toolIDPattern = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	return v
}

// completionWithCall is a chat.completion from an OpenAI-compatible
// server (Kimi's, Moonshot's ids: "functions.name:index") with one call.
func completionWithCall(id, args string) []byte {
	a, _ := json.Marshal(args)
	return []byte(`{"id":"chatcmpl-abc","object":"chat.completion","created":1,"model":"kimi-k2","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":null,"tool_calls":[{"id":"` + id + `","type":"function",` +
		`"function":{"name":"get_weather","arguments":` + string(a) + `}}]},"finish_reason":"tool_calls"}],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}`)
}

func TestFromChatAnswerToolInputIsAnObject(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{`{"city":"Paris"}`, `{"city":"Paris"}`},
		{``, `{}`},
		{`  `, `{}`},
		{`"{\"city\":\"Paris\"}"`, `{"city":"Paris"}`}, // stringified once
		{`[1,2]`, `{"_raw":"[1,2]"}`},
		{`"Paris"`, `{"_raw":"\"Paris\""}`},
		{`42`, `{"_raw":"42"}`},
		{`{"city":"Par`, `{"_raw":"{\"city\":\"Par"}`},
		{`not json`, `{"_raw":"not json"}`},
	} {
		out, err := messages.FromChatAnswer(completionWithCall("call_1", c.args))
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		var r struct {
			Content []struct {
				Input json.RawMessage `json:"input"`
			} `json:"content"`
		}
		if err := json.Unmarshal(out, &r); err != nil || len(r.Content) != 1 {
			t.Fatalf("%q: expected one block, got %s", c.args, out)
		}
		var got, want any
		_ = json.Unmarshal(r.Content[0].Input, &got)
		_ = json.Unmarshal([]byte(c.want), &want)
		if g, w := mustJSON(got), mustJSON(want); g != w {
			t.Errorf("arguments %q: expected input %s, got %s", c.args, w, g)
		}
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestFromChatAnswerIDs(t *testing.T) {
	out, err := messages.FromChatAnswer(completionWithCall("functions.get_weather:0", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	m := decode(t, out)
	if id, _ := m["id"].(string); !strings.HasPrefix(id, "msg_") {
		t.Errorf("expected a msg_ id, got %q", id)
	}
	block := m["content"].([]any)[0].(map[string]any)
	id, _ := block["id"].(string)
	if !toolIDPattern.MatchString(id) {
		t.Errorf("expected a tool_use id matching %s, got %q", toolIDPattern, id)
	}
	// Stable: the same upstream id maps the same way in an answer, a
	// stream and the next turn's request.
	again, _ := messages.FromChatAnswer(completionWithCall("functions.get_weather:0", `{}`))
	if id2 := decode(t, again)["content"].([]any)[0].(map[string]any)["id"]; id2 != id {
		t.Errorf("expected the same id twice, got %q and %q", id, id2)
	}
	if messages.ToolID("functions.get_weather:0") != id {
		t.Errorf("expected ToolID to give %q, got %q", id, messages.ToolID("functions.get_weather:0"))
	}
	if other := messages.ToolID("functions.get_weather.0"); other == id {
		t.Errorf("expected two ids that differ in a replaced character to stay apart, both %q", id)
	}
	if messages.ToolID("toolu_01A-b") != "toolu_01A-b" {
		t.Errorf("expected a valid id kept, got %q", messages.ToolID("toolu_01A-b"))
	}
}

func TestFromChatAnswerRequiredFields(t *testing.T) {
	out, err := messages.FromChatAnswer(completionWithCall("call_1", `{}`))
	if err != nil {
		t.Fatal(err)
	}
	m := decode(t, out)
	if v, ok := m["stop_sequence"]; !ok || v != nil {
		t.Errorf("expected stop_sequence null, got %v (present %v)", v, ok)
	}
	usage := m["usage"].(map[string]any)
	for _, k := range []string{"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
		"cache_creation", "server_tool_use", "service_tier"} {
		if _, ok := usage[k]; !ok {
			t.Errorf("expected usage.%s, got %v", k, usage)
		}
	}
}

// events splits a Messages stream into its events' data.
func events(t *testing.T, stream []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, frame := range strings.Split(string(stream), "\n\n") {
		for _, line := range strings.Split(frame, "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				out = append(out, decode(t, []byte(d)))
			}
		}
	}
	return out
}

func chunk(delta string, finish string) []byte {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` +
		delta + `,"finish_reason":` + f + `}]}`)
}

func TestChatEncoderConformance(t *testing.T) {
	enc := messages.NewChatEncoder()
	enc.PromptTokens = 321
	var out []byte
	out = append(out, enc.Chunk(chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"functions.get_weather:0","type":"function","function":{"name":"get_weather","arguments":""}}]}`, ""))...)
	out = append(out, enc.Chunk(chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"[\"Par"}}]}`, ""))...)
	out = append(out, enc.Chunk(chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"is\"]"}}]}`, ""))...)
	out = append(out, enc.Chunk(chunk(`{}`, "tool_calls"))...)
	out = append(out, enc.Chunk([]byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":300,"completion_tokens":9,"total_tokens":309}}`))...)
	out = append(out, enc.Done()...)
	var partial strings.Builder
	var sawDelta bool
	for _, ev := range events(t, out) {
		switch ev["type"] {
		case "message_start":
			msg := ev["message"].(map[string]any)
			if id, _ := msg["id"].(string); !strings.HasPrefix(id, "msg_") {
				t.Errorf("expected message_start's id to be a msg_ one, got %q", id)
			}
			u := msg["usage"].(map[string]any)
			if u["input_tokens"] != float64(321) {
				t.Errorf("expected message_start's input_tokens to be the estimate 321, got %v", u["input_tokens"])
			}
		case "content_block_start":
			id, _ := ev["content_block"].(map[string]any)["id"].(string)
			if id != messages.ToolID("functions.get_weather:0") || !toolIDPattern.MatchString(id) {
				t.Errorf("expected the tool_use id mapped, got %q", id)
			}
		case "content_block_delta":
			partial.WriteString(ev["delta"].(map[string]any)["partial_json"].(string))
		case "message_delta":
			sawDelta = true
			d := ev["delta"].(map[string]any)
			if v, ok := d["stop_sequence"]; !ok || v != nil {
				t.Errorf("expected message_delta.delta.stop_sequence null, got %v (present %v)", v, ok)
			}
			u := ev["usage"].(map[string]any)
			for _, k := range []string{"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "server_tool_use"} {
				if _, ok := u[k]; !ok {
					t.Errorf("expected message_delta usage.%s, got %v", k, u)
				}
			}
		}
	}
	var input map[string]any
	if err := json.Unmarshal([]byte(partial.String()), &input); err != nil {
		t.Errorf("expected the input_json_deltas to make a JSON object, got %q: %v", partial.String(), err)
	} else if input["_raw"] != `["Paris"]` {
		t.Errorf("expected the arguments kept under _raw, got %v", input)
	}
	if !sawDelta {
		t.Errorf("expected a message_delta, got %s", out)
	}
}

func TestErrorHasRequestID(t *testing.T) {
	m := decode(t, messages.NewError("api_error", "boom"))
	if id, _ := m["request_id"].(string); !strings.HasPrefix(id, "req_") {
		t.Errorf("expected a req_ request_id, got %v", m["request_id"])
	}
	ev := string(messages.StreamError("overloaded_error", "busy"))
	if !strings.Contains(ev, `"request_id":"req_`) {
		t.Errorf("expected the stream's error event to carry a request_id, got %s", ev)
	}
}

func TestFromChatResponseFormat(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"functions.f:0","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
		`{"role":"tool","tool_call_id":"functions.f:0","content":[{"type":"text","text":"line one"},{"type":"text","text":"line two"}]}],` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"w","strict":true,"schema":{"type":"object","properties":{"t":{"type":"string"}},"required":["t"],"additionalProperties":false}}}}`)
	out, err := messages.FromChat(body, "claude", false)
	if err != nil {
		t.Fatal(err)
	}
	m := decode(t, out)
	want := `{"format":{"schema":{"additionalProperties":false,"properties":{"t":{"type":"string"}},"required":["t"],"type":"object"},"type":"json_schema"}}`
	if got := mustJSON(m["output_config"]); got != want {
		t.Errorf("expected output_config %s, got %s", want, got)
	}
	msgs := m["messages"].([]any)
	use := msgs[1].(map[string]any)["content"].([]any)[0].(map[string]any)
	result := msgs[2].(map[string]any)["content"].([]any)[0].(map[string]any)
	if use["id"] != result["tool_use_id"] || !toolIDPattern.MatchString(use["id"].(string)) || use["id"] != messages.ToolID("functions.f:0") {
		t.Errorf("expected the tool_use and tool_result ids mapped alike, got %v and %v", use["id"], result["tool_use_id"])
	}
	if result["content"] != "line one\nline two" {
		t.Errorf("expected the tool's text parts joined by a newline, got %q", result["content"])
	}
}

var _ = provider.Chat
