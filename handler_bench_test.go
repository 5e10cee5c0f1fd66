package llmrouter

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// benchUpstream answers every request with OpenAI's recorded 200
// (testdata/bench/openai-200.http: its x-ratelimit-* headers and its body)
// when limited, else with the same body alone.
func benchUpstream(b testing.TB, limited bool) *httptest.Server {
	raw, err := os.ReadFile(filepath.Join("testdata", "bench", "openai-200.http"))
	if err != nil {
		b.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		for k, v := range resp.Header {
			if limited || !strings.HasPrefix(strings.ToLower(k), "x-ratelimit-") {
				w.Header()[k] = v
			}
		}
		_, _ = w.Write(body)
	}))
}

// streamHandler is a provisioned Handler of one openai deployment on the
// upstream at url.
func streamHandler(b testing.TB, url string) *Handler {
	return provisioned(b, "llm_router {\nprovider up {\n type openai\n api_key sk-test\n base_url "+url+"/v1\n}\nmodel bench {\ndeployment up gpt-4o-mini\n}\n}")
}

// benchHandler is a provisioned Handler of n openai deployments, each on
// its own upstream.
func benchHandler(b testing.TB, n int, limited bool, options ...string) *Handler {
	var cfg strings.Builder
	cfg.WriteString("llm_router {\n")
	for i := range n {
		up := benchUpstream(b, limited)
		b.Cleanup(up.Close)
		fmt.Fprintf(&cfg, "provider up%d {\n type openai\n api_key sk-bench-%d\n base_url %s/v1\n}\n", i, i, up.URL)
	}
	cfg.WriteString("model bench {\n")
	for i := range n {
		fmt.Fprintf(&cfg, "deployment up%d gpt-4o-mini {\n%s\n}\n", i, strings.Join(options, "\n"))
	}
	cfg.WriteString("}\n}")
	return provisioned(b, cfg.String())
}

// provisioned is the Handler of a Caddyfile block, provisioned.
func provisioned(b testing.TB, cfg string) *Handler {
	h := handlerFromCaddyfile(b, cfg)
	b.Cleanup(func() { _ = h.Cleanup() })
	// Caddy's default level is INFO: nothing of a served request is logged
	// but the access log (which the benchmark leaves out).
	h.logger, h.router.Logger = zap.NewNop(), zap.NewNop()
	return h
}

// benchBody is the bench's chat request (bench/runs.go's chatBody): a
// system prompt and a question, about 1 KB.
var benchBody = `{"max_tokens":128,"messages":[{"content":"` +
	strings.Repeat("You are a helpful assistant for the support team. Answer in the customer's language, in at most three sentences. ", 7) +
	`","role":"system"},{"content":"My order 4711 has not arrived yet, it was due on Monday. Can you tell me where it is and when it will be delivered?","role":"user"}],"model":"bench","temperature":0.2}`

// BenchmarkHandler is one non-streaming chat request through
// Handler.ServeHTTP as Caddy's server calls it (a replacer and the access
// log's extra fields in the request's context), on upstreams in the same
// process (loopback HTTP): 1 deployment, and 8 whose answers carry
// x-ratelimit-* headers. Its allocations are the handler's and the
// upstream server's together.
func BenchmarkHandler(b *testing.B) {
	for _, c := range []struct {
		name    string
		n       int
		limited bool
	}{{"deployments=1", 1, false}, {"deployments=8-ratelimit-headers", 8, true}} {
		b.Run(c.name, func(b *testing.B) {
			h := benchHandler(b, c.n, c.limited)
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(benchBody))
				r.Header.Set("Content-Type", "application/json")
				ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer())
				ctx = context.WithValue(ctx, caddyhttp.ExtraLogFieldsCtxKey, new(caddyhttp.ExtraLogFields))
				w := httptest.NewRecorder()
				if err := h.ServeHTTP(w, r.WithContext(ctx), nil); err != nil || w.Code != http.StatusOK {
					b.Fatalf("%d %s %v", w.Code, w.Body, err)
				}
			}
		})
	}
}
