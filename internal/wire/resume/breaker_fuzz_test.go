package resume

// Fuzzing of what a provider may send through a transcript and a splice
// (adversarial: no panic on any provider output), and of Body on any
// request. Run: go test -fuzz FuzzBreakerTranscriptAndSplice ./internal/wire/resume

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/llmrouter/caddy-llm-router/provider"
)

func FuzzBreakerTranscriptAndSplice(f *testing.F) {
	for _, s := range []string{
		`{"id":"a","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"}}]}`,
		`{"id":"a","choices":[{"index":0,"delta":{"content":"x\u00e9\ud83d"},"finish_reason":null}],"usage":null}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}`,
		`{"choices":[],"usage":{"prompt_tokens":"x","completion_tokens":1e400}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`,
		`{"type":"content_block_start","index":-5,"content_block":{"type":"text","text":"x"}}`,
		`{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":9223372036854775807}}`,
		`{"type":"message_start","message":{"usage":{"input_tokens":-1}}}`,
		`[DONE]`, `{}`, `{"choices":{}}`, `{"choices":[{"delta":{"content":}}]}`,
	} {
		f.Add(s, s, "Hello ", true)
	}
	f.Fuzz(func(t *testing.T, first, next, text string, messages bool) {
		format := provider.Chat
		if messages {
			format = provider.Messages
		}
		tr := New(format)
		tr.Add(provider.Event{Data: []byte(first)})
		tr.Add(provider.Event{Data: []byte(text)})
		_ = tr.Resumable()
		_ = tr.CanReplay()
		prior := provider.Usage{InputTokens: 5, OutputTokens: 3}
		_, cont := tr.Prefix(prior)
		for _, ev := range []string{first, next, next} {
			outs, _ := cont.Event(provider.Event{Data: []byte(ev)})
			if slices.ContainsFunc(outs, func(o provider.Event) bool { return len(o.Data) == 0 }) {
				t.Fatalf("an event let through empty")
			}
		}
		if outs, _ := cont.End(); slices.ContainsFunc(outs, func(o provider.Event) bool { return len(o.Data) == 0 }) {
			t.Fatalf("an event let through empty at the end")
		}
		rep := tr.Replay(prior)
		for _, ev := range []string{next, first} {
			_, _ = rep.Event(provider.Event{Data: []byte(ev)})
		}
		for _, f := range []provider.Format{provider.Chat, provider.Messages, provider.Responses} {
			for _, body := range []string{first, next} {
				out, err := Body(f, []byte(body), text)
				if err == nil && !json.Valid(out) {
					t.Fatalf("Body made invalid JSON of %q: %s", body, out)
				}
			}
		}
	})
}

// A transcript's text should equal what a client decoding each chunk
// reads, whether the chunk takes the scan or the decoding path (escapes,
// invalid UTF-8, surrogates), so that a replay is compared with the text
// the client really has. It does not for raw invalid UTF-8 (a provider
// that splits a character's bytes across chunks): the fast scan keeps
// the raw bytes where encoding/json (the decoding path, the client, the
// splice) reads U+FFFD. The transcript then holds text the client never
// got ("ð" + "" is a valid emoji to it, two U+FFFD to the
// client), a continuation is asked to go on from it, and a byte-identical
// replay is refused as diverging. Fails on its seed "ÿþ".
func FuzzBreakerTranscriptTextIsTheClients(f *testing.F) {
	for _, s := range []string{"Hello", `a\"b`, "é", `\ud83d\ude00`, `\ud83d`, "\xff\xfe", `\u0000`, "tab\there"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		tr := New(provider.Chat)
		want := ""
		for i, s := range []string{a, b} {
			enc, _ := json.Marshal(s)
			// a provider's raw bytes: the string as JSON-encoded, or as is
			// when it is valid inside a JSON string.
			raw := enc
			if i == 1 && !strings.ContainsAny(s, "\"\\\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\n\v\f\r\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f") {
				raw = append(append([]byte{'"'}, s...), '"')
			}
			chunk := []byte(`{"id":"x","choices":[{"index":0,"delta":{"content":` + string(raw) + `}}]}`)
			if !json.Valid(chunk) {
				return
			}
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal(chunk, &c) != nil {
				return
			}
			want += c.Choices[0].Delta.Content
			tr.Add(provider.Event{Data: chunk})
		}
		if got := tr.Text(); !bytes.Equal([]byte(got), []byte(want)) {
			t.Errorf("transcript %q, client %q", got, want)
		}
	})
}
