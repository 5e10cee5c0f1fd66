package responses

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A request as agents send it (Codex CLI, the Agents SDK): instructions,
// a conversation of message, function_call, function_call_output and
// reasoning items, function tools, a forced tool choice, a JSON schema,
// reasoning effort; its Chat Completions form.
func TestToChat(t *testing.T) {
	body := `{"model":"g","instructions":"Be brief.","stream":true,"max_output_tokens":64,"temperature":0.2,
	"reasoning":{"effort":"low"},"text":{"format":{"type":"json_schema","name":"answer","schema":{"type":"object"},"strict":true}},
	"metadata":{"k":"v"},"tool_choice":{"type":"function","name":"shell"},"parallel_tool_calls":false,
	"tools":[{"type":"function","name":"shell","description":"Run","parameters":{"type":"object"}},{"type":"web_search","external_web_access":false},
	 {"type":"namespace","name":"agents","tools":[{"type":"function","name":"spawn","parameters":{}}]}],
	"input":[
	 {"role":"developer","content":"Use tools."},
	 {"type":"message","role":"user","content":[{"type":"input_text","text":"List "},{"type":"input_text","text":"files."},
	   {"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo=","detail":"low"}]},
	 {"type":"reasoning","id":"rs_1","encrypted_content":"xyz","summary":[]},
	 {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Sure."}]},
	 {"type":"function_call","call_id":"call_1","name":"shell","arguments":"{\"cmd\":\"ls\"}"},
	 {"type":"function_call","call_id":"call_2","name":"shell","arguments":""},
	 {"type":"function_call_output","call_id":"call_1","output":"a.txt"},
	 {"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"b"},{"type":"input_text","text":".txt"}]}
	]}`
	out, err := ToChat([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	var c chat.Request
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatal(err)
	}
	if c.Model != "g" || !c.Stream || c.StreamOptions == nil || !c.StreamOptions.IncludeUsage ||
		c.MaxCompletionTokens == nil || *c.MaxCompletionTokens != 64 || *c.Temperature != 0.2 ||
		c.ReasoningEffort != "low" || c.ParallelToolCalls == nil || *c.ParallelToolCalls {
		t.Errorf("settings: %s", out)
	}
	if rf := c.ResponseFormat; rf == nil || rf.Type != "json_schema" || rf.JSONSchema.Name != "answer" ||
		string(rf.JSONSchema.Schema) != `{"type":"object"}` || rf.JSONSchema.Strict == nil || !*rf.JSONSchema.Strict {
		t.Errorf("response_format: %s", out)
	}
	if len(c.Tools) != 2 || c.Tools[0].Function.Name != "shell" || c.Tools[1].Function.Name != "spawn" || string(c.ToolChoice) != `{"type":"function","function":{"name":"shell"}}` {
		t.Errorf("tools: %s", out)
	}
	type m struct{ role, text string }
	want := []m{{"system", "Be brief."}, {"system", "Use tools."}, {"user", ""}, {"assistant", "Sure."},
		{"tool", "a.txt"}, {"tool", "b.txt"}}
	if len(c.Messages) != len(want) {
		t.Fatalf("expected %d messages, got %s", len(want), out)
	}
	for i, w := range want {
		if got := c.Messages[i]; got.Role != w.role || w.text != "" && got.Content.String() != w.text {
			t.Errorf("message %d: expected %s %q, got %s %q", i, w.role, w.text, got.Role, got.Content.String())
		}
	}
	if p := c.Messages[2].Content.Parts; len(p) != 3 || p[0].Text != "List " || p[2].Type != "image_url" ||
		p[2].ImageURL.URL != "data:image/png;base64,iVBORw0KGgo=" || p[2].ImageURL.Detail != "low" {
		t.Errorf("user parts: %+v", p)
	}
	calls := c.Messages[3].ToolCalls
	if len(calls) != 2 || calls[0].ID != "call_1" || calls[0].Function.Arguments != `{"cmd":"ls"}` || calls[1].Function.Arguments != "{}" {
		t.Errorf("the turn's calls go with its text: %+v", calls)
	}
	if c.Messages[4].ToolCallID != "call_1" || c.Messages[5].ToolCallID != "call_2" {
		t.Errorf("tool results: %s", out)
	}

	// A string input is one user message.
	out, _ = ToChat([]byte(`{"model":"g","input":"Hi"}`))
	if !strings.Contains(string(out), `"messages":[{"role":"user","content":"Hi"}]`) {
		t.Errorf("string input: %s", out)
	}
}

// What has no Chat Completions form is refused with a message that names
// it; a continuation of provider state is ErrNeedsState.
func TestToChatRefuses(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"g","input":[{"type":"item_reference","id":"x"}]}`:                    "item_reference",
		`{"model":"g","input":[{"type":"computer_call"}]}`:                              `item type "computer_call"`,
		`{"model":"g","input":[{"role":"tool","content":"x"}]}`:                         `unsupported role "tool"`,
		`{"model":"g","input":[{"role":"user","content":[{"type":"input_audio"}]}]}`:    `unsupported part type "input_audio"`,
		`{"model":"g","input":[{"role":"user","content":[{"type":"input_image"}]}]}`:    "needs image_url",
		`{"model":"g","input":[{"type":"function_call","name":"f"}]}`:                   "call_id",
		`{"model":"g","input":"x","tool_choice":"sometimes"}`:                           "tool_choice",
		`{"model":"g","input":"x","text":{"format":{"type":"json_schema","name":"n"}}}`: "schema",
		`{"model":"g","input":""}`:                                                      "input",
		`{"input":"x"}`:                                                                 "model",
		`{"model":"g","input":7}`:                                                       "input",
		`{"model":"g","input":"x","tools":"shell"}`:                                     "tools: expected an array, got a JSON string",
		`{"model":"g","input":"x","temperature":"hot"}`:                                 "temperature: expected a number, got a JSON string",
	} {
		_, err := ToChat([]byte(body))
		if !errors.Is(err, ErrRequest) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: expected an ErrRequest naming %q, got %v", body, want, err)
		}
	}
	if _, err := ToChat([]byte(`{"model":"g","input":"x","previous_response_id":"resp_1"}`)); !errors.Is(err, ErrNeedsState) {
		t.Errorf("expected ErrNeedsState, got %v", err)
	}
}

// A chat completion as a response object: text, tool calls, usage; a
// finish by length is an incomplete response.
func TestFromChatAnswer(t *testing.T) {
	out, err := FromChatAnswer([]byte(`{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi",
	"tool_calls":[{"id":"call_9","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"length"}],
	"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}`))
	if err != nil {
		t.Fatal(err)
	}
	var r Response
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Model != "m" || r.Status != "incomplete" ||
		r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens" {
		t.Errorf("frame: %s", out)
	}
	if len(r.Output) != 2 || r.Output[0].Type != "message" || *r.Output[0].Content[0].Text != "Hi" ||
		r.Output[1].Type != "function_call" || r.Output[1].CallID != "call_9" || *r.Output[1].Args != `{"a":1}` {
		t.Errorf("output: %s", out)
	}
	if u := r.Usage; u == nil || u.InputTokens != 10 || u.OutputTokens != 5 || u.TotalTokens != 15 ||
		u.InputTokensDetails.CachedTokens != 4 || u.OutputTokensDetails.ReasoningTokens != 2 {
		t.Errorf("usage: %s", out)
	}
	if _, err := FromChatAnswer([]byte(`{"choices":[]}`)); err == nil {
		t.Error("expected an error for no choices")
	}
}

// events splits SSE output into (type, data) pairs, checking that each
// event's name is its type and the sequence numbers count from 0.
func events(t *testing.T, sse string) (types []string, data []map[string]any) {
	t.Helper()
	for i, block := range strings.Split(strings.TrimSpace(sse), "\n\n") {
		name, payload, ok := strings.Cut(block, "\ndata: ")
		if !ok || !strings.HasPrefix(name, "event: ") {
			t.Fatalf("not an event: %q", block)
		}
		var d map[string]any
		if err := json.Unmarshal([]byte(payload), &d); err != nil {
			t.Fatal(err)
		}
		if d["type"] != strings.TrimPrefix(name, "event: ") || d["sequence_number"] != float64(i) {
			t.Errorf("event %d: %q with type %v, sequence_number %v", i, name, d["type"], d["sequence_number"])
		}
		types = append(types, d["type"].(string))
		data = append(data, d)
	}
	return types, data
}

// A Chat stream with text then two tool calls, as Responses events in
// their order, the last one response.completed with everything.
func TestChatEncoder(t *testing.T) {
	e := NewChatEncoder()
	var sse string
	for _, c := range []string{
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"Hel"}}]}`,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"lo"}}]}`,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":"{\"a\""}}]}}]}`,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}`,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","function":{"name":"g","arguments":"{}"}}]}}]}`,
		`{"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`,
		`not json`,
	} {
		sse += string(e.Chunk([]byte(c)))
	}
	sse += string(e.Done())
	if e.Done() != nil || e.Chunk([]byte(`{"choices":[{"index":0,"delta":{"content":"late"}}]}`)) != nil {
		t.Error("expected nothing after the end")
	}
	types, data := events(t, sse)
	want := []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
		"response.completed"}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Fatalf("events:\n got %v\nwant %v", types, want)
	}
	if item := data[2]["item"].(map[string]any); item["content"] == nil {
		t.Errorf("a message item opens with its content array (Codex CLI needs it): %v", item)
	}
	if part := data[3]["part"].(map[string]any); part["annotations"] == nil || part["text"] != "" {
		t.Errorf("an output_text part has its text and annotations: %v", part)
	}
	if item := data[9]["item"].(map[string]any); item["content"] != nil || item["arguments"] != "" {
		t.Errorf("a function_call item has arguments, no content: %v", item)
	}
	if data[6]["text"] != "Hello" || data[12]["arguments"] != `{"a":1}` || data[9]["output_index"] != float64(1) {
		t.Errorf("done events: %v %v %v", data[6], data[12], data[9])
	}
	resp := data[len(data)-1]["response"].(map[string]any)
	out := resp["output"].([]any)
	usage := resp["usage"].(map[string]any)
	if resp["status"] != "completed" || len(out) != 3 || usage["total_tokens"] != float64(7) || resp["id"] != e.ID() {
		t.Errorf("response.completed: %v", resp)
	}
}

// Tool calls streamed without an index (some servers): a new id is a new
// call, a delta without an id more of the open one.
func TestChatEncoderCallsWithoutIndex(t *testing.T) {
	e := NewChatEncoder()
	var sse string
	for _, c := range []string{
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{\"a\""}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"arguments":":1}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c2","function":{"name":"g","arguments":"{}"}}]}}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
	} {
		sse += string(e.Chunk([]byte(c)))
	}
	sse += string(e.Done())
	_, data := events(t, sse)
	out := data[len(data)-1]["response"].(map[string]any)["output"].([]any)
	if len(out) != 2 || out[0].(map[string]any)["arguments"] != `{"a":1}` || out[1].(map[string]any)["call_id"] != "c2" ||
		out[1].(map[string]any)["arguments"] != "{}" {
		t.Errorf("expected two calls, f({\"a\":1}) and g({}), got %v", out)
	}
}

// A stream that fails after it began ends with response.failed, never a
// response.completed; one cut by length ends response.incomplete.
func TestChatEncoderEnds(t *testing.T) {
	e := NewChatEncoder()
	sse := string(e.Chunk([]byte(`{"choices":[{"index":0,"delta":{"content":"Hi"}}]}`))) + string(e.Failed("server_error", "cut"))
	types, data := events(t, sse)
	last := data[len(data)-1]["response"].(map[string]any)
	if types[len(types)-1] != "response.failed" || last["status"] != "failed" ||
		last["error"].(map[string]any)["message"] != "cut" || strings.Contains(sse, "response.completed") {
		t.Errorf("failed: %v", types)
	}
	item := last["output"].([]any)[0].(map[string]any)
	if item["status"] != "incomplete" || item["content"].([]any)[0].(map[string]any)["text"] != "Hi" {
		t.Errorf("expected what was streamed in the failed response, got %v", item)
	}
	e = NewChatEncoder()
	sse = string(e.Chunk([]byte(`{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"length"}]}`))) + string(e.Done())
	types, data = events(t, sse)
	last = data[len(data)-1]["response"].(map[string]any)
	if types[len(types)-1] != "response.incomplete" || last["incomplete_details"].(map[string]any)["reason"] != "max_output_tokens" {
		t.Errorf("incomplete: %v", types)
	}
	// The router's own failure after a native relay continues its numbering.
	_, data = events(t, string(FailedEvent(0, "resp_p", "gpt", "rate_limit_exceeded", "x")))
	if r := data[0]["response"].(map[string]any); data[0]["type"] != "response.failed" || r["id"] != "resp_p" || r["model"] != "gpt" {
		t.Errorf("FailedEvent: expected the provider's response failed, got %v", data)
	}
	if !strings.Contains(string(FailedEvent(7, "", "", "c", "m")), `"sequence_number":7`) {
		t.Error("expected FailedEvent numbered 7")
	}
}

// A provider's Responses stream, relayed as it came: deltas and a call's
// start are first tokens; response.completed ends it (and is relayed);
// response.failed and error are in-band errors; bad JSON is one too.
func TestDecoder(t *testing.T) {
	var gotCode string
	d := NewDecoder(func(code, message string) provider.Observation {
		gotCode = code
		o := provider.NewObservation(provider.RateLimited)
		o.Message = message
		return o
	})
	for _, c := range []struct {
		data string
		kind provider.EventKind
	}{
		{`{"type":"response.created","sequence_number":0,"response":{"id":"r"}}`, provider.EventSkip},
		{`{"type":"response.output_item.added","sequence_number":1,"item":{"type":"message"}}`, provider.EventSkip},
		{`{"type":"response.output_text.delta","sequence_number":2,"delta":""}`, provider.EventSkip},
		{`{"type":"response.output_text.delta","sequence_number":3,"delta":"Hi"}`, provider.EventData},
		{`{"type":"response.output_item.added","sequence_number":4,"item":{"type":"function_call"}}`, provider.EventData},
		{`{"type":"response.function_call_arguments.delta","sequence_number":5,"delta":"{}"}`, provider.EventData},
	} {
		out, kind, _ := d.Decode(&provider.Event{Data: []byte(c.data)})
		if kind != c.kind || string(out.Data) != c.data {
			t.Errorf("%s: expected kind %d relayed, got %d %q", c.data, c.kind, kind, out.Data)
		}
	}
	if d.Complete() || d.Next() != 6 {
		t.Errorf("expected incomplete, next 6; got %v %d", d.Complete(), d.Next())
	}
	out, kind, _ := d.Decode(&provider.Event{Data: []byte(`{"type":"response.completed","sequence_number":6,"response":{"status":"completed"}}`)})
	if kind != provider.EventDone || len(out.Data) == 0 || !d.Complete() {
		t.Errorf("expected response.completed relayed as the end, got %d %q", kind, out.Data)
	}
	_, kind, obs := d.Decode(&provider.Event{Data: []byte(`{"type":"response.failed","response":{"status":"failed","error":{"code":"rate_limit_exceeded","message":"slow down"}}}`)})
	if kind != provider.EventError || obs.Class != provider.RateLimited || obs.Message != "slow down" || gotCode != "rate_limit_exceeded" {
		t.Errorf("response.failed: %d %+v %q", kind, obs, gotCode)
	}
	_, kind, _ = d.Decode(&provider.Event{Name: "error", Data: []byte(`{"type":"error","code":"server_error","message":"x"}`)})
	if kind != provider.EventError || gotCode != "server_error" {
		t.Errorf("error event: %d %q", kind, gotCode)
	}
	_, kind, obs = d.Decode(&provider.Event{Data: []byte(`{"type":`)})
	if kind != provider.EventError || obs.Class != provider.Server {
		t.Errorf("bad JSON: %d %+v", kind, obs)
	}
}
