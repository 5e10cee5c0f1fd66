package adapters

import (
	"bufio"
	"bytes"
	"encoding/json"
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

// Fuzz targets for everything that reads a provider's bytes. Their seed
// corpora are the fixtures plus testdata/fuzz/<Target>/, and `go test` runs
// them as normal tests; `go test -fuzz FuzzX ./adapters` explores further.

// fixtureSeeds adds every provider fixture's header block and body.
func fixtureSeeds(f *testing.F, add func(h http.Header, body []byte)) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.http"))
	for _, name := range files {
		raw, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		if err != nil {
			f.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		add(resp.Header, body)
	}
}

// FuzzOpenAIObserve: any header values and body decode without panicking,
// and every decoded wait is bounded.
func FuzzOpenAIObserve(f *testing.F) {
	fixtureSeeds(f, func(h http.Header, body []byte) {
		var b strings.Builder
		_ = h.Write(&b)
		f.Add(429, b.String(), body)
	})
	f.Add(200, "X-Ratelimit-Reset-Requests: 1e400\r\nRetry-After: -1\r\n", []byte(`{"error":"x"}`))
	f.Fuzz(func(t *testing.T, status int, headers string, body []byte) {
		h := http.Header{}
		for _, line := range strings.Split(headers, "\r\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
			}
		}
		now := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
		o := (&OpenAI{}).Observe(status, h, body, now)
		for _, d := range []time.Duration{o.RetryAfter, o.Requests.Reset, o.Tokens.Reset} {
			if d < provider.Unknown || d > provider.MaxCooldown {
				t.Fatalf("wait out of bounds: %v", d)
			}
		}
		for _, n := range []int64{o.Requests.Limit, o.Requests.Remaining, o.Tokens.Limit, o.Tokens.Remaining} {
			if n < provider.Unknown {
				t.Fatalf("count below unknown: %d", n)
			}
		}
		if c := capacity.DefaultPolicy.Cooldown(o, 3); c < 0 || c > provider.MaxCooldown {
			t.Fatalf("cooldown out of bounds: %v", c)
		}
	})
}

// FuzzSSE: any byte stream ends in EOF, an unexpected EOF or a bounded
// error, never a panic or an event over the size limit; and the OpenAI
// stream decoder takes any event.
func FuzzSSE(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "streams", "*.sse"))
	for _, name := range files {
		raw, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte("data: {\"a\":1}\r\n\r\n: c\n\ndata"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		r := provider.NewSSEReader(bytes.NewReader(raw))
		dec := chatDecoder(byName("openai", provider.Endpoint{}))
		for i := 0; ; i++ {
			ev, err := r.Next()
			if err != nil {
				return
			}
			if len(ev.Data) > provider.MaxEventSize {
				t.Fatalf("event of %d bytes", len(ev.Data))
			}
			if i > len(raw)+1 {
				t.Fatal("more events than bytes: the reader loops")
			}
			out, kind, _ := dec.Event(ev)
			if (kind == provider.EventData || kind == provider.EventFinal) && !json.Valid(out) {
				t.Fatalf("relayed invalid JSON %q", out)
			}
		}
	})
}

func TestCheckCompletion(t *testing.T) {
	for body, want := range map[string]string{
		`{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`:      "",
		`{"choices":[{"message":{"content":null,"tool_calls":[]}},{"message":{"content":[]}}]}`: "",
		`{"error":null,"choices":[{"message":{}}]}`:                                             "",
		`{"choices":[{"message":{"content":"a"}}]} x`:                                           "not a JSON chat completion",
		`[{"choices":[]}]`:                        "not a JSON chat completion",
		`{"choices":5}`:                           "not a JSON chat completion",
		`{"choices":[5]}`:                         "not a JSON chat completion",
		`{"choices":[{"message":"hi"}]}`:          "not a JSON chat completion",
		`{"error":{"message":"overloaded"}}`:      "the answer is an error: overloaded",
		`{"choices":[]}`:                          "no choices",
		`{"choices":null}`:                        "no choices",
		`{"id":"x"}`:                              "no choices",
		`{"choices":[null]}`:                      "without a message",
		`{"choices":[{"message":null}]}`:          "without a message",
		`{"choices":[{"delta":{}}]}`:              "without a message",
		`{"choices":[{"message":{"content":5}}]}`: "neither text nor parts",
	} {
		err := checkCompletion([]byte(body))
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: expected %q, got %v", body, want, err)
		}
	}
}

// FuzzCheckCompletion: what the scan accepts, decoding accepts too (the
// scan reads keys exactly; encoding/json also matches them in any case, so
// bodies with such keys are left out).
func FuzzCheckCompletion(f *testing.F) {
	for _, s := range []string{`{"choices":[{"message":{"content":"hi"}}]}`, `{"choices":[null]}`,
		`{"error":null,"choices":[{"message":{"content":[{"type":"text"}]}}]}`, `{"choices":[{"message":{"content":5}}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if checkCompletion(body) != nil {
			return
		}
		lower := bytes.ToLower(body)
		for _, k := range []string{`"choices"`, `"error"`, `"message"`, `"content"`} {
			if bytes.Count(lower, []byte(k)) != bytes.Count(body, []byte(k)) {
				return
			}
		}
		var c struct {
			Choices []*struct {
				Message *struct {
					Content json.RawMessage `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(body, &c); err != nil {
			t.Fatalf("%s: accepted, but does not decode: %v", body, err)
		}
		if len(c.Error) > 0 && string(c.Error) != "null" || len(c.Choices) == 0 {
			t.Fatalf("%s: accepted with an error or no choices", body)
		}
		for _, ch := range c.Choices {
			if ch == nil || ch.Message == nil {
				t.Fatalf("%s: accepted with a choice without a message", body)
			}
		}
	})
}
