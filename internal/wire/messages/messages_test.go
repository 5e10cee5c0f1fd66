package messages_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/internal/jsontest"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages/messagestest"
	"github.com/llmrouter/caddy-llm-router/provider"
)

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
		`{"model":"m","max_tokens":10,"messages":[{"role":"tool","content":"hi"}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"},{"role":"system","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":42}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"video"}]}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`,
		`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"system":7}`,
	} {
		_, err := messages.ToChat([]byte(in))
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
	if id := jsontest.Field(t, got, "id").(string); !strings.HasPrefix(id, "msg_") {
		t.Errorf("expected a msg_ id for a chatcmpl- one, got %q", id)
	}
	got = jsontest.Set(t, got, "id", "msg_x")
	want := `{"id":"msg_x","type":"message","role":"assistant","model":"gpt-4o-2024-08-06",
	  "content":[{"type":"text","text":"Checking."},
	   {"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}},
	   {"type":"tool_use","id":"call_2","name":"get_time","input":{}},
	   {"type":"tool_use","id":"call_3","name":"broken","input":{"_raw":"{\"a\":"}}],
	  "stop_reason":"tool_use","stop_sequence":null,
	  "usage":{"input_tokens":20,"output_tokens":30,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,
	    "cache_creation":null,"server_tool_use":null,"service_tier":null}}`
	if !jsontest.Same(t, got, want) {
		t.Errorf("expected %s\ngot      %s", jsontest.Compact(want), got)
	}

	for finish, stop := range map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
		"function_call": "tool_use", "content_filter": "refusal", "": "end_turn"} {
		got, err := messages.FromChatAnswer([]byte(`{"id":"x","model":"m","choices":[{"message":{"content":"a"},"finish_reason":"` + finish + `"}]}`))
		if err != nil || jsontest.Field(t, got, "stop_reason") != stop {
			t.Errorf("finish_reason %q: expected stop_reason %s, got %s (%v)", finish, stop, got, err)
		}
	}
	got, _ = messages.FromChatAnswer([]byte(`{"model":"m","choices":[{"message":{"content":null,"refusal":"I can't help with that."},"finish_reason":"stop"}]}`))
	if !strings.Contains(string(got), `"text":"I can't help with that."`) || jsontest.Field(t, got, "stop_reason") != "refusal" ||
		!strings.HasPrefix(jsontest.Field(t, got, "id").(string), "msg_") {
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
	  "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":20,"cache_creation_input_tokens":0,"cache_read_input_tokens":1000,
	    "cache_creation":null,"output_tokens":50,"server_tool_use":null,"service_tier":null}}`
	chat, err := messages.ToChatAnswer([]byte(orig))
	if err != nil {
		t.Fatal(err)
	}
	back, err := messages.FromChatAnswer(chat)
	if err != nil {
		t.Fatal(err)
	}
	if !jsontest.Same(t, back, orig) {
		t.Errorf("expected %s\ngot      %s", jsontest.Compact(orig), back)
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
	m := messagestest.Assemble(t, append(out, done...))
	if !strings.HasPrefix(m.ID, "msg_") {
		t.Errorf("expected a msg_ id for the chatcmpl- one, got %q", m.ID)
	}
	m.ID = "msg_x"
	want := messagestest.Message{ID: "msg_x", Model: "gpt-4o-2024-08-06", StopReason: "max_tokens",
		Blocks: []messagestest.Block{{Type: "text", Text: "Hello"}}, InputTokens: 6, OutputToks: 2,
		Events: strings.Fields("message_start content_block_start content_block_delta content_block_delta content_block_stop message_delta message_stop")}
	if !reflect.DeepEqual(m, want) {
		t.Errorf("expected %+v\ngot %+v", want, m)
	}
	if !strings.Contains(string(out), `"usage":{"input_tokens":6,"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"cache_creation":null,"output_tokens":2,"server_tool_use":null,"service_tier":null}`) {
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
		m := messagestest.Assemble(t, out)
		want := []messagestest.Block{
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
	m := messagestest.Assemble(t, messages.NewChatEncoder().Done())
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
	m = messagestest.Assemble(t, out)
	if len(m.Blocks) != 3 || m.Blocks[0].Text != "a" || m.Blocks[1].Type != "tool_use" || m.Blocks[2].Text != "b" {
		t.Errorf("expected text, tool_use, text, got %+v", m.Blocks)
	}
}

func TestAnthropicErrorBodies(t *testing.T) {
	body := messages.NewError("rate_limit_error", `too "fast"`)
	if got, want := string(jsontest.Set(t, body, "request_id", "req_x")), `{"type":"error","error":{"type":"rate_limit_error","message":"too \"fast\""},"request_id":"req_x"}`; got != want {
		t.Errorf("expected %s, got %s", want, got)
	}
	ev := messages.StreamError("overloaded_error", "Overloaded")
	data, _ := strings.CutPrefix(strings.TrimSuffix(string(ev), "\n\n"), "event: error\ndata: ")
	got, want := "event: error\ndata: "+string(jsontest.Set(t, []byte(data), "request_id", "req_x"))+"\n\n",
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"},\"request_id\":\"req_x\"}\n\n"
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

// A native decoder relays the provider's events as they came, named or
// not, but keeps message_stop to itself: the client's writer ends the
// stream, with exactly one message_stop.
func TestNativeDecoderKeepsMessageStop(t *testing.T) {
	for _, name := range []string{"", "message_stop"} {
		d := messages.NewChatDecoder(true, func(messages.ErrorDetail) provider.Observation { return provider.Observation{} })
		start := provider.Event{Data: []byte(`{"type":"message_start","message":{"id":"msg_1","model":"m"}}`)}
		if name != "" {
			start.Name = "message_start"
		}
		if out, kind, _ := d.Decode(&start); kind != provider.EventSkip || string(out.Data) != string(start.Data) || out.Name != start.Name {
			t.Errorf("name %q: expected message_start relayed as it came, got %v %q", name, kind, out.Data)
		}
		delta := provider.Event{Name: name, Data: []byte(`{"type":"message_delta","delta":{"stop_reason":"end_turn"}}`)}
		if out, kind, _ := d.Decode(&delta); kind != provider.EventFinal || string(out.Data) != string(delta.Data) {
			t.Errorf("name %q: expected message_delta relayed as final, got %v %q", name, kind, out.Data)
		}
		stop := provider.Event{Name: name, Data: []byte(`{"type":"message_stop"}`)}
		if out, kind, _ := d.Decode(&stop); kind != provider.EventDone || len(out.Data) != 0 || out.Name != "" {
			t.Errorf("name %q: expected message_stop kept back, got %v %+v", name, kind, out)
		}
	}
}

// A stream that opens without content (message_start, an empty text block,
// empty text, arguments or thinking pieces, pings) gives no first token in
// either mode; the first non-empty piece does.
func TestEmptyOpeningIsNoToken(t *testing.T) {
	opening := []string{
		`{"type":"message_start","message":{"id":"msg_1","model":"m","usage":{"input_tokens":3,"output_tokens":1}}}`,
		`{"type":"ping"}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`,
	}
	for _, native := range []bool{true, false} {
		d := messages.NewChatDecoder(native, func(messages.ErrorDetail) provider.Observation { return provider.Observation{} })
		for _, data := range opening {
			if _, kind, _ := d.Decode(&provider.Event{Data: []byte(data)}); kind != provider.EventSkip {
				t.Errorf("native=%v: %s: expected no first token, got kind %d", native, data, kind)
			}
		}
		for _, data := range []string{
			`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me see"}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
		} {
			if _, kind, _ := d.Decode(&provider.Event{Data: []byte(data)}); kind != provider.EventData {
				t.Errorf("native=%v: %s: expected a first token, got kind %d", native, data, kind)
			}
		}
	}
}
