package provider

import (
	"strings"
	"testing"
)

// Each format's usage, as its answers state it: all input (cached read
// and written included), output (reasoning included), and the details.
func TestUsageOf(t *testing.T) {
	for _, c := range []struct {
		f    Format
		body string
		want Usage
	}{
		{Chat, `{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150,"prompt_tokens_details":{"cached_tokens":60},"completion_tokens_details":{"reasoning_tokens":20}}}`,
			Usage{InputTokens: 100, CachedInputTokens: 60, OutputTokens: 50, ReasoningTokens: 20}},
		{Completions, `{"usage":{"prompt_tokens":7,"completion_tokens":3}}`, Usage{InputTokens: 7, OutputTokens: 3}},
		{Embeddings, `{"data":[],"usage":{"prompt_tokens":12,"total_tokens":12}}`, Usage{InputTokens: 12}},
		{Messages, `{"type":"message","usage":{"input_tokens":10,"cache_read_input_tokens":200,"cache_creation_input_tokens":30,"output_tokens":40}}`,
			Usage{InputTokens: 240, CachedInputTokens: 200, CacheWriteTokens: 30, OutputTokens: 40}},
		{Responses, `{"object":"response","usage":{"input_tokens":90,"input_tokens_details":{"cached_tokens":64},"output_tokens":33,"output_tokens_details":{"reasoning_tokens":12},"total_tokens":123}}`,
			Usage{InputTokens: 90, CachedInputTokens: 64, OutputTokens: 33, ReasoningTokens: 12}},
		{Chat, `{"usage":{"prompt_tokens":-5,"completion_tokens":-1}}`, Usage{}}, // a provider's garbage counts nothing
	} {
		got, ok := UsageOf(c.f, []byte(c.body))
		if !ok || got != c.want {
			t.Errorf("%s %s: %+v %v, want %+v", c.f, c.body, got, ok, c.want)
		}
	}
	// Read as JSON decoding reads a member: its key in any case or
	// escaped, a repeated one merged into the first, a later null ending it.
	for _, c := range []struct {
		body string
		want Usage
	}{
		{`{"Usage":{"prompt_tokens":4,"completion_tokens":1}}`, Usage{InputTokens: 4, OutputTokens: 1}},
		{`{"\u0075SAGE":{"prompt_tokens":4}}`, Usage{InputTokens: 4}},
		{`{"usage":{"prompt_tokens":4},"id":"x","usage":{"completion_tokens":2}}`, Usage{InputTokens: 4, OutputTokens: 2}},
		{` { "choices" : [ {"message":{"content":"\"usage\":{}"}} ] , "usage" : {"prompt_tokens" : 3} } `, Usage{InputTokens: 3}},
	} {
		if got, ok := UsageOf(Chat, []byte(c.body)); !ok || got != c.want {
			t.Errorf("%s: %+v %v, want %+v", c.body, got, ok, c.want)
		}
	}
	for _, body := range []string{`{"choices":[]}`, `not json`, `{"usage":null}`, `{"usage":{"prompt_tokens":4},"usage":null}`,
		`{"usage":{"prompt_tokens":"four"}}`, `{"usage":{"prompt_tokens":4}`, `[{"usage":{"prompt_tokens":4}}]`, `null`, ``} {
		if _, ok := UsageOf(Chat, []byte(body)); ok {
			t.Errorf("%s: usage stated", body)
		}
	}
}

// A stream's usage: the last Chat chunk that states it; a Messages
// stream's message_start (input, cache) then message_delta (output so
// far); a Responses stream's response.completed.
func TestUsageCounter(t *testing.T) {
	c := NewUsageCounter(Messages, false)
	for _, d := range []string{
		`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":20,"cache_read_input_tokens":100,"output_tokens":1}}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the usage of it"}}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":42}}`,
	} {
		c.Add(Event{Data: []byte(d)})
	}
	if u, ok := c.Usage(); !ok || u != (Usage{InputTokens: 120, CachedInputTokens: 100, OutputTokens: 42}) {
		t.Errorf("messages: %+v %v", u, ok)
	}
	c = NewUsageCounter(Responses, false)
	c.Add(Event{Name: "response.created", Data: []byte(`{"type":"response.created","response":{"usage":null}}`)})
	c.Add(Event{Data: []byte(`{"type":"response.completed","response":{"usage":{"input_tokens":9,"output_tokens":4}}}`)})
	if u, ok := c.Usage(); !ok || u != (Usage{InputTokens: 9, OutputTokens: 4}) {
		t.Errorf("responses: %+v %v", u, ok)
	}
	c = NewUsageCounter(Chat, false)
	if _, ok := c.Usage(); ok {
		t.Error("nothing read: no usage")
	}
}

// A Chat stream whose client did not ask for usage: the usage chunk is
// counted and kept from it, and a finish chunk goes without its usage; a
// client that asked gets them as they came; other formats are never
// touched.
func TestUsageCounterHides(t *testing.T) {
	finish := `{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`
	only := `{"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}`
	c := NewUsageCounter(Chat, true)
	ev, ok := c.Relay(Event{Data: []byte(finish)})
	if !ok || strings.Contains(string(ev.Data), "usage") || !strings.Contains(string(ev.Data), `"finish_reason":"stop"`) {
		t.Errorf("finish chunk: %s %v", ev.Data, ok)
	}
	if _, ok := c.Relay(Event{Data: []byte(only)}); ok {
		t.Error("a usage-only chunk reached a client that did not ask for it")
	}
	if u, _ := c.Usage(); u.OutputTokens != 3 {
		t.Errorf("counted %+v", u)
	}
	c = NewUsageCounter(Chat, false)
	if ev, ok := c.Relay(Event{Data: []byte(only)}); !ok || string(ev.Data) != only {
		t.Errorf("asked for: %s %v", ev.Data, ok)
	}
	c = NewUsageCounter(Messages, true)
	msg := `{"type":"message_delta","delta":{},"usage":{"output_tokens":4}}`
	if ev, ok := c.Relay(Event{Data: []byte(msg)}); !ok || string(ev.Data) != msg {
		t.Errorf("messages: %s %v", ev.Data, ok)
	}
}

// A provider's garbage: counts near the int64 limit are bounded
// (MaxTokens), a message_delta that restates the input as 0 keeps what
// message_start said, an empty usage object keeps the count, and every
// spelling of the key JSON decodes is read (and hidden).
func TestUsageGarbage(t *testing.T) {
	if u, _ := UsageOf(Messages, []byte(`{"usage":{"input_tokens":9223372036854775807,"cache_read_input_tokens":1,"output_tokens":9223372036854775807}}`)); u.InputTokens <= 0 || u.InputTokens > 2*MaxTokens || u.OutputTokens != MaxTokens {
		t.Errorf("bounded: %+v", u)
	}
	c := NewUsageCounter(Messages, false)
	c.Add(Event{Data: []byte(`{"type":"message_start","message":{"usage":{"input_tokens":20,"cache_read_input_tokens":1000000,"output_tokens":1}}}`)})
	c.Add(Event{Data: []byte(`{"type":"message_delta","delta":{},"usage":{"input_tokens":0,"output_tokens":10}}`)})
	if u, _ := c.Usage(); u.InputTokens != 1000020 || u.CachedInputTokens != 1000000 || u.OutputTokens != 10 {
		t.Errorf("restated input: %+v", u)
	}
	c = NewUsageCounter(Chat, true)
	c.Add(Event{Data: []byte(`{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}`)})
	c.Add(Event{Data: []byte(`{"choices":[],"usage":{}}`)})
	if u, _ := c.Usage(); u.InputTokens != 7 || u.OutputTokens != 3 {
		t.Errorf("an empty usage after: %+v", u)
	}
	for _, key := range []string{`"Usage"`, `"\u0075sage"`} {
		c = NewUsageCounter(Chat, true)
		if _, ok := c.Relay(Event{Data: []byte(`{"choices":[],` + key + `:{"prompt_tokens":4,"completion_tokens":1}}`)}); ok {
			t.Errorf("%s: relayed to a client that did not ask", key)
		}
		if u, ok := c.Usage(); !ok || u.InputTokens != 4 {
			t.Errorf("%s: counted %+v %v", key, u, ok)
		}
	}
	// Malformed JSON never panics the hiding.
	c = NewUsageCounter(Chat, true)
	c.Relay(Event{Data: []byte(`{"usage":{}"usage":00}`)})
}

// The usage of a whole answer is read for every non-streamed answer.
func BenchmarkUsageOf(b *testing.B) {
	answer := `{"id":"chatcmpl-1","object":"chat.completion","created":1755780000,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("An answer of a few paragraphs, as a chat model writes one. ", 60) +
		`"},"finish_reason":"stop"}],"usage":{"prompt_tokens":256,"completion_tokens":200,"total_tokens":456,"prompt_tokens_details":{"cached_tokens":0}}}`
	body := []byte(answer)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := UsageOf(Chat, body); !ok {
			b.Fatal("no usage")
		}
	}
}

// Hide of the event Add read last takes what Add found of its usage key
// (no second search); any other event, or the same bytes again after Hide
// took it, is searched: every chunk goes to the client as a counter that
// never read it would send it.
func TestUsageCounterHideAfterAdd(t *testing.T) {
	chunks := []string{
		`{"id":"x","choices":[{"index":0,"delta":{"content":"the usage of it"},"finish_reason":null}]}`,
		`{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`,
		`{"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}`,
		`{"id":"x","choices":[],"Usage":{"prompt_tokens":5,"completion_tokens":3}}`,
		`{"id":"x","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],"usage":null}`,
	}
	read := NewUsageCounter(Chat, true)
	for _, d := range chunks {
		got, gotOK := read.Relay(Event{Data: []byte(d)})
		want, wantOK := NewUsageCounter(Chat, true).Hide(Event{Data: []byte(d)})
		if gotOK != wantOK || string(got.Data) != string(want.Data) {
			t.Errorf("%s: relayed %q %v, a counter that never read it %q %v", d, got.Data, gotOK, want.Data, wantOK)
		}
	}
	// One buffer, read with no usage and hidden, then holding a
	// usage-only chunk of the same length: Hide searches it again.
	plain := []byte(`{"choices":[{"index":0}],"x":{"prompt_tokens":1}}`)
	usage := []byte(`{"choices":[],"usage":{"prompt_tokens":1}}       `)
	if len(plain) != len(usage) {
		t.Fatalf("lengths %d and %d", len(plain), len(usage))
	}
	c := NewUsageCounter(Chat, true)
	buf := append([]byte(nil), plain...)
	if _, ok := c.Relay(Event{Data: buf}); !ok {
		t.Fatal("a chunk without usage was kept from the client")
	}
	copy(buf, usage)
	if _, ok := c.Hide(Event{Data: buf}); ok {
		t.Error("a usage-only chunk in a reused buffer reached a client that did not ask for it")
	}
}
