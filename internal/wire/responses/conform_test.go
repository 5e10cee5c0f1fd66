package responses

import (
	"encoding/json"
	"strings"
	"testing"
)

// The response objects the router builds have every member the OpenAI
// spec's Response requires (instructions, temperature and top_p among
// them, null when the router does not know them), and an output_text part
// its logprobs (OutputTextContent).
func TestFromChatAnswerRequiredFields(t *testing.T) {
	out, err := FromChatAnswer([]byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`))
	if err != nil {
		t.Fatal(err)
	}
	var r map[string]json.RawMessage
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"instructions", "temperature", "top_p"} {
		if _, ok := r[k]; !ok {
			t.Errorf("expected %s in the response, got %s", k, out)
		}
	}
	var items []struct {
		Content []map[string]json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(r["output"], &items)
	if len(items) != 1 || len(items[0].Content) != 1 || string(items[0].Content[0]["logprobs"]) != "[]" {
		t.Errorf("expected the output_text part's logprobs [], got %s", r["output"])
	}
}

// response.function_call_arguments.done names the function
// (ResponseFunctionCallArgumentsDoneEvent requires name); every event's
// response and output_text part has its required members too.
func TestChatEncoderRequiredFields(t *testing.T) {
	enc := NewChatEncoder()
	var out []byte
	for _, c := range []string{
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
	} {
		out = append(out, enc.Chunk([]byte(c))...)
	}
	out = append(out, enc.Done()...)
	var sawDone bool
	for _, line := range strings.Split(string(out), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev map[string]json.RawMessage
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		switch typ := strings.Trim(string(ev["type"]), `"`); typ {
		case "response.function_call_arguments.done":
			sawDone = true
			if string(ev["name"]) != `"get_weather"` {
				t.Errorf("expected %s to name get_weather, got %s", typ, data)
			}
		case "response.created", "response.completed":
			var r map[string]json.RawMessage
			_ = json.Unmarshal(ev["response"], &r)
			for _, k := range []string{"instructions", "temperature", "top_p"} {
				if _, ok := r[k]; !ok {
					t.Errorf("expected %s's response to have %s, got %s", typ, k, ev["response"])
				}
			}
		case "response.content_part.done":
			var p map[string]json.RawMessage
			_ = json.Unmarshal(ev["part"], &p)
			if string(p["logprobs"]) != "[]" {
				t.Errorf("expected %s's part to have logprobs [], got %s", typ, ev["part"])
			}
		}
	}
	if !sawDone {
		t.Errorf("expected a response.function_call_arguments.done, got %s", out)
	}
}

// A translated response restates its request's instructions, temperature
// and top_p, as OpenAI's responses do (null only where the request set
// none), in an answer and in every event's response of a stream.
func TestTranslatedResponsesRestateTheRequest(t *testing.T) {
	e := EchoOf([]byte(`{"model":"m","input":"hi","instructions":"Be brief.","temperature":0.2,"top_p":0.9}`))
	want := `"instructions":"Be brief.","temperature":0.2,"top_p":0.9`
	out, err := FromChatAnswerTo([]byte(`{"id":"c","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`), e)
	if err != nil || !strings.Contains(string(out), want) {
		t.Errorf("expected the answer to restate %s, got %s (%v)", want, out, err)
	}
	enc := NewChatEncoder().Restating(e)
	stream := string(enc.Chunk([]byte(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`))) +
		string(enc.Done())
	for _, typ := range []string{"response.created", "response.in_progress", "response.completed"} {
		i := strings.Index(stream, "event: "+typ+"\n")
		if i < 0 {
			t.Fatalf("no %s event in %s", typ, stream)
		}
		line, _, _ := strings.Cut(stream[i:], "\n\n")
		if !strings.Contains(line, want) {
			t.Errorf("%s does not restate %s: %s", typ, want, line)
		}
	}
	if e := EchoOf([]byte(`{"model":"m","input":"hi"}`)); e.Instructions != nil || e.Temperature != nil || e.TopP != nil {
		t.Errorf("a request that sets none: expected nothing restated, got %+v", e)
	}
}
