package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

func TestSetString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"fast","messages":[]}`, `{"model":"gpt-4o","messages":[]}`},
		{`{"messages":[{"content":"the \"model\": x"}],"model" : "fast"}`, `{"messages":[{"content":"the \"model\": x"}],"model" : "gpt-4o"}`},
		{`{"nested":{"model":"keep"},"model":null}`, `{"nested":{"model":"keep"},"model":"gpt-4o"}`},
		{`{"messages":[]}`, `{"model":"gpt-4o","messages":[]}`},
		{` { } `, ` {"model":"gpt-4o" } `},
	} {
		got, err := SetString([]byte(tc.in), "model", "gpt-4o")
		if err != nil || string(got) != tc.want {
			t.Errorf("SetString(%s): expected %s, got %s (%v)", tc.in, tc.want, got, err)
		}
		if !json.Valid(got) {
			t.Errorf("SetString(%s) gave invalid JSON %s", tc.in, got)
		}
	}
	for _, bad := range []string{`[1,2]`, `"x"`, ``, `{"model":`} {
		if _, err := SetString([]byte(bad), "model", "m"); err == nil {
			t.Errorf("SetString(%q): expected an error", bad)
		}
	}
	// A model name needing escapes stays valid JSON.
	got, _ := SetString([]byte(`{"model":"a"}`), "model", "we\"ird\n")
	var v struct{ Model string }
	if err := json.Unmarshal(got, &v); err != nil || v.Model != "we\"ird\n" {
		t.Errorf("expected an escaped model name, got %s", got)
	}
}

func TestChatRequestCarriesOnlyProviderCredentials(t *testing.T) {
	ep := &Endpoint{BaseURL: "https://api.example.com/v1", APIKey: "sk-provider", Header: http.Header{"Openai-Organization": {"org-1"}}}
	req, err := OpenAI{}.ChatRequest(context.Background(), ep, "gpt-4o-mini", []byte(`{"model":"fast","stream":true}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if req.URL.String() != "https://api.example.com/v1/chat/completions" || req.Method != http.MethodPost {
		t.Errorf("expected POST to chat/completions, got %s %s", req.Method, req.URL)
	}
	if req.Header.Get("Authorization") != "Bearer sk-provider" || req.Header.Get("Openai-Organization") != "org-1" ||
		req.Header.Get("Accept") != "text/event-stream" {
		t.Errorf("unexpected headers %v", req.Header)
	}
	body, _ := io.ReadAll(req.Body)
	if string(body) != `{"model":"gpt-4o-mini","stream":true}` {
		t.Errorf("expected the upstream model in the body, got %s", body)
	}
}

func TestParseReset(t *testing.T) {
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"20s":                  20 * time.Second,
		"2m59.56s":             179560 * time.Millisecond,
		"6m0s":                 6 * time.Minute,
		"172.799999ms":         172799999 * time.Nanosecond,
		"2":                    2 * time.Second,
		"33011.375":            33011375 * time.Millisecond,
		"2025-08-21T12:40:07Z": 7 * time.Second,
		"1755780030":           30 * time.Second, // Unix seconds
		"1755780030000":        30 * time.Second, // Unix milliseconds
		"2025-08-21T12:39:00Z": 0,                // in the past: already refreshed
		"9999h":                provider.Unknown, // past 24 h: garbage
		"99999999999s":         provider.Unknown, // overflows: garbage
		"-5":                   provider.Unknown,
		"-5s":                  provider.Unknown,
		"NaN":                  provider.Unknown,
		"soon":                 provider.Unknown,
		"":                     provider.Unknown,
	} {
		if got := provider.ParseReset(in, ref); got != want {
			t.Errorf("provider.ParseReset(%q): expected %v, got %v", in, want, got)
		}
	}
}

func TestGarbageHeadersAreUnknown(t *testing.T) {
	h := http.Header{}
	h.Set("x-ratelimit-limit-requests", "lots")
	h.Set("x-ratelimit-remaining-requests", "-1")
	h.Set("x-ratelimit-reset-requests", "whenever")
	h.Set("x-ratelimit-remaining-tokens", "1e400")
	h.Set("Retry-After", "-30")
	o := OpenAI{}.Observe(429, h, []byte(`not json at all`), time.Now())
	if o.Class != provider.RateLimited {
		t.Errorf("a 429 with a garbage body is still rate_limited, got %s", o.Class)
	}
	if o.Requests != provider.UnknownWindow || o.Tokens.Remaining != provider.Unknown || o.RetryAfter != provider.Unknown {
		t.Errorf("garbage must decode to unknown, got %+v", o)
	}
	// Unknown waits still give a bounded, non-zero cooldown.
	if c := capacity.DefaultPolicy.Cooldown(o, 1); c < capacity.DefaultPolicy.BackoffBase || c > time.Minute {
		t.Errorf("expected the backoff floor, got %v", c)
	}
}

func TestMessageHint(t *testing.T) {
	for msg, want := range map[string]time.Duration{
		"Please try again in 125ms.":     125 * time.Millisecond,
		"Please try again in 5.289s.":    5289 * time.Millisecond,
		"Please retry after 5 seconds.":  5 * time.Second,
		"Please retry in 26.211922938s.": 26211922938 * time.Nanosecond,
		"Please try again in 1m30s.":     90 * time.Second,
		"Please try again in 2 minutes.": 2 * time.Minute,
		"You have been rate limited.":    provider.Unknown,
		"Please try again in a moment.":  provider.Unknown,
		"retry in -4s":                   provider.Unknown,
	} {
		if got := provider.MessageHint(msg); got != want {
			t.Errorf("provider.MessageHint(%q): expected %v, got %v", msg, want, got)
		}
	}
}

// streamKinds reads an SSE fixture through the adapter and returns the kind
// of each event, with the error class of an provider.EventError.
func streamKinds(t *testing.T, name string) ([]provider.EventKind, provider.Class, error) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "streams", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := provider.NewSSEReader(f)
	var kinds []provider.EventKind
	var class provider.Class
	for {
		ev, err := r.Next()
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return kinds, class, err
		}
		_, kind, obs := openAIStream{}.Event(ev)
		kinds = append(kinds, kind)
		if kind == provider.EventError {
			class = obs.Class
		}
	}
}

func TestOpenAIStreamFixtures(t *testing.T) {
	// Keep-alive comments before the first event are not content.
	kinds, _, err := streamKinds(t, "deepseek-keepalive-comments.sse")
	want := []provider.EventKind{provider.EventSkip, provider.EventSkip, provider.EventSkip, provider.EventData, provider.EventFinal, provider.EventDone}
	if err != nil || !equalKinds(kinds, want) {
		t.Errorf("deepseek keep-alive: expected %v, got %v (%v)", want, kinds, err)
	}
	// An error object after content began: an in-band error, no terminator.
	kinds, class, err := streamKinds(t, "openai-midstream-error.sse")
	want = []provider.EventKind{provider.EventData, provider.EventData, provider.EventError}
	if err != nil || !equalKinds(kinds, want) || class != provider.Server {
		t.Errorf("openai mid-stream error: expected %v with class server, got %v %s (%v)", want, kinds, class, err)
	}
	// OpenRouter: comments, content, then a chunk with an error and finish_reason "error".
	kinds, class, err = streamKinds(t, "openrouter-midstream-error.sse")
	want = []provider.EventKind{provider.EventSkip, provider.EventSkip, provider.EventData, provider.EventError}
	if err != nil || !equalKinds(kinds, want) || class != provider.Server {
		t.Errorf("openrouter mid-stream error: expected %v with class server, got %v %s (%v)", want, kinds, class, err)
	}
}

func equalKinds(a, b []provider.EventKind) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestStreamEventEdgeCases(t *testing.T) {
	for _, tc := range []struct {
		data  string
		kind  provider.EventKind
		class provider.Class
	}{
		{`{"choices":[{"delta":{"content":"the word \"error\" in text"},"finish_reason":null}]}`, provider.EventData, provider.OK},
		{`{"choices":[{"delta":{},"finish_reason": "length"}]}`, provider.EventFinal, provider.OK},
		{`{"error":{"message":"Rate limit","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}}`, provider.EventError, provider.RateLimited},
		{`{"error":{"message":"x","code":529}}`, provider.EventError, provider.Overloaded},
		{`{"choices":[{"delta":{"content":"unterminated`, provider.EventError, provider.Server},
		{`not json`, provider.EventError, provider.Server},
		{`[DONE]`, provider.EventDone, provider.OK},
	} {
		_, kind, obs := openAIStream{}.Event(&provider.Event{Data: []byte(tc.data)})
		if kind != tc.kind || (kind == provider.EventError && obs.Class != tc.class) {
			t.Errorf("%s: expected kind %d class %s, got %d %s", tc.data, tc.kind, tc.class, kind, obs.Class)
		}
	}
}

func TestSSEReader(t *testing.T) {
	in := ": hello\r\n\r\nevent: message_start\ndata: {\"a\":1}\n\ndata: line1\ndata: line2\n\nid: 7\n\ndata: last\n\n"
	r := provider.NewSSEReader(strings.NewReader(in))
	var got []string
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		prefix := ev.Name
		if ev.Comment {
			prefix = "comment"
		}
		got = append(got, prefix+"|"+string(ev.Data))
	}
	want := []string{"comment|hello", "message_start|{\"a\":1}", "|line1\nline2", "|last"}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Errorf("expected %q, got %q", want, got)
	}

	// Cut inside an event, or inside a line: an unexpected EOF, never a clean end.
	for _, cut := range []string{"data: {\"a\":1}\n", "data: {\"a\":"} {
		r := provider.NewSSEReader(strings.NewReader(cut))
		if _, err := r.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%q: expected io.ErrUnexpectedEOF, got %v", cut, err)
		}
	}
	// An endless line is bounded.
	r = provider.NewSSEReader(io.LimitReader(infinite{}, 4*provider.MaxEventSize))
	if _, err := r.Next(); !errors.Is(err, provider.ErrEventTooLarge) {
		t.Errorf("expected provider.ErrEventTooLarge, got %v", err)
	}
}

type infinite struct{}

func (infinite) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestCheckKeys(t *testing.T) {
	names := []string{"model", "stream"}
	for body, ok := range map[string]bool{
		`{"model":"a","stream":true,"messages":[]}`:          true,
		`{"model":"a","model":"b"}`:                          false,
		`{"model":"a","MODEL":"b"}`:                          false,
		`{"Stream":true}`:                                    false,
		`{"mod\u0065l":"a","model":"b"}`:                     false,
		`{"messages":[{"model":"x"}],"extra":{"model":"y"}}`: true,
		`[1]`: false,
	} {
		if err := CheckKeys([]byte(body), names...); (err == nil) != ok {
			t.Errorf("CheckKeys(%s): expected ok=%v, got %v", body, ok, err)
		}
	}
	// An escaped key is still the key: the model is replaced, not duplicated.
	out, err := SetString([]byte(`{"mod\u0065l":"fast"}`), "model", "up")
	if err != nil || string(out) != `{"mod\u0065l":"up"}` {
		t.Errorf("expected the escaped key's value replaced, got %s %v", out, err)
	}
}

func TestNamedErrorEvent(t *testing.T) {
	_, kind, obs := openAIStream{}.Event(&provider.Event{Name: "error", Data: []byte(`{"type":"error","message":"overloaded"}`)})
	if kind != provider.EventError || obs.Class != provider.Server {
		t.Errorf("expected an error event, got %d %s", kind, obs.Class)
	}
}
