package adapters

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Bad output from a provider never panics a translating adapter: it is a
// server-class error event, or a translation error (which the router
// treats as a server failure and fails over).

func TestGarbageStreamEvents(t *testing.T) {
	// Not JSON, or JSON that is no event object, for every decoder.
	common := []string{`not json`, `{"type":`, `[1,2]`, `"text"`, `123`, `null`, "\x00\xff\xfe", `{"error":"x"`}
	for _, tc := range []struct {
		a       named
		garbage []string
	}{
		{named{"anthropic", byName("anthropic", provider.Endpoint{})}, []string{`{}`, `{"candidates":"x"}`, `{"type":"content_block_delta","index":"x"}`,
			`{"type":"message_start","message":[]}`, `{"type":"message_delta"}`, `{"type":"content_block_start","content_block":"x"}`}},
		{named{"gemini", byName("gemini", provider.Endpoint{})}, []string{`{}`, `{"type":"content_block_delta","index":0}`, `{"candidates":"x"}`,
			`{"candidates":[{"content":{"parts":[{"functionCall":7}]}}]}`, `{"usageMetadata":{"promptTokenCount":"many"}}`}},
		{named{"azure", byName("azure", provider.Endpoint{})}, []string{`{}`, `{"candidates":"x"}`, `{"type":"message_start","message":{}}`}},
	} {
		for _, data := range append(common, tc.garbage...) {
			for _, name := range []string{"", "message_delta"} {
				out, kind, obs := tc.a.NewStreamDecoder().Event(&provider.Event{Name: name, Data: []byte(data)})
				if kind != provider.EventError || obs.Class != provider.Server || obs.Message == "" {
					t.Errorf("%s: %q (event %q): expected a server error event, got kind %d class %s %s", tc.a.Name(), data, name, kind, obs.Class, out)
				}
			}
		}
		// Blank events are nothing, not content.
		for _, data := range []string{``, `   `} {
			if _, kind, _ := tc.a.NewStreamDecoder().Event(&provider.Event{Data: []byte(data)}); kind != provider.EventSkip {
				t.Errorf("%s: %q: expected a skip, got kind %d", tc.a.Name(), data, kind)
			}
		}
	}
}

func TestGarbageAnswers(t *testing.T) {
	for _, a := range []named{{"anthropic", byName("anthropic", provider.Endpoint{})}, {"gemini", byName("gemini", provider.Endpoint{})}, {"azure", byName("azure", provider.Endpoint{})}} {
		for _, body := range []string{``, `not json`, `[]`, `{}`, `null`, `"x"`, `<html>502</html>`,
			`{"type":"message","content":"x"}`, `{"candidates":[{"content":"x"}]}`, `{"choices":{}}`, `{"error":{"message":"boom"}}`} {
			if out, err := a.ChatResponse([]byte(body)); err == nil {
				t.Errorf("%s: %q: expected a translation error, got %s", a.Name(), body, out)
			}
			o := a.Observe(500, http.Header{}, []byte(body), time.Now())
			if o.Class != provider.Server {
				t.Errorf("%s: a 500 with body %q: expected server, got %s", a.Name(), body, o.Class)
			}
		}
	}
}

func FuzzTranslatingStreams(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "streams", "*.sse"))
	for _, name := range files {
		raw, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte(anthropicToolStream))
	f.Add([]byte(geminiSSE))
	f.Add([]byte(azureSSE))
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, a := range []named{{"anthropic", byName("anthropic", provider.Endpoint{})}, {"gemini", byName("gemini", provider.Endpoint{})}, {"azure", byName("azure", provider.Endpoint{})}} {
			dec := a.NewStreamDecoder()
			enc := messages.NewChatEncoder()
			r := provider.NewSSEReader(bytes.NewReader(raw))
			for {
				ev, err := r.Next()
				if err != nil {
					break
				}
				out, kind, obs := dec.Event(ev)
				switch kind {
				case provider.EventData, provider.EventFinal:
					if len(out) == 0 {
						continue // progress with nothing to relay
					}
					if !json.Valid(out) {
						t.Fatalf("%s relayed invalid JSON %q", a.Name(), out)
					}
					checkFrames(t, enc.Chunk(out))
				case provider.EventError:
					if obs.Class == provider.OK {
						t.Fatalf("%s: an error event of class ok", a.Name())
					}
				}
			}
			checkFrames(t, enc.Done())
		}
	})
}

// checkFrames fails unless out is whole SSE frames with JSON data.
func checkFrames(t *testing.T, out []byte) {
	t.Helper()
	r := provider.NewSSEReader(bytes.NewReader(out))
	for {
		ev, err := r.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("frames %q: %v", out, err)
			}
			return
		}
		if ev.Name == "" || !json.Valid(ev.Data) {
			t.Fatalf("bad frame in %q", out)
		}
	}
}

func FuzzTranslatingAnswers(f *testing.F) {
	fixtureSeeds(f, func(_ http.Header, body []byte) { f.Add(body) })
	f.Add([]byte(`{"candidates":[{"content":{"parts":[{"text":"a"},{"functionCall":{"name":"f","args":{}}}]},"finishReason":"STOP"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, a := range []named{{"anthropic", byName("anthropic", provider.Endpoint{})}, {"gemini", byName("gemini", provider.Endpoint{})}} {
			if out, err := a.ChatResponse(body); err == nil {
				if !json.Valid(out) {
					t.Fatalf("%s: invalid JSON answer %q", a.Name(), out)
				}
				if m, err := messages.FromChatAnswer(out); err != nil || !json.Valid(m) {
					t.Fatalf("%s: its chat.completion does not translate back: %v", a.Name(), err)
				}
			}
			o := a.Observe(429, http.Header{}, body, time.Now())
			if o.RetryAfter < provider.Unknown || o.RetryAfter > provider.MaxCooldown || o.Class == provider.OK {
				t.Fatalf("%s: bad observation %+v", a.Name(), o)
			}
		}
	})
}

func FuzzTranslatingRequests(f *testing.F) {
	f.Add([]byte(chatWithTools))
	f.Add([]byte(anthropicWithTools))
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":" "}]}`))
	ep := &provider.Endpoint{BaseURL: "https://example.com/v1"}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, a := range []named{{"anthropic", byName("anthropic", provider.Endpoint{})}, {"gemini", byName("gemini", provider.Endpoint{})}, {"azure", byName("azure", provider.Endpoint{})}} {
			if a.name == "azure" && !json.Valid(body) {
				continue // like openai, it takes the handler's validated body
			}
			req, err := chatRequest(byName(a.name, *ep), "gemini-3-x", body, true)
			if err != nil {
				continue
			}
			var b bytes.Buffer
			_, _ = b.ReadFrom(req.Body)
			if !json.Valid(b.Bytes()) {
				t.Fatalf("%s: invalid upstream body %q", a.Name(), b.Bytes())
			}
		}
		chat, err := messages.ToChat(body)
		if err != nil {
			if !errors.Is(err, messages.ErrRequest) {
				t.Fatalf("MessagesToChat error without messages.ErrRequest: %v", err)
			}
			return
		}
		if !json.Valid(chat) {
			t.Fatalf("MessagesToChat gave invalid JSON %q", chat)
		}
	})
}

// named is a built-in provider type with its name, for table tests.
type named struct {
	name string
	p    provider.Provider
}

func (n named) Name() string                   { return n.name }
func (n named) NewStreamDecoder() eventDecoder { return chatDecoder(n.p) }

func (n named) ChatResponse(body []byte) ([]byte, error) { return chatAnswer(n.p, body) }

func (n named) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	return n.p.Observe(status, h, body, now)
}
