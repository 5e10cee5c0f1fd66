package fleet

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// fakeProvider answers every attempt at once with a chat completion and
// x-ratelimit-* headers whose remaining count goes down, so that every
// answer changes the state and is published.
type fakeProvider struct{ n atomic.Int64 }

var benchBody = []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":1732900000,"model":"bench-up","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":2,"total_tokens":22}}`)

func (f *fakeProvider) RoundTrip(req *http.Request) (*http.Response, error) {
	n := f.n.Add(1)
	h := http.Header{
		"Content-Type":                   {"application/json"},
		"X-Ratelimit-Limit-Requests":     {"1000000000"},
		"X-Ratelimit-Remaining-Requests": {strconv.FormatInt(1000000000-n, 10)},
		"X-Ratelimit-Reset-Requests":     {"20s"},
	}
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(bytes.NewReader(benchBody)), Request: req}, nil
}

// BenchmarkServeStore is one non-streaming request through router.Serve
// (ranking, Acquire, the exchange with a provider that answers at once,
// Observe, Release) with the deployment's state kept in memory only, or
// bound to a Redis fleet store: without declared limits (the request path
// never calls Redis; what changed is published in the background) and with
// a declared rpm (one Lua round trip per request). The difference between
// the cases is what fleet mode adds to each request.
//
//	go test -run '^$' -bench BenchmarkServeStore -benchtime 2s ./fleet
//
// It uses the Redis named by LLM_ROUTER_REDIS_URL, else a redis-server it
// starts, else miniredis (in process: not a network round trip).
func BenchmarkServeStore(b *testing.B) {
	url, backend := benchRedis(b)
	b.Logf("redis: %s", backend)
	for _, c := range []struct {
		name  string
		store bool
		rpm   int64
	}{
		{"memory", false, 0},
		{"redis", true, 0},
		{"memory-rpm", false, 1 << 40},
		{"redis-rpm", true, 1 << 40},
	} {
		b.Run(c.name, func(b *testing.B) {
			st := capacity.NewState()
			st.Declare(c.rpm, 0)
			if c.store {
				s, err := New(Options{URL: url, KeyPrefix: "bench:" + c.name + ":"})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				s.Bind(testIdentity, st)
				deadline := time.Now().Add(5 * time.Second)
				for !s.Up() {
					if time.Now().After(deadline) {
						b.Fatal("the store did not come up")
					}
					time.Sleep(time.Millisecond)
				}
			}
			d := &router.Deployment{Name: "bench/bench-up", Model: "bench-up",
				Provider:  &adapters.OpenAI{Endpoint: provider.Endpoint{BaseURL: "http://bench.invalid/v1", APIKey: "sk-bench"}},
				Transport: &fakeProvider{}, Timeout: 30 * time.Second, TTFTTimeout: 15 * time.Second, IdleTimeout: 30 * time.Second,
				Weight: 1, State: st}
			group := []*router.Deployment{d}
			r := router.New()
			req := &router.Request{Request: &provider.Request{Format: provider.Chat, Choices: 1,
				Body: []byte(`{"model":"fast","messages":[{"role":"user","content":"hi"}]}`)}, PromptTokens: 20, Tokens: 20}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if res := r.Serve(ctx, group, req); res.Status != 200 {
					b.Fatalf("expected 200, got %d %v", res.Status, res.Err)
				}
			}
		})
	}
}

func benchRedis(b *testing.B) (url, backend string) {
	if u := realRedisURLIfAny(b); u != "" {
		return u, "redis-server " + u
	}
	m := miniredis.RunT(b)
	return "redis://" + m.Addr(), "miniredis (no redis-server on PATH)"
}

// realRedisURLIfAny is realRedisURL without skipping: "" when there is no
// real Redis.
func realRedisURLIfAny(b *testing.B) string {
	if u := os.Getenv("LLM_ROUTER_REDIS_URL"); u != "" {
		return u
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return ""
	}
	return startRedis(b, freePort(b, 0, 0)).URL()
}
