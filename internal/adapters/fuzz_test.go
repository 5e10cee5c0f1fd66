package adapters

import (
	"bufio"
	"bytes"
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
		o := OpenAI{}.Observe(status, h, body, now)
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

// FuzzParseReset: any reset value reads as Unknown or a bounded wait.
func FuzzParseReset(f *testing.F) {
	for _, s := range []string{"20s", "2m59.56s", "172.799999ms", "2", "33011.38", "2025-08-21T12:40:07Z",
		"1755780030", "1755780030000", "Thu, 21 Aug 2025 12:40:42 GMT", "-5", "NaN", "1e400", ""} {
		f.Add(s)
	}
	ref := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		if d := provider.ParseReset(v, ref); d < provider.Unknown || d > provider.MaxCooldown {
			t.Fatalf("provider.ParseReset(%q) = %v out of bounds", v, d)
		}
		if d := provider.MessageHint("Please try again in " + v); d < provider.Unknown || d > provider.MaxCooldown {
			t.Fatalf("provider.MessageHint(%q) = %v out of bounds", v, d)
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
		dec := OpenAI{}.NewStreamDecoder()
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
			if (kind == provider.EventData || kind == provider.EventFinal) && !jsonValid(out) {
				t.Fatalf("relayed invalid JSON %q", out)
			}
		}
	})
}

// FuzzRequestBody: the body scanners agree with encoding/json: a body they
// accept stays valid JSON with the model set, whatever its shape.
func FuzzRequestBody(f *testing.F) {
	for _, s := range []string{`{"model":"fast","messages":[{"role":"user","content":"hi"}]}`,
		`{"mod\u0065l":"a"}`, `{"model":"a","model":"b"}`, `{ }`, `{"a":{"model":[1,{"x":"\"}"}]}}`, `[1]`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_ = CheckKeys(body, "model", "stream")
		if !jsonValid(body) {
			return
		}
		out, err := SetString(body, "model", "up-model")
		if err != nil {
			return
		}
		if !jsonValid(out) {
			t.Fatalf("SetString(%q) gave invalid JSON %q", body, out)
		}
		if CheckKeys(body, "model") == nil {
			var v struct{ Model string }
			if jsonUnmarshal(out, &v) == nil && v.Model != "up-model" {
				t.Fatalf("SetString(%q) = %q: model is %q", body, out, v.Model)
			}
		}
	})
}
