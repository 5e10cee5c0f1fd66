package adapters

import (
	"reflect"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages/messagestest"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// anthropicWithTools (anthropic_test.go) as the router hands it on.
const chatFromMessages = `{
 "model": "claude-sonnet-4-5",
 "messages": [
  {"role": "system", "content": "You are a weather bot.\n\nAnswer in one line."},
  {"role": "user", "content": [
    {"type": "text", "text": "What is in these pictures, and how is the weather in Paris?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}},
    {"type": "image_url", "image_url": {"url": "https://upload.example.org/cat.jpg"}}
  ]},
  {"role": "assistant", "content": "Let me check.", "tool_calls": [
    {"id": "call_a1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"c\"}"}},
    {"id": "call_b2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
  ]},
  {"role": "tool", "tool_call_id": "call_a1", "content": "{\"temp\":21}"},
  {"role": "tool", "tool_call_id": "call_b2", "content": "14:05"},
  {"role": "user", "content": "Thanks. And tomorrow?"}
 ],
 "max_tokens": 512,
 "temperature": 0.3,
 "top_p": 0.9,
 "stop": ["\n\nUser:"],
 "tools": [
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
 ],
 "tool_choice": "auto",
 "user": "user-42",
 "stream": true,
 "stream_options": {"include_usage": true}
}`

func TestMessagesToChat(t *testing.T) {
	chat, err := messages.ToChat([]byte(anthropicWithTools))
	if err != nil {
		t.Fatal(err)
	}
	if !jsontest.Same(t, chat, chatFromMessages) {
		t.Errorf("expected %s\ngot      %s", jsontest.Compact(chatFromMessages), chat)
	}
	// And back: the Messages request the anthropic adapter sends upstream
	// is the client's own.
	back, err := messages.FromChat(chat, "claude-sonnet-4-5", true)
	if err != nil {
		t.Fatal(err)
	}
	if !jsontest.Same(t, back, anthropicWithTools) {
		t.Errorf("round trip: expected %s\ngot      %s", jsontest.Compact(anthropicWithTools), back)
	}

	for _, tc := range []struct{ name, in, want string }{
		{
			"minimal, not streamed",
			`{"model":"claude-x","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"claude-x","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			"tool choices, system blocks, a thinking-only turn, an image and an error in a tool result, a text document",
			`{"model":"m","max_tokens":1,"system":[{"type":"text","text":"A","cache_control":{"type":"ephemeral"}},{"type":"text","text":"B"}],
			  "messages":[{"role":"user","content":"q"},
			   {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"}]},
			   {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"shot","input":{"url":"x"}}]},
			   {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","is_error":false,"content":[{"type":"text","text":"taken"},
			     {"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"/9j/"}}]},
			    {"type":"document","source":{"type":"text","media_type":"text/plain","data":"notes"}}]}],
			  "tools":[{"name":"shot","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"shot","disable_parallel_tool_use":true},
			  "top_k":5,"thinking":{"type":"enabled","budget_tokens":1024}}`,
			`{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"A\n\nB"},{"role":"user","content":"q"},
			   {"role":"assistant","content":null,"tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"shot","arguments":"{\"url\":\"x\"}"}}]},
			   {"role":"tool","tool_call_id":"toolu_1","content":"taken"},
			   {"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,/9j/"}},{"type":"text","text":"notes"}]}],
			  "tools":[{"type":"function","function":{"name":"shot","parameters":{"type":"object"}}}],
			  "tool_choice":{"type":"function","function":{"name":"shot"}},"parallel_tool_calls":false}`,
		},
		{
			"any and none",
			`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"q"}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"any"}}`,
			`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":"required"}`,
		},
	} {
		got, err := messages.ToChat([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !jsontest.Same(t, got, tc.want) {
			t.Errorf("%s:\nexpected %s\ngot      %s", tc.name, jsontest.Compact(tc.want), got)
		}
	}
}

// encodeStream runs an Anthropic upstream stream through the anthropic
// decoder and the Messages encoder, as the router would for a Messages
// client routed to an Anthropic deployment.
func encodeStream(t *testing.T, dec eventDecoder, sse string) []byte {
	t.Helper()
	enc := messages.NewChatEncoder()
	var out []byte
	r := provider.NewSSEReader(strings.NewReader(sse))
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		data, kind, obs := dec.Event(ev)
		switch kind {
		case provider.EventData, provider.EventFinal:
			out = append(out, enc.Chunk(data)...)
		case provider.EventError:
			return append(out, messages.StreamError(messages.ErrorType(529), obs.Message)...)
		case provider.EventDone:
			return append(out, enc.Done()...)
		}
	}
	return append(out, enc.Done()...)
}

func TestMessagesStreamRoundTrip(t *testing.T) {
	orig := messagestest.Assemble(t, []byte(anthropicToolStream))
	got := messagestest.Assemble(t, encodeStream(t, chatDecoder(byName("anthropic", provider.Endpoint{})), anthropicToolStream))
	wantEvents := "message_start content_block_start content_block_delta content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop message_delta message_stop" // a tool_use block whole
	if strings.Join(got.Events, " ") != wantEvents {
		t.Errorf("events: expected %s\ngot %s", wantEvents, strings.Join(got.Events, " "))
	}
	orig.Events, got.Events = nil, nil
	if !reflect.DeepEqual(got, orig) {
		t.Errorf("expected the message %+v\ngot %+v", orig, got)
	}

	// A Gemini stream for a Messages client.
	got = messagestest.Assemble(t, encodeStream(t, chatDecoder(byName("gemini", provider.Endpoint{})), geminiSSE))
	if len(got.Blocks) != 3 || got.Blocks[0].Text != "The weather in Paris is worth a look:" ||
		got.Blocks[1].Name != "get_weather" || got.Blocks[1].Input != `{"city":"Paris"}` || got.Blocks[2].Input != `{}` ||
		got.StopReason != "tool_use" || got.InputTokens != 12 || got.OutputToks != 33 || got.Model != "gemini-2.5-flash" {
		t.Errorf("unexpected message from a Gemini stream: %+v", got)
	}

	// A failure mid-stream ends with an error event and no message_stop.
	out := encodeStream(t, chatDecoder(byName("anthropic", provider.Endpoint{})), `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","model":"claude-x","usage":{"input_tokens":3}}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}

event: error
data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}

`)
	if !strings.Contains(string(out), "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"},\"request_id\":\"req_") ||
		!strings.HasSuffix(string(out), "\"}\n\n") ||
		strings.Contains(string(out), "message_stop") {
		t.Errorf("expected the stream to end with an error event, got %s", out)
	}
}
