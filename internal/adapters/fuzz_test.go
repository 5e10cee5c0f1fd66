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
