package router

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A group none of whose deployments can serve goes on to its fallback
// group, within the same deadline and attempt budget; the result says
// which group answered.
func TestFallbackGroup(t *testing.T) {
	ok := func() *script {
		return &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	}
	limited := func() *script {
		return &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "600")}}
	}
	failing := func() *script {
		return &script{replies: []func(*http.Request) (*http.Response, error){reply(500, `{"error":{"message":"boom"}}`)}}
	}
	setup := func(smart, fast []*script) (*Router, *Group, *Group, *fakeClock) {
		clock := newFakeClock()
		r := newRouter(clock)
		var sd, fd []*Deployment
		for i, s := range smart {
			sd = append(sd, deployment("smart"+string(rune('a'+i)), s))
		}
		for i, s := range fast {
			fd = append(fd, deployment("fast"+string(rune('a'+i)), s))
		}
		f := NewGroup("fast", fd)
		g := NewGroup("smart", sd)
		g.Fallback = f
		return r, g, f, clock
	}

	t.Run("rate-limited past the deadline", func(t *testing.T) {
		sa, fa := limited(), ok()
		r, g, f, clock := setup([]*script{sa}, []*script{fa})
		res := r.ServeGroup(context.Background(), g, chatReq)
		if res.Err != nil || res.Status != 200 || res.Group != f || res.Deployment != f.Deployments[0] {
			t.Fatalf("expected fast to answer 200, got %v %d group %v", res.Err, res.Status, res.Group)
		}
		if res.Attempts != 2 || res.FailoverReason != provider.RateLimited || sa.calls.Load() != 1 || fa.calls.Load() != 1 {
			t.Errorf("expected one attempt on each group after a 429, got %d attempts (%v), calls %d and %d",
				res.Attempts, res.FailoverReason, sa.calls.Load(), fa.calls.Load())
		}
		if s := clock.Sleeps(); len(s) != 0 {
			t.Errorf("expected no wait, got %v", s)
		}
		// Within the 600 s, smart is known to be out: fast at once, smart untouched.
		res = r.ServeGroup(context.Background(), g, chatReq)
		if res.Group != f || res.Attempts != 1 || sa.calls.Load() != 1 {
			t.Errorf("expected fast at once, got group %v after %d attempts, smart called %d times", res.Group, res.Attempts, sa.calls.Load())
		}
	})

	t.Run("a 429 within the deadline", func(t *testing.T) {
		sa := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "2")}}
		fa := ok()
		r, g, f, clock := setup([]*script{sa}, []*script{fa})
		res := r.ServeGroup(context.Background(), g, chatReq)
		if res.Status != 200 || res.Group != f || res.Attempts != 2 || len(clock.Sleeps()) != 0 {
			t.Errorf("expected fast at once after smart's 429, got %d group %s after %d attempts and waits %v", res.Status, res.Group.Name, res.Attempts, clock.Sleeps())
		}
	})

	t.Run("healthy first group", func(t *testing.T) {
		sa, fa := ok(), ok()
		r, g, _, _ := setup([]*script{sa}, []*script{fa})
		if res := r.ServeGroup(context.Background(), g, chatReq); res.Group != g || res.Tried != g || fa.calls.Load() != 0 {
			t.Errorf("expected smart to answer and fast untouched, got group %v (tried %v), fast called %d times", res.Group, res.Tried, fa.calls.Load())
		}
	})

	t.Run("the attempt budget is shared", func(t *testing.T) {
		sa, sb, fa := failing(), failing(), ok()
		r, g, _, _ := setup([]*script{sa, sb}, []*script{fa})
		r.MaxAttempts = 2
		res := r.ServeGroup(context.Background(), g, chatReq)
		var e *Error
		if !errors.As(res.Err, &e) || e.Status != http.StatusBadGateway || res.Attempts != 2 || fa.calls.Load() != 0 {
			t.Errorf("expected a 502 after 2 attempts and fast untouched, got %v after %d, fast called %d times", res.Err, res.Attempts, fa.calls.Load())
		}
		r.MaxAttempts = 3
		sa.calls.Store(0)
		res = r.ServeGroup(context.Background(), g, chatReq)
		if res.Status != 200 || res.Attempts != 1 || fa.calls.Load() != 1 {
			// smart's two cool down after their 500s: fast at once, no wait for a retry.
			t.Errorf("expected fast after smart's deployments cooled down, got %v %d after %d attempts", res.Err, res.Status, res.Attempts)
		}
	})

	t.Run("context too small", func(t *testing.T) {
		sa, fa := ok(), ok()
		r, g, f, _ := setup([]*script{sa}, []*script{fa})
		g.Deployments[0].ContextWindow, f.Deployments[0].ContextWindow = 8000, 200000
		big := &Request{Request: chatReq.Request, Tokens: 50000}
		res := r.ServeGroup(context.Background(), g, big)
		if res.Status != 200 || res.Group != f || res.Attempts != 1 || sa.calls.Load() != 0 {
			t.Errorf("expected fast's larger window at once, got %v %d group %s after %d attempts", res.Err, res.Status, res.Group.Name, res.Attempts)
		}
		// Too large for both: the 400 says so of the chain, by the largest window.
		huge := &Request{Request: chatReq.Request, Tokens: 500000}
		res = r.ServeGroup(context.Background(), g, huge)
		var e *Error
		if !errors.As(res.Err, &e) || e.Class != provider.ContextLength || res.Attempts != 0 ||
			!strings.Contains(e.Message, "every deployment of this model or its fallback groups (the largest: 200000 tokens)") {
			t.Errorf("expected a 400 for the chain, got %v after %d attempts", res.Err, res.Attempts)
		}
		// The provider's own context_length answer falls back too.
		g.Deployments[0].ContextWindow = 0
		sa.replies = []func(*http.Request) (*http.Response, error){reply(400, `{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}`)}
		res = r.ServeGroup(context.Background(), g, big)
		if res.Status != 200 || res.Group != f || res.Attempts != 2 || sa.calls.Load() != 1 {
			t.Errorf("expected fast after smart's context_length, got %v %d group %s after %d attempts", res.Err, res.Status, res.Group.Name, res.Attempts)
		}
	})

	t.Run("a bad request is not retried elsewhere", func(t *testing.T) {
		sa, fa := &script{replies: []func(*http.Request) (*http.Response, error){reply(400, `{"error":{"message":"temperature must be at most 2","type":"invalid_request_error"}}`)}}, ok()
		r, g, _, _ := setup([]*script{sa}, []*script{fa})
		res := r.ServeGroup(context.Background(), g, chatReq)
		if res.Status != 400 || res.Group != g || fa.calls.Load() != 0 {
			t.Errorf("expected smart's 400 passed on and fast untouched, got %d group %s, fast called %d times", res.Status, res.Group.Name, fa.calls.Load())
		}
	})

	t.Run("both out", func(t *testing.T) {
		// smart back in 5 s, fast in 600 s: smart's 429 and its Retry-After.
		sa := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "5")}}
		r, g, f, _ := setup([]*script{sa}, []*script{limited()})
		r.Deadline = 3 * time.Second
		res := r.ServeGroup(context.Background(), g, chatReq)
		var e *Error
		if !errors.As(res.Err, &e) || e.Status != http.StatusTooManyRequests || e.RetryAfter != 5*time.Second || res.Group != g || res.Attempts != 2 {
			t.Errorf("expected smart's 429 with Retry-After 5 after 2 attempts, got %v (%v) group %s after %d", res.Err, e, res.Group.Name, res.Attempts)
		}
		// The client is told smart's failure, but the request went on to
		// fast (what the fallbacks metric counts).
		if res.Tried != f {
			t.Errorf("expected fast as the last group tried, got %v", res.Tried)
		}
	})

	t.Run("a fallback that refuses the request", func(t *testing.T) {
		// smart is rate-limited; fast's window is too small for the prompt:
		// the client is told to retry (smart will take it), not that its
		// request is too large.
		r, g, f, _ := setup([]*script{limited()}, []*script{ok()})
		f.Deployments[0].ContextWindow = 1000
		res := r.ServeGroup(context.Background(), g, &Request{Request: chatReq.Request, Tokens: 5000})
		var e *Error
		if !errors.As(res.Err, &e) || e.Status != http.StatusTooManyRequests || e.RetryAfter != 600*time.Second || res.Group != g || res.Attempts != 1 {
			t.Errorf("expected smart's 429 after 1 attempt, got %v group %s after %d", res.Err, res.Group.Name, res.Attempts)
		}
	})

	t.Run("a group that does not serve the API", func(t *testing.T) {
		// smart has only an Anthropic deployment: no embeddings; fast does.
		sa, fa := ok(), &script{replies: []func(*http.Request) (*http.Response, error){reply(200, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"e"}`)}}
		r, g, f, _ := setup([]*script{sa}, []*script{fa})
		g.Deployments[0].Provider = &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://smart.invalid/v1", APIKey: "k"}}
		emb := &Request{Request: &provider.Request{Format: provider.Embeddings, Body: []byte(`{"model":"smart","input":"hi"}`), Choices: 1}, Tokens: 2}
		if !g.Serves(provider.Embeddings) || Serves(g.Deployments, provider.Embeddings) {
			t.Fatal("expected the chain to serve embeddings, and smart alone not")
		}
		res := r.ServeGroup(context.Background(), g, emb)
		if res.Status != 200 || res.Group != f || res.Attempts != 1 || sa.calls.Load() != 0 {
			t.Errorf("expected fast to answer the embeddings at once, got %v %d group %s after %d attempts", res.Err, res.Status, res.Group.Name, res.Attempts)
		}
	})

	t.Run("a loop built by hand ends", func(t *testing.T) {
		sa := limited()
		r, g, _, _ := setup([]*script{sa}, nil)
		g.Fallback = g
		r.MaxAttempts = 100
		res := r.ServeGroup(context.Background(), g, chatReq)
		if res.Err == nil || sa.calls.Load() != 1 {
			t.Errorf("expected one attempt and an error, got %v after %d calls", res.Err, sa.calls.Load())
		}
	})
}

// A group whose every deployment an operator disabled answers 503 and says
// why; one of them enabled serves again.
func TestEveryDeploymentDisabled(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", a), deployment("b", a)}
	now := time.Now()
	group[0].State.Disable(now, true)
	group[1].State.Disable(now, true)
	res := newRouter(newFakeClock()).Serve(context.Background(), group, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, "disabled by its operator") || a.calls.Load() != 0 {
		t.Errorf("expected a 503 naming the drain, got %v after %d calls", res.Err, a.calls.Load())
	}
	group[1].State.Disable(now, false)
	if res := newRouter(newFakeClock()).Serve(context.Background(), group, chatReq); res.Err != nil || res.Deployment != group[1] {
		t.Errorf("expected b to serve once enabled, got %v", res.Err)
	}
}
