package router

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// tokenWindowed is a provider with a fixed tokens-per-span window, as
// OpenAI admits a request: on an estimate made from the request itself
// (its characters / 4 and its max_tokens), before any token is generated
// (PROVIDERS.md). It states the window in x-ratelimit-*-tokens.
type tokenWindowed struct {
	c              *manualClock
	limit          int64
	span           time.Duration
	mu             sync.Mutex
	w              fixedSpan
	served, got429 int
	latency        time.Duration // of an answer, after admission
}

func (p *tokenWindowed) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	var b struct {
		MaxTokens int64 `json:"max_tokens"`
		Messages  []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &b)
	cost := b.MaxTokens
	for _, m := range b.Messages {
		cost += int64(len(m.Content)+3) / 4
	}
	resp := p.admit(req, cost)
	if resp.StatusCode == 200 {
		_ = p.c.Sleep(req.Context(), p.latency) // the headers come with the whole answer
	}
	return resp, nil
}

// admit decides a request of cost tokens when it arrives.
func (p *tokenWindowed) admit(req *http.Request, cost int64) *http.Response {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.w.take(p.c.Now(), p.span, p.limit, cost, "tokens")
	if !ok {
		p.got429++
		return &http.Response{StatusCode: 429, Header: h, Body: io.NopCloser(strings.NewReader(rateLimited)), Request: req}
	}
	p.served++
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader(okBody)), Request: req}
}

// The burst on a token window: 4,000 tokens per 10 s, 30 requests
// of max_tokens 900 at once, deadline 20 s. Two windows before the
// deadline hold 4 each; the 22 others cannot be served before it and are
// told so at once, not when their deadline passes, although the window
// has stated nothing yet of what an attempt counts (the estimate is what
// the provider admits on).
func TestATokenWindowTellsAnUnservableRequestAtOnce(t *testing.T) {
	c := newManualClock()
	p := &tokenWindowed{c: c, limit: 4000, span: 10 * time.Second}
	r, g := manualGroup(c, p, 20*time.Second)
	req := func(i int) *Request {
		body := `{"model":"limited","max_tokens":900,"user":"u` + strconv.Itoa(i) + `","messages":[{"role":"user","content":"hi"}]}`
		return &Request{Request: wire([]byte(body), false), Tokens: 901, PromptTokens: 1, OutputTokens: 900}
	}
	if res := r.ServeGroup(context.Background(), g, req(-1)); res.Err != nil {
		t.Fatalf("warm-up: %v", res.Err)
	}
	c.advanceTo(c.Now().Add(10*time.Second + 2*capacity.ResetMargin))
	p.served, p.latency = 0, 100*time.Millisecond
	start := c.Now()
	out := make([]served, 30)
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, req(i)), c.Now().Sub(start))
	})
	ok, atOnce := 0, 0
	for i, o := range out {
		switch o.status {
		case 200:
			ok++
		case 429:
			if o.at > 50*time.Millisecond {
				t.Errorf("request %d: its 429 came after %v, not at once", i, o.at)
			} else {
				atOnce++
			}
		default:
			t.Errorf("request %d: unexpected %+v", i, o)
		}
	}
	if ok != 8 || atOnce != 22 || p.got429 != 0 {
		t.Errorf("expected 8 served, 22 told at once and no upstream 429, got %d, %d and %d", ok, atOnce, p.got429)
	}
}
