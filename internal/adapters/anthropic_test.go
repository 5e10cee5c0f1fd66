package adapters

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// A realistic agent turn: system prompt, an image question, a tool call and
// its result, then a follow-up.
const chatWithTools = `{
 "model": "smart",
 "messages": [
  {"role": "system", "content": "You are a weather bot."},
  {"role": "developer", "content": [{"type": "text", "text": "Answer in one line."}]},
  {"role": "user", "content": [
    {"type": "text", "text": "What is in these pictures, and how is the weather in Paris?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==", "detail": "high"}},
    {"type": "image_url", "image_url": {"url": "https://upload.example.org/cat.jpg"}}
  ]},
  {"role": "assistant", "content": "Let me check.", "tool_calls": [
    {"id": "call_a1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"c\"}"}},
    {"id": "call_b2", "type": "function", "function": {"name": "get_time", "arguments": ""}}
  ]},
  {"role": "tool", "tool_call_id": "call_a1", "content": "{\"temp\":21}"},
  {"role": "tool", "tool_call_id": "call_b2", "content": [{"type": "text", "text": "14:05"}]},
  {"role": "user", "content": "Thanks. And tomorrow?"}
 ],
 "tools": [
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time"}}
 ],
 "tool_choice": "auto",
 "stop": ["\n\nUser:"],
 "temperature": 0.3,
 "top_p": 0.9,
 "max_completion_tokens": 512,
 "user": "user-42",
 "stream": true,
 "stream_options": {"include_usage": true},
 "logprobs": false
}`

const anthropicWithTools = `{
 "model": "claude-sonnet-4-5",
 "system": "You are a weather bot.\n\nAnswer in one line.",
 "messages": [
  {"role": "user", "content": [
    {"type": "text", "text": "What is in these pictures, and how is the weather in Paris?"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUg=="}},
    {"type": "image", "source": {"type": "url", "url": "https://upload.example.org/cat.jpg"}}
  ]},
  {"role": "assistant", "content": [
    {"type": "text", "text": "Let me check."},
    {"type": "tool_use", "id": "call_a1", "name": "get_weather", "input": {"city": "Paris", "unit": "c"}},
    {"type": "tool_use", "id": "call_b2", "name": "get_time", "input": {}}
  ]},
  {"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "call_a1", "content": "{\"temp\":21}"},
    {"type": "tool_result", "tool_use_id": "call_b2", "content": "14:05"},
    {"type": "text", "text": "Thanks. And tomorrow?"}
  ]}
 ],
 "max_tokens": 512,
 "tools": [
  {"name": "get_weather", "description": "Current weather",
   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}},
  {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
 ],
 "tool_choice": {"type": "auto"},
 "stop_sequences": ["\n\nUser:"],
 "temperature": 0.3,
 "top_p": 0.9,
 "stream": true,
 "metadata": {"user_id": "user-42"}
}`

func TestAnthropicChatRequest(t *testing.T) {
	ep := &provider.Endpoint{BaseURL: "https://api.anthropic.com/v1", APIKey: "sk-ant-provider",
		Header: http.Header{"Anthropic-Beta": {"prompt-caching-2024-07-31"}}}
	req, err := chatRequest(byName("anthropic", *ep), "claude-sonnet-4-5", []byte(chatWithTools), true)
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != http.MethodPost || req.URL.String() != "https://api.anthropic.com/v1/messages" {
		t.Errorf("expected POST https://api.anthropic.com/v1/messages, got %s %s", req.Method, req.URL)
	}
	for k, want := range map[string]string{
		"X-Api-Key": "sk-ant-provider", "Anthropic-Version": "2023-06-01", "Content-Type": "application/json",
		"Accept": "text/event-stream", "Anthropic-Beta": "prompt-caching-2024-07-31", "Authorization": "",
	} {
		if got := req.Header.Get(k); got != want {
			t.Errorf("header %s: expected %q, got %q", k, want, got)
		}
	}
	body, _ := io.ReadAll(req.Body)
	if !jsontest.Same(t, body, anthropicWithTools) {
		t.Errorf("expected %s\ngot %s", jsontest.Compact(anthropicWithTools), body)
	}

	// No key: no x-api-key; the operator's anthropic-version wins.
	ep = &provider.Endpoint{BaseURL: "http://127.0.0.1:9/v1", Header: http.Header{"Anthropic-Version": {"2099-01-01"}}}
	req, err = chatRequest(byName("anthropic", *ep), "m", []byte(`{"messages":[{"role":"user","content":"hi"}]}`), false)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := req.Header["X-Api-Key"]; ok || req.Header.Get("Anthropic-Version") != "2099-01-01" || req.Header.Get("Accept") != "application/json" {
		t.Errorf("unexpected headers %v", req.Header)
	}
}

func TestAnthropicRequestTranslation(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{
			"consecutive same-role messages merge; max_tokens defaults to 4096",
			`{"messages":[{"role":"user","content":"one"},{"role":"user","content":"two"},
			  {"role":"assistant","content":"a"},{"role":"assistant","content":[{"type":"text","text":"b"}]},{"role":"user","content":"three"}]}`,
			`{"model":"m","max_tokens":4096,"messages":[
			  {"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]},
			  {"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
			  {"role":"user","content":[{"type":"text","text":"three"}]}]}`,
		},
		{
			"max_tokens, stop string, required tool choice, no parallel calls, temperature clamped to Anthropic's range",
			`{"max_tokens":77,"stop":"END","temperature":1.7,"messages":[{"role":"user","content":"x"}],
			  "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
			  "tool_choice":"required","parallel_tool_calls":false}`,
			`{"model":"m","max_tokens":77,"stop_sequences":["END"],"temperature":1,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
			  "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true}}`,
		},
		{
			"a named function; tool_choice none",
			`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],
			  "tool_choice":{"type":"function","function":{"name":"f"}}}`,
			`{"model":"m","max_tokens":4096,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],
			  "tools":[{"name":"f","input_schema":{"type":"object","properties":{}}}],"tool_choice":{"type":"tool","name":"f"}}`,
		},
		{
			"tool_choice without tools is dropped; empty texts dropped",
			`{"messages":[{"role":"user","content":[{"type":"text","text":""},{"type":"text","text":"x"}]}],"tool_choice":"none"}`,
			`{"model":"m","max_tokens":4096,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		},
		{
			"cache_control keeps system blocks; a prefill loses trailing white space",
			`{"messages":[{"role":"system","content":[{"type":"text","text":"big context","cache_control":{"type":"ephemeral"}}]},
			  {"role":"user","content":"x"},{"role":"assistant","content":"Sure: \n"}]}`,
			`{"model":"m","max_tokens":4096,"system":[{"type":"text","text":"big context","cache_control":{"type":"ephemeral"}}],
			  "messages":[{"role":"user","content":[{"type":"text","text":"x"}]},{"role":"assistant","content":[{"type":"text","text":"Sure:"}]}]}`,
		},
		{
			"other providers' tool ids made acceptable, still paired; bad arguments become {}",
			`{"messages":[{"role":"user","content":"x"},
			  {"role":"assistant","tool_calls":[{"id":"functions.get:0","type":"function","function":{"name":"get","arguments":"{not json"}}]},
			  {"role":"tool","tool_call_id":"functions.get:0","content":"ok"}]}`,
			`{"model":"m","max_tokens":4096,"messages":[{"role":"user","content":[{"type":"text","text":"x"}]},
			  {"role":"assistant","content":[{"type":"tool_use","id":"functions_get_0_8b40afa6","name":"get","input":{}}]},
			  {"role":"user","content":[{"type":"tool_result","tool_use_id":"functions_get_0_8b40afa6","content":"ok"}]}]}`,
		},
		{
			"a PDF file part becomes a document",
			`{"messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBERi0=","filename":"a.pdf"}}]}]}`,
			`{"model":"m","max_tokens":4096,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0="}}]}]}`,
		},
	} {
		got, err := messages.FromChat([]byte(tc.in), "m", false)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !jsontest.Same(t, got, tc.want) {
			t.Errorf("%s:\nexpected %s\ngot      %s", tc.name, jsontest.Compact(tc.want), got)
		}
	}
}

func TestAnthropicRequestErrors(t *testing.T) {
	for _, in := range []string{
		`[]`, `"x"`, `{"messages":"x"}`,
		`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x","format":"wav"}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"ftp://x/y.png"}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-abc"}}]}]}`,
		`{"messages":[{"role":"wizard","content":"x"}]}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search"}]}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"sometimes"}`,
		`{"messages":[{"role":"user","content":"x"}],"stop":5}`,
		`{"messages":[{"role":"user","content":"x"}],"n":2}`,
		`{"messages":[{"role":"system","content":"only a system prompt"}]}`,
	} {
		if _, err := chatRequest(byName("anthropic", provider.Endpoint{BaseURL: "http://x"}), "m", []byte(in), false); err == nil {
			t.Errorf("%s: expected an error, got none", in)
		}
	}
}

func TestAnthropicChatResponse(t *testing.T) {
	_, body := readFixture(t, "anthropic-200.http")
	got, err := chatAnswer(byName("anthropic", provider.Endpoint{}), body)
	if err != nil {
		t.Fatal(err)
	}
	got = withoutCreated(t, got)
	want := `{"id":"msg_FAKE1","object":"chat.completion","model":"claude-x","choices":[{"index":0,
	  "message":{"role":"assistant","content":"Hello.","refusal":null},"logprobs":null,"finish_reason":"stop"}],
	  "usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`
	if !jsontest.Same(t, got, want) {
		t.Errorf("expected %s\ngot %s", jsontest.Compact(want), got)
	}

	// Text in several blocks, a thinking block, two tool calls, cache usage.
	body = []byte(`{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-opus-4-1-20250805",
	 "content":[{"type":"thinking","thinking":"The user wants...","signature":"EqQBCgIYAhIM"},
	  {"type":"text","text":"I'll check "},{"type":"text","text":"both."},
	  {"type":"tool_use","id":"toolu_01A","name":"get_weather","input":{"location":"San Francisco, CA"}},
	  {"type":"tool_use","id":"toolu_01B","name":"get_time","input":{}}],
	 "stop_reason":"tool_use","stop_sequence":null,
	 "usage":{"input_tokens":20,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":50}}`)
	got, err = chatAnswer(byName("anthropic", provider.Endpoint{}), body)
	if err != nil {
		t.Fatal(err)
	}
	got = withoutCreated(t, got)
	want = `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","object":"chat.completion","model":"claude-opus-4-1-20250805","choices":[{"index":0,
	  "message":{"role":"assistant","content":"I'll check both.","refusal":null,"tool_calls":[
	   {"id":"toolu_01A","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"San Francisco, CA\"}"}},
	   {"id":"toolu_01B","type":"function","function":{"name":"get_time","arguments":"{}"}}]},
	  "logprobs":null,"finish_reason":"tool_calls"}],
	  "usage":{"prompt_tokens":1120,"completion_tokens":50,"total_tokens":1170,"prompt_tokens_details":{"cached_tokens":1000,"cache_write_tokens":100}}}`
	if !jsontest.Same(t, got, want) {
		t.Errorf("expected %s\ngot %s", jsontest.Compact(want), got)
	}

	// Only tool calls: content is null, as OpenAI sends it.
	got, _ = chatAnswer(byName("anthropic", provider.Endpoint{}), []byte(`{"type":"message","model":"c","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}],"stop_reason":"tool_use","usage":{}}`))
	if !strings.Contains(string(got), `"content":null`) {
		t.Errorf("expected null content beside tool calls, got %s", got)
	}
}

func TestAnthropicFinishReasons(t *testing.T) {
	for stop, want := range map[string]string{
		"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
		"refusal": "content_filter", "pause_turn": "stop", "model_context_window_exceeded": "length", "": "stop",
	} {
		if got := messages.FinishReason(stop); got != want {
			t.Errorf("%q: expected %s, got %s", stop, want, got)
		}
	}
}

// A stream as Anthropic sends it for a tool-using answer
// (https://docs.anthropic.com/en/docs/build-with-claude/streaming).
const anthropicToolStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2},"content":[],"stop_reason":null}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":", let's check the weather for San Francisco, CA:"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"San Francisco, CA\", \"unit\": \"fahrenheit\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_02","name":"get_time","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}

event: message_stop
data: {"type":"message_stop"}

`

func TestAnthropicStream(t *testing.T) {
	res := runStream(t, chatDecoder(byName("anthropic", provider.Endpoint{})), anthropicToolStream)
	S, D, F := provider.EventSkip, provider.EventData, provider.EventFinal
	wantKinds := []provider.EventKind{S, S, S, D, D, S, D, S, D, D, S, D, D, S, F, provider.EventDone} // an empty input_json_delta is no token (S)
	if !equalKinds(res.kinds, wantKinds) {
		t.Errorf("kinds: expected %v, got %v", wantKinds, res.kinds)
	}
	if want := "Okay, let's check the weather for San Francisco, CA:"; res.content != want {
		t.Errorf("content: expected %q, got %q", want, res.content)
	}
	if len(res.roles) != 1 || res.roles[0] != "assistant" || !strings.Contains(res.chunks[0], `"role":"assistant"`) {
		t.Errorf("expected the role once, in the first chunk, got %v", res.roles)
	}
	if len(res.tools) != 2 {
		t.Fatalf("expected 2 tool calls, got %d", len(res.tools))
	}
	for i, want := range []accCall{
		{"toolu_01T1x1fJ34qAmk2tNTrN7Up6", "function", "get_weather", `{"location": "San Francisco, CA", "unit": "fahrenheit"}`},
		{"toolu_02", "function", "get_time", `{}`},
	} {
		if *res.tools[i] != want {
			t.Errorf("tool call %d: expected %+v, got %+v", i, want, *res.tools[i])
		}
	}
	if res.lastContentKind() != provider.EventFinal || res.finish != "tool_calls" {
		t.Errorf("expected a final event with finish_reason tool_calls, got %v %q", res.lastContentKind(), res.finish)
	}
	if u := res.usage; u == nil || u.PromptTokens != 472 || u.CompletionTokens != 89 || u.TotalTokens != 561 {
		t.Errorf("expected usage 472+89=561, got %+v", u)
	}
	if len(res.ids) != 1 || !res.ids["msg_014p7gG3wDgGV9EUtLvnow3U"] || len(res.models) != 1 || !res.models["claude-sonnet-4-5-20250929"] {
		t.Errorf("expected every chunk with the message's id and model, got %v %v", res.ids, res.models)
	}
}

func TestAnthropicMidstreamOverloaded(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "streams", "anthropic-midstream-overloaded.sse"))
	if err != nil {
		t.Fatal(err)
	}
	res := runStream(t, chatDecoder(byName("anthropic", provider.Endpoint{})), string(raw))
	// message_start, content_block_start and ping are no first token.
	want := []provider.EventKind{provider.EventSkip, provider.EventSkip, provider.EventSkip, provider.EventData, provider.EventError}
	if !equalKinds(res.kinds, want) {
		t.Errorf("expected %v, got %v", want, res.kinds)
	}
	if res.content != "Hello" {
		t.Errorf("expected content %q, got %q", "Hello", res.content)
	}
	if res.errObs.Class != provider.Overloaded || res.errObs.Message != "Overloaded" {
		t.Errorf("expected class overloaded from the error type (the status was 200), got %s %q", res.errObs.Class, res.errObs.Message)
	}
}

func TestAnthropicStreamErrorTypes(t *testing.T) {
	for typ, want := range map[string]provider.Class{
		"overloaded_error":      provider.Overloaded,
		"rate_limit_error":      provider.RateLimited,
		"api_error":             provider.Server,
		"timeout_error":         provider.Server,
		"authentication_error":  provider.Auth,
		"permission_error":      provider.Auth,
		"billing_error":         provider.QuotaExhausted,
		"invalid_request_error": provider.ClientError,
		"something_new_error":   provider.Server,
	} {
		ev := &provider.Event{Name: "error", Data: []byte(`{"type":"error","error":{"type":"` + typ + `","message":"m"}}`)}
		_, kind, obs := chatDecoder(byName("anthropic", provider.Endpoint{})).Event(ev)
		if kind != provider.EventError || obs.Class != want {
			t.Errorf("%s: expected an error event of class %s, got %d %s", typ, want, kind, obs.Class)
		}
	}
}

func TestAnthropicObserve(t *testing.T) {
	date := "Thu, 21 Aug 2025 12:40:00 GMT"
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   provider.Class
	}{
		{"invalid key", 401, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`, provider.Auth},
		{"no access", 403, `{"type":"error","error":{"type":"permission_error","message":"not allowed"}}`, provider.Auth},
		{"credits", 400, `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}`, provider.QuotaExhausted},
		{"billing", 402, `{"type":"error","error":{"type":"billing_error","message":"payment required"}}`, provider.QuotaExhausted},
		{"spend limit", 429, `{"type":"error","error":{"type":"rate_limit_error","message":"You have reached your specified API usage limits.","details":{"error_code":"enforced_spend_limit_reached"}}}`, provider.QuotaExhausted},
		{"context", 400, `{"type":"error","error":{"type":"invalid_request_error","message":"input length and ` + "`max_tokens`" + ` exceed context limit: 188240 + 21333 > 200000, decrease input length or ` + "`max_tokens`" + ` and try again"}}`, provider.ContextLength},
		{"bad request", 400, `{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate"}}`, provider.ClientError},
		{"retired model", 404, `{"type":"error","error":{"type":"not_found_error","message":"model: claude-9"}}`, provider.Server},
		{"too large", 413, `{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}`, provider.ClientError},
		{"internal", 500, `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`, provider.Server},
		{"timeout", 504, `{"type":"error","error":{"type":"timeout_error","message":"Request timed out"}}`, provider.Server},
		{"proxy page", 502, `<html><body>Bad Gateway</body></html>`, provider.Server},
		{"unavailable", 503, ``, provider.Overloaded},
		{"garbage 429", 429, `{{{`, provider.RateLimited},
	} {
		h := http.Header{"Date": {date}}
		o := (&Anthropic{}).Observe(tc.status, h, []byte(tc.body), time.Now())
		if o.Class != tc.want {
			t.Errorf("%s: expected %s, got %s (%q)", tc.name, tc.want, o.Class, o.Message)
		}
		if o.Requests != provider.UnknownWindow || o.Tokens != provider.UnknownWindow {
			t.Errorf("%s: no headers, expected unknown windows, got %+v %+v", tc.name, o.Requests, o.Tokens)
		}
	}
}

func TestAnthropicTokenWindows(t *testing.T) {
	now := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("Date", now.Format(http.TimeFormat))
	set := func(kind, limit, remaining, reset string) {
		h.Set("anthropic-ratelimit-"+kind+"-limit", limit)
		h.Set("anthropic-ratelimit-"+kind+"-remaining", remaining)
		h.Set("anthropic-ratelimit-"+kind+"-reset", reset)
	}
	set("tokens", "96000", "90000", "2025-08-21T12:40:30Z")
	set("input-tokens", "80000", "0", "2025-08-21T12:40:12Z")
	set("output-tokens", "16000", "15000", "2025-08-21T12:41:00Z")
	o := (&Anthropic{}).Observe(200, h, nil, now)
	if want := (provider.Window{Limit: 80000, Remaining: 0, Reset: 12 * time.Second, Instant: true, Resolution: time.Second,
		Counts: provider.CountsUncachedInput}); o.Tokens != want {
		t.Errorf("an exhausted input window (of uncached input) is the tightest: expected %+v, got %+v", want, o.Tokens)
	}
	set("input-tokens", "80000", "70000", "2025-08-21T12:40:12Z")
	set("output-tokens", "16000", "1600", "2025-08-21T12:41:00Z")
	o = (&Anthropic{}).Observe(200, h, nil, now)
	if want := (provider.Window{Limit: 16000, Remaining: 1600, Reset: time.Minute, Instant: true, Resolution: time.Second,
		Counts: provider.CountsOutput}); o.Tokens != want {
		t.Errorf("10%% output left (of output tokens) is the tightest: expected %+v, got %+v", want, o.Tokens)
	}
	// Garbage is unknown, not zero.
	h = http.Header{}
	h.Set("anthropic-ratelimit-requests-limit", "many")
	h.Set("anthropic-ratelimit-requests-remaining", "-3")
	h.Set("anthropic-ratelimit-requests-reset", "later")
	h.Set("retry-after", "soon")
	o = (&Anthropic{}).Observe(200, h, nil, now)
	if o.Requests != provider.UnknownWindow || o.Tokens != provider.UnknownWindow || o.RetryAfter != provider.Unknown {
		t.Errorf("expected garbage decoded as unknown, got %+v", o)
	}
}

// What the client is told of a client error passed on (restated by the
// client API, see internal/api): class, message and the provider's code.
func TestAnthropicErrorObservation(t *testing.T) {
	resp, body := readFixture(t, "anthropic-400-prompt-too-long.http")
	o := (&Anthropic{}).Observe(resp.StatusCode, resp.Header, body, time.Now())
	if o.Class != provider.ContextLength || o.Message != "prompt is too long: 210000 tokens > 200000 maximum" || o.Code != "" {
		t.Errorf("expected context_length with the message, got %+v", o)
	}
	o = (&Anthropic{}).Observe(502, http.Header{}, []byte("<html>"), time.Now())
	if o.Class != provider.Server || o.Message != "an HTML page" {
		t.Errorf("expected a server error saying it was an HTML page, got %+v", o)
	}
	nginx := "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>"
	if o = (&Anthropic{}).Observe(502, http.Header{}, []byte(nginx), time.Now()); o.Message != "an HTML page: 502 Bad Gateway" {
		t.Errorf("expected the page's title, got %q", o.Message)
	}
	if o = (&Anthropic{}).Observe(502, http.Header{}, []byte("<div>upstream\n  connect error</div>"), time.Now()); o.Message != "an HTML page: upstream connect error" {
		t.Errorf("expected the page's text, got %q", o.Message)
	}
	o = (&Anthropic{}).Observe(429, http.Header{}, []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"spent","details":{"error_code":"enforced_spend_limit_reached"}}}`), time.Now())
	if o.Class != provider.QuotaExhausted || o.Code != "enforced_spend_limit_reached" {
		t.Errorf("expected quota_exhausted with its error_code, got %+v", o)
	}
	// A long message is cut for the client at a character, never inside one.
	long := "a" + strings.Repeat("é", 400) // 801 bytes: byte 500 is inside an "é"
	o = (&Anthropic{}).Observe(400, http.Header{}, []byte(`{"type":"error","error":{"type":"invalid_request_error","message":"`+long+`"}}`), time.Now())
	if !utf8.ValidString(o.Message) || !strings.HasSuffix(o.Message, "...") || len(o.Message) > 503 {
		t.Errorf("expected a valid UTF-8 excerpt of at most 500 bytes and \"...\", got %d bytes, valid %v", len(o.Message), utf8.ValidString(o.Message))
	}
}

// Thinking is the model producing: a first token, with nothing for a Chat
// Completions client.
func TestAnthropicThinkingIsProgress(t *testing.T) {
	dec := chatDecoder(byName("anthropic", provider.Endpoint{}))
	for _, d := range []string{
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me think"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}`,
	} {
		out, kind, _ := dec.Event(&provider.Event{Name: "content_block_delta", Data: []byte(d)})
		if kind != provider.EventData || len(out) != 0 {
			t.Errorf("%s: expected progress (provider.EventData, nothing to relay), got %d %q", d, kind, out)
		}
	}
}

// The unified limits refuse the account only when the overall status is
// rejected: then until the latest reset stated (any unit), or as a quota
// when none is; an overage window or a warning refuses nothing.
func TestAnthropicUnifiedLimits(t *testing.T) {
	now := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC) // 1755780000
	body := []byte(`{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`)
	for _, tc := range []struct {
		name  string
		hdr   []string
		class provider.Class
		retry time.Duration
	}{
		{"overage rejected only", []string{"retry-after", "20", "anthropic-ratelimit-unified-status", "allowed",
			"anthropic-ratelimit-unified-overage-status", "rejected", "anthropic-ratelimit-unified-overage-reset", "1756339200"},
			provider.RateLimited, 20 * time.Second},
		{"allowed_warning", []string{"retry-after", "20", "anthropic-ratelimit-unified-status", "allowed_warning",
			"anthropic-ratelimit-unified-reset", "1755787999"}, provider.RateLimited, 20 * time.Second},
		{"rejected, reset in milliseconds", []string{"anthropic-ratelimit-unified-status", "rejected",
			"anthropic-ratelimit-unified-reset", "1755787999000"}, provider.RateLimited, 7999 * time.Second},
		{"rejected, spaced and capitalized", []string{"anthropic-ratelimit-unified-status", " Rejected ",
			"anthropic-ratelimit-unified-reset", "1755787999"}, provider.RateLimited, 7999 * time.Second},
		{"rejected, garbage reset", []string{"retry-after", "20", "anthropic-ratelimit-unified-status", "rejected",
			"anthropic-ratelimit-unified-reset", "soon"}, provider.RateLimited, 20 * time.Second},
		{"5h rejected, overage rejected later", []string{"anthropic-ratelimit-unified-status", "rejected",
			"anthropic-ratelimit-unified-5h-status", "rejected", "anthropic-ratelimit-unified-5h-reset", "1755787999",
			"anthropic-ratelimit-unified-overage-status", "rejected", "anthropic-ratelimit-unified-overage-reset", "1756339200"},
			provider.RateLimited, 7999 * time.Second},
		{"rejected, no reset", []string{"anthropic-ratelimit-unified-status", "rejected",
			"anthropic-ratelimit-unified-5h-status", "rejected"}, provider.QuotaExhausted, provider.Unknown},
	} {
		o := (&Anthropic{}).Observe(429, headerOf(tc.hdr...), body, now)
		if o.Class != tc.class || o.RetryAfter != tc.retry {
			t.Errorf("%s: expected %s after %v, got %s after %v", tc.name, tc.class, tc.retry, o.Class, o.RetryAfter)
		}
	}
}
