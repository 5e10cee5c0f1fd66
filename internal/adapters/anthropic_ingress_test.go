package adapters

import (
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"

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
	chat, model, stream, err := messages.ToChat([]byte(anthropicWithTools))
	if err != nil {
		t.Fatal(err)
	}
	if model != "claude-sonnet-4-5" || !stream {
		t.Errorf("expected model claude-sonnet-4-5 and a stream, got %q %v", model, stream)
	}
	if !sameJSON(t, chat, chatFromMessages) {
		t.Errorf("expected %s\ngot      %s", compact(chatFromMessages), chat)
	}
	// And back: the Messages request the anthropic adapter sends upstream
	// is the client's own.
	back, err := messages.FromChat(chat, model, stream)
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, back, anthropicWithTools) {
		t.Errorf("round trip: expected %s\ngot      %s", compact(anthropicWithTools), back)
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
		got, _, _, err := messages.ToChat([]byte(tc.in))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if !sameJSON(t, got, tc.want) {
			t.Errorf("%s:\nexpected %s\ngot      %s", tc.name, compact(tc.want), got)
		}
	}
}

func TestMessagesToChatErrors(t *testing.T) {
	for _, in := range []string{
		`not json`,
		`[]`,
		`{"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":10}`,
		`{"model":"m","max_tokens":10,"messages":[]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":"ten","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"system","content":"hi"}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":42}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"video"}]}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"system":7}`,
	} {
		_, _, _, err := messages.ToChat([]byte(in))
		if !errors.Is(err, messages.ErrRequest) {
			t.Errorf("%s: expected an messages.ErrRequest, got %v", in, err)
		}
	}
}

func TestChatToMessages(t *testing.T) {
	chat := `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":"gpt-4o-2024-08-06",
	  "choices":[{"index":0,"message":{"role":"assistant","content":"Checking.","tool_calls":[
	    {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
	    {"id":"call_2","type":"function","function":{"name":"get_time","arguments":""}},
	    {"id":"call_3","type":"function","function":{"name":"broken","arguments":"{\"a\":"}}],"refusal":null},
	   "logprobs":null,"finish_reason":"tool_calls"}],
	  "usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150,"prompt_tokens_details":{"cached_tokens":100}}}`
	got, err := messages.FromChatAnswer([]byte(chat))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","type":"message","role":"assistant","model":"gpt-4o-2024-08-06",
	  "content":[{"type":"text","text":"Checking."},
	   {"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},
	   {"type":"tool_use","id":"call_2","name":"get_time","input":{}},
	   {"type":"tool_use","id":"call_3","name":"broken","input":"{\"a\":"}],
	  "stop_reason":"tool_use","stop_sequence":null,
	  "usage":{"input_tokens":20,"output_tokens":30,"cache_read_input_tokens":100}}`
	if !sameJSON(t, got, want) {
		t.Errorf("expected %s\ngot      %s", compact(want), got)
	}

	for finish, stop := range map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
		"function_call": "tool_use", "content_filter": "refusal", "": "end_turn"} {
		got, err := messages.FromChatAnswer([]byte(`{"id":"x","model":"m","choices":[{"message":{"content":"a"},"finish_reason":"` + finish + `"}]}`))
		if err != nil || jsonField(t, got, "stop_reason") != stop {
			t.Errorf("finish_reason %q: expected stop_reason %s, got %s (%v)", finish, stop, got, err)
		}
	}
	got, _ = messages.FromChatAnswer([]byte(`{"model":"m","choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}`))
	if !strings.Contains(string(got), `"text":"I can't help with that."`) || jsonField(t, got, "stop_reason") != "refusal" ||
		!strings.HasPrefix(jsonField(t, got, "id").(string), "msg_") {
		t.Errorf("expected a refusal as text with stop_reason refusal and a fresh id, got %s", got)
	}
	got, _ = messages.FromChatAnswer([]byte(`{"model":"m","choices":[{"message":{"content":""},"finish_reason":"stop"}]}`))
	if !strings.Contains(string(got), `"content":[]`) {
		t.Errorf("expected an empty content array, got %s", got)
	}
	for _, bad := range []string{`nope`, `{"choices":[]}`, `{"model":"m"}`, `{"choices":[{"message":{"content":7}}]}`} {
		if out, err := messages.FromChatAnswer([]byte(bad)); err == nil {
			t.Errorf("%s: expected an error, got %s", bad, out)
		}
	}
}

// An Anthropic answer survives the trip through the router's canonical
// format: Messages -> chat.completion -> Messages.
func TestMessagesResponseRoundTrip(t *testing.T) {
	orig := `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-opus-4-1-20250805",
	  "content":[{"type":"text","text":"I'll check."},{"type":"tool_use","id":"toolu_01A","name":"get_weather","input":{"location":"San Francisco, CA","unit":"celsius"}}],
	  "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":20,"cache_read_input_tokens":1000,"output_tokens":50}}`
	chat, err := chatAnswer(byName("anthropic", provider.Endpoint{}), []byte(orig))
	if err != nil {
		t.Fatal(err)
	}
	back, err := messages.FromChatAnswer(chat)
	if err != nil {
		t.Fatal(err)
	}
	if !sameJSON(t, back, orig) {
		t.Errorf("expected %s\ngot      %s", compact(orig), back)
	}
}

// assembledMessage is what an Anthropic SDK builds from a Messages stream.
type assembledMessage struct {
	ID, Model, StopReason   string
	Blocks                  []assembledBlock
	InputTokens, OutputToks int64
	Events                  []string
}

type assembledBlock struct {
	Type, Text, ID, Name, Input string
}

// assembleMessages reads a Messages SSE stream, checking its grammar.
func assembleMessages(t *testing.T, sse []byte) assembledMessage {
	t.Helper()
	var m assembledMessage
	open := -1
	r := provider.NewSSEReader(strings.NewReader(string(sse)))
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading frames: %v\n%s", err, sse)
		}
		var e struct {
			Type    string `json:"type"`
			Message *struct {
				ID    string         `json:"id"`
				Model string         `json:"model"`
				Usage messages.Usage `json:"usage"`
			} `json:"message"`
			Index        *int `json:"index"`
			ContentBlock *struct {
				Type string `json:"type"`
				Text string `json:"text"`
				ID   string `json:"id"`
				Name string `json:"name"`
			} `json:"content_block"`
			Delta *struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
			Usage *messages.Usage `json:"usage"`
		}
		if err := json.Unmarshal(ev.Data, &e); err != nil {
			t.Fatalf("frame data is not JSON: %s", ev.Data)
		}
		if e.Type != ev.Name {
			t.Errorf("event name %q but data type %q", ev.Name, e.Type)
		}
		m.Events = append(m.Events, e.Type)
		switch e.Type {
		case "message_start":
			if len(m.Events) != 1 || e.Message == nil {
				t.Errorf("message_start must come first, with the message")
				continue
			}
			m.ID, m.Model, m.InputTokens = e.Message.ID, e.Message.Model, e.Message.Usage.InputTokens
		case "content_block_start":
			if open >= 0 || e.Index == nil || *e.Index != len(m.Blocks) || e.ContentBlock == nil {
				t.Errorf("content_block_start out of order: %s", ev.Data)
				continue
			}
			cb := e.ContentBlock
			m.Blocks = append(m.Blocks, assembledBlock{Type: cb.Type, Text: cb.Text, ID: cb.ID, Name: cb.Name})
			open = *e.Index
		case "content_block_delta":
			if e.Index == nil || *e.Index != open || e.Delta == nil {
				t.Errorf("delta for a block that is not open: %s", ev.Data)
				continue
			}
			b := &m.Blocks[open]
			b.Text += e.Delta.Text
			b.Input += e.Delta.PartialJSON
		case "content_block_stop":
			if e.Index == nil || *e.Index != open {
				t.Errorf("content_block_stop for a block that is not open: %s", ev.Data)
			}
			open = -1
		case "message_delta":
			if open >= 0 || e.Delta == nil || e.Usage == nil {
				t.Errorf("message_delta with a block open or without delta and usage: %s", ev.Data)
				continue
			}
			m.StopReason, m.OutputToks = e.Delta.StopReason, e.Usage.OutputTokens
			m.InputTokens = max(m.InputTokens, e.Usage.InputTokens)
		}
	}
	for i := range m.Blocks {
		if in := m.Blocks[i].Input; in != "" {
			var v any
			if err := json.Unmarshal([]byte(in), &v); err != nil {
				t.Errorf("tool input %q is not JSON", in)
			}
			norm, _ := json.Marshal(v)
			m.Blocks[i].Input = string(norm)
		}
	}
	return m
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
	orig := assembleMessages(t, []byte(anthropicToolStream))
	got := assembleMessages(t, encodeStream(t, chatDecoder(byName("anthropic", provider.Endpoint{})), anthropicToolStream))
	wantEvents := "message_start content_block_start content_block_delta content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(got.Events, " ") != wantEvents {
		t.Errorf("events: expected %s\ngot %s", wantEvents, strings.Join(got.Events, " "))
	}
	orig.Events, got.Events = nil, nil
	if !reflect.DeepEqual(got, orig) {
		t.Errorf("expected the message %+v\ngot %+v", orig, got)
	}

	// A Gemini stream for a Messages client.
	got = assembleMessages(t, encodeStream(t, chatDecoder(byName("gemini", provider.Endpoint{})), geminiSSE))
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
	if !strings.HasSuffix(string(out), "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n") ||
		strings.Contains(string(out), "message_stop") {
		t.Errorf("expected the stream to end with an error event, got %s", out)
	}
}

func TestMessagesStreamEncoderOpenAIStream(t *testing.T) {
	enc := messages.NewChatEncoder()
	var out []byte
	for _, c := range []string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,"prompt_tokens_details":{"cached_tokens":4}}}`,
	} {
		out = append(out, enc.Chunk([]byte(c))...)
	}
	done := enc.Done()
	if string(done) != "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n" {
		t.Errorf("usage came with the stream: expected Done to send only message_stop, got %q", done)
	}
	m := assembleMessages(t, append(out, done...))
	want := assembledMessage{ID: "chatcmpl-1", Model: "gpt-4o-2024-08-06", StopReason: "max_tokens",
		Blocks: []assembledBlock{{Type: "text", Text: "Hello"}}, InputTokens: 6, OutputToks: 2,
		Events: strings.Fields("message_start content_block_start content_block_delta content_block_delta content_block_stop message_delta message_stop")}
	if !reflect.DeepEqual(m, want) {
		t.Errorf("expected %+v\ngot %+v", want, m)
	}
	if !strings.Contains(string(out), `"usage":{"input_tokens":6,"output_tokens":2,"cache_read_input_tokens":4}`) {
		t.Errorf("expected cached tokens reported as cache reads, got %s", out)
	}
	if enc.Done() != nil || enc.Chunk([]byte(`{"choices":[{"delta":{"content":"late"}}]}`)) != nil {
		t.Error("expected nothing after the end")
	}
}

func TestMessagesStreamEncoderToolCalls(t *testing.T) {
	// OpenAI streams parallel calls by index, arguments in pieces; some
	// providers send each call whole, all at index 0.
	for name, chunks := range map[string][]string{
		"by index": {
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`,
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]},"finish_reason":null}]}`,
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":null}]}`,
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},"finish_reason":null}]}`,
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		},
		"whole calls at index 0": {
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}]}`,
			`{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
		},
	} {
		enc := messages.NewChatEncoder()
		var out []byte
		for _, c := range chunks {
			out = append(out, enc.Chunk([]byte(c))...)
		}
		out = append(out, enc.Done()...) // no usage came: Done sends message_delta
		m := assembleMessages(t, out)
		want := []assembledBlock{
			{Type: "tool_use", ID: "call_1", Name: "get_weather", Input: `{"city":"Paris"}`},
			{Type: "tool_use", ID: "call_2", Name: "get_time", Input: `{}`},
		}
		if !reflect.DeepEqual(m.Blocks, want) || m.StopReason != "tool_use" || m.Events[len(m.Events)-1] != "message_stop" {
			t.Errorf("%s: expected %+v ending tool_use, got %+v", name, want, m)
		}
	}
}

func TestMessagesStreamEncoderEdges(t *testing.T) {
	// No chunk at all: still a well-formed, empty message.
	m := assembleMessages(t, messages.NewChatEncoder().Done())
	if strings.Join(m.Events, " ") != "message_start message_delta message_stop" || m.StopReason != "end_turn" || !strings.HasPrefix(m.ID, "msg_") {
		t.Errorf("expected an empty message, got %+v", m)
	}
	enc := messages.NewChatEncoder()
	if out := enc.Chunk([]byte(`not json`)); out != nil {
		t.Errorf("expected nothing for an invalid chunk, got %s", out)
	}
	// Text after a tool call opens a new text block.
	out := enc.Chunk([]byte(`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"a","tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":"{}"}}]}}]}`))
	out = append(out, enc.Chunk([]byte(`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"b"}},{"index":1,"delta":{"content":"other choice"}}]}`))...)
	out = append(out, enc.Done()...)
	m = assembleMessages(t, out)
	if len(m.Blocks) != 3 || m.Blocks[0].Text != "a" || m.Blocks[1].Type != "tool_use" || m.Blocks[2].Text != "b" {
		t.Errorf("expected text, tool_use, text, got %+v", m.Blocks)
	}
}

func TestAnthropicErrorBodies(t *testing.T) {
	if got, want := string(messages.NewError("rate_limit_error", `too "fast"`)), `{"type":"error","error":{"type":"rate_limit_error","message":"too \"fast\""}}`; got != want {
		t.Errorf("expected %s, got %s", want, got)
	}
	got, want := string(messages.StreamError("overloaded_error", "Overloaded")),
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	if got != want {
		t.Errorf("expected %q, got %q", want, got)
	}
	for status, want := range map[int]string{
		400: "invalid_request_error", 401: "authentication_error", 402: "billing_error", 403: "permission_error",
		404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error",
		500: "api_error", 502: "api_error", 503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error",
	} {
		if got := messages.ErrorType(status); got != want {
			t.Errorf("%d: expected %s, got %s", status, want, got)
		}
	}
}
