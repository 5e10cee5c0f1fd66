package llmrouter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// countAccounts is two Anthropic accounts behind one server (/a/v1 and
// /b/v1): the first count_tokens request, at whichever account it reaches,
// gets the 429 of Anthropic's token counting, whose limits are its own
// (testdata/count/anthropic-count-429.http), every later one
// {"input_tokens":7}. It counts each account's count_tokens requests.
type countAccounts struct {
	mu    sync.Mutex
	asked map[string]int // by account: "a", "b"
	first string         // the account that answered 429
}

func (c *countAccounts) serve(t *testing.T) http.HandlerFunc {
	raw, err := os.ReadFile("testdata/count/anthropic-count-429.http")
	if err != nil {
		t.Fatal(err)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		account, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if !strings.HasSuffix(r.URL.Path, "/v1/messages/count_tokens") {
			http.Error(w, "not this", http.StatusNotFound)
			return
		}
		c.mu.Lock()
		c.asked[account]++
		limited := c.first == ""
		if limited {
			c.first = account
		}
		c.mu.Unlock()
		if !limited {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"input_tokens":7}`))
			return
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), r)
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.Header().Del("Date") // the fixture's date is long past: its retry-after counts from now
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}
}

// A count_tokens request is an attempt like any other: the deployment that
// answers 429 is observed (the capacity state of its counts records the
// rate limit and cools it; its Messages state is untouched), the request
// goes on to the other deployment, the router's headers and placeholders
// say so, and the next count does not ask the cooling one again.
func TestCountTokensGoesThroughTheRouter(t *testing.T) {
	accounts := &countAccounts{asked: map[string]int{}}
	upstream := httptest.NewServer(accounts.serve(t))
	defer upstream.Close()
	h := handlerFromCaddyfile(t, `llm_router {
		provider a {
			type anthropic
			base_url `+upstream.URL+`/a/v1
			api_key sk-ant-a
		}
		provider b {
			type anthropic
			base_url `+upstream.URL+`/b/v1
			api_key sk-ant-b
		}
		model claude {
			deployment a claude-x
			deployment b claude-x
		}
	}`)
	defer h.Cleanup()
	count := func() (*httptest.ResponseRecorder, *caddy.Replacer) {
		r := postJSON("/v1/messages/count_tokens", `{"model":"claude","messages":[{"role":"user","content":"Count these words."}]}`)
		repl := caddy.NewReplacer()
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, nil); err != nil {
			t.Fatal(err)
		}
		return w, repl
	}
	w, repl := count()
	if w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != `{"input_tokens":7}` || w.Header().Get(HeaderTokenCount) != "" {
		t.Fatalf("expected the second deployment's count, got %d %s %v", w.Code, w.Body, w.Header())
	}
	first, other := accounts.first, map[string]string{"a": "b", "b": "a"}[accounts.first]
	if got := w.Header().Get(HeaderDeployment); got != other+"/claude-x" || w.Header().Get(HeaderAttempts) != "2" {
		t.Errorf("expected 2 attempts, answered by %s/claude-x, got %q after %q", other, got, w.Header().Get(HeaderAttempts))
	}
	if got, _ := repl.Get("http.llm_router.attempts"); got != 2 {
		t.Errorf("expected the placeholder to count 2 attempts, got %v", got)
	}
	limited := h.groups["claude"].Deployments[map[string]int{"a": 0, "b": 1}[first]]
	snap := limited.CountState.Snapshot(time.Now())
	if snap.LastClass == nil || *snap.LastClass != provider.RateLimited {
		t.Errorf("expected %s's count state to record the 429, got %+v", limited.Name, snap)
	}
	if at, why := limited.CountState.AvailableAt(time.Now(), 0); !at.After(time.Now()) || why != provider.RateLimited {
		t.Errorf("expected %s's counts to cool after its 429 (retry-after 20), available at %v (%s)", limited.Name, at, why)
	}
	if snap := limited.State.Snapshot(time.Now()); snap.LastClass != nil {
		t.Errorf("expected %s's Messages state untouched by a count, got %+v", limited.Name, snap)
	}

	w, _ = count()
	if w.Code != http.StatusOK || w.Header().Get(HeaderDeployment) != other+"/claude-x" || w.Header().Get(HeaderAttempts) != "1" {
		t.Errorf("expected the next count at %s/claude-x at once, got %d %v", other, w.Code, w.Header())
	}
	accounts.mu.Lock()
	defer accounts.mu.Unlock()
	if accounts.asked[first] != 1 || accounts.asked[other] != 2 {
		t.Errorf("expected the cooling account asked once and the other twice, got %v", accounts.asked)
	}
}

// With no deployment that counts (no Anthropic one), count_tokens answers
// the router's estimate, marked by HeaderTokenCount, in the Messages
// format; nothing is sent upstream.
func TestCountTokensEstimatesWithoutACounter(t *testing.T) {
	asked := 0
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked++
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer upstream.Close()
	h := handlerFromCaddyfile(t, `llm_router {
		provider oa {
			type openai
			base_url `+upstream.URL+`/v1
			api_key sk-oa
		}
		model gpt {
			deployment oa gpt-x
		}
	}`)
	defer h.Cleanup()
	w := httptest.NewRecorder()
	_ = h.ServeHTTP(w, postJSON("/v1/messages/count_tokens", `{"model":"gpt","messages":[{"role":"user","content":"Count these words, please."}]}`), nil)
	var out struct {
		InputTokens int64 `json:"input_tokens"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || w.Code != http.StatusOK ||
		w.Header().Get(HeaderTokenCount) != "estimate" || out.InputTokens < 5 || out.InputTokens > 40 {
		t.Errorf("expected the router's estimate, marked, got %d %s %v", w.Code, w.Body, w.Header())
	}
	if asked != 0 {
		t.Errorf("expected nothing sent upstream, got %d requests", asked)
	}
}
