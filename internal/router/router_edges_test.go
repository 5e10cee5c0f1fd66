package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/estimate"
	"github.com/llmrouter/caddy-llm-router/provider"
)

const dTooLong = `{"error":{"message":"maximum context length is 8192","type":"invalid_request_error","code":"context_length_exceeded"}}`

func dScript(r ...func(*http.Request) (*http.Response, error)) *script { return &script{replies: r} }

// dGroups chains g -> f, each of the deployments given.
func dGroups(gd, fd []*Deployment) (*Group, *Group) {
	f := NewGroup("f", fd)
	g := NewGroup("g", gd)
	g.Fallback = f
	return g, f
}

// A prompt that fits a window exactly (prompt + max_tokens == window) is
// sent: by the estimate for any model, by the exact count for a model
// that counts with o200k_base; one token more and it is not, and the 400
// says the counted size.
func TestContextWindowExactlyFull(t *testing.T) {
	// By the estimate: 50 tokens in a 50-token window.
	d := deployment("d", dOK())
	d.ContextWindow = 50
	if res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, &Request{Request: chatReq.Request, Tokens: 50}); res.Err != nil || res.Deployment != d {
		t.Errorf("estimate equal to the window: expected it sent, got %v", res.Err)
	}

	// By the exact count: n prompt tokens + 100 of max_tokens.
	n, complete, ok := estimate.Exact(chatReq.Body, 1<<40)
	if !ok || !complete {
		t.Fatal("no exact count")
	}
	const out = 100
	req := func() *Request {
		return &Request{Request: chatReq.Request, Tokens: n + out, PromptTokens: n, OutputTokens: out}
	}
	short, exact := dOK(), dOK()
	a, b := deployment("short", short), deployment("exact", exact)
	a.ContextWindow, a.ExactTokens, a.Quality = n+out-1, true, 1 // one token short; would win the ranking
	b.ContextWindow, b.ExactTokens = n+out, true
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{a, b}, req())
	if res.Err != nil || res.Deployment != b || short.calls.Load() != 0 {
		t.Fatalf("expected the exactly fitting window to answer and the short one untouched, got %v %v (short: %d calls)",
			res.Deployment, res.Err, short.calls.Load())
	}
	res = newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{a}, req())
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 400 || e.Class != provider.ContextLength ||
		!strings.Contains(e.Message, fmt.Sprintf("more than %d tokens", n+out)) {
		t.Errorf("one token short: expected a 400 saying more than %d tokens, got %v", n+out, res.Err)
	}
}

// A request in a format no deployment of its group (nor any fallback)
// serves is answered with the router's own error, never an empty result.
func TestUnservedFormatIsAnError(t *testing.T) {
	s := dOK()
	d := &Deployment{Name: "claude", Model: "claude", Provider: &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://claude.invalid", APIKey: "sk-x"}},
		Transport: s, Timeout: 30 * time.Second, State: deployment("x", s).State}
	req := &Request{Request: &provider.Request{Format: provider.Embeddings, Body: []byte(`{"model":"e","input":"hi"}`)}, Tokens: 5}
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, req)
	var e *Error
	if !errors.As(res.Err, &e) || res.Attempts != 0 || s.calls.Load() != 0 {
		t.Errorf("expected the router's error without an attempt, got %+v", res)
	}
}

// Before any context_length failure, no deployment is left out for its
// window by the walk itself: a (tiny) window of 1 takes a 1-token request.
func TestNoWindowExcludedBeforeAContextFailure(t *testing.T) {
	d := deployment("tiny", dOK())
	d.ContextWindow = 1
	if res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, &Request{Request: chatReq.Request, Tokens: 1}); res.Err != nil || res.Deployment != d {
		t.Errorf("expected the request sent, got %v", res.Err)
	}
}

// A group of more than 16 deployments is served like any other: the
// 17th, the best ranked, answers.
func TestGroupOfSeventeen(t *testing.T) {
	var group []*Deployment
	for i := range 17 {
		group = append(group, deployment(fmt.Sprintf("d%02d", i), dOK()))
	}
	group[16].Quality = 1
	if res := newRouter(newFakeClock()).Serve(context.Background(), group, chatReq); res.Err != nil || res.Deployment != group[16] {
		t.Errorf("expected the 17th to answer, got %v %v", res.Deployment, res.Err)
	}
}

// A request whose attempts ran out in its group does not go on to the
// fallback group: the group's answer (a provider's context_length 400)
// stands, and the fallback is never called.
func TestNoFallbackOnceAttemptsRunOut(t *testing.T) {
	small, big := dScript(reply(400, dTooLong)), dOK()
	g, _ := dGroups([]*Deployment{deployment("small", small)}, []*Deployment{deployment("big", big)})
	r := newRouter(newFakeClock())
	r.MaxAttempts = 1
	res := r.ServeGroup(context.Background(), g, chatReq)
	if res.Err != nil || res.Status != 400 || res.Error == nil || res.Error.Class != provider.ContextLength ||
		res.Attempts != 1 || big.calls.Load() != 0 {
		t.Errorf("expected the provider's 400 after 1 attempt and big never called, got %v %d %+v (big: %d)",
			res.Err, res.Status, res.Error, big.calls.Load())
	}
}

// A prompt too large for a group (the pre-check) and for its fallback
// (the provider's context_length) is answered with a 400 that says so of
// them all.
func TestTooLargeForTheWholeChain(t *testing.T) {
	tiny := deployment("tiny", dOK())
	tiny.ContextWindow = 5
	g, _ := dGroups([]*Deployment{tiny}, []*Deployment{deployment("big", dScript(reply(400, dTooLong)))})
	res := newRouter(newFakeClock()).ServeGroup(context.Background(), g, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 400 || e.Class != provider.ContextLength || !strings.Contains(e.Message, "fallback groups") {
		t.Errorf("expected a 400 context_length naming the fallback groups, got %v", res.Err)
	}
}

// When every group of a chain fails, the client gets the failure that
// tells it most: one to retry (a 429) over a 400 of an earlier group; a
// Retry-After over none, whichever group said it; between equal
// Retry-Afters, the earlier group's.
func TestBestFailureOfTheChain(t *testing.T) {
	limited := func() *Deployment {
		return deployment("limited", dScript(reply(429, rateLimited, "Retry-After", "600")))
	}
	badKey := func() *Deployment {
		return deployment("badkey", dScript(reply(401, `{"error":{"message":"Incorrect API key","type":"invalid_request_error","code":"invalid_api_key"}}`)))
	}
	tooSmall := deployment("tiny", dOK())
	tooSmall.ContextWindow = 5
	cases := []struct {
		name       string
		g, f       *Deployment
		status     int
		fromFirst  bool
		retryAfter time.Duration
	}{
		{"400 then 429", tooSmall, limited(), 429, false, 600 * time.Second},
		{"429 then 502", limited(), badKey(), 429, true, 600 * time.Second},
		{"502 then 429", badKey(), limited(), 429, false, 600 * time.Second},
		{"429 then 429", limited(), limited(), 429, true, 600 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, f := dGroups([]*Deployment{c.g}, []*Deployment{c.f})
			res := newRouter(newFakeClock()).ServeGroup(context.Background(), g, chatReq)
			want := f
			if c.fromFirst {
				want = g
			}
			var e *Error
			if !errors.As(res.Err, &e) || e.Status != c.status || e.RetryAfter != c.retryAfter || res.Group != want {
				t.Errorf("expected %d (Retry-After %v) of group %s, got %v %+v of group %s", c.status, c.retryAfter, want.Name, res.Err, e, res.Group.Name)
			}
		})
	}
}

// A request whose deadline passes during a failed attempt is answered 504
// (the deadline), not as one that waited in the queue for a cooling
// deployment.
func TestDeadlinePassedDuringAnAttemptIs504(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	r.Deadline = 10 * time.Second
	slow429 := func(req *http.Request) (*http.Response, error) {
		clock.Advance(11 * time.Second)
		return reply(429, rateLimited, "Retry-After", "30")(req)
	}
	d := deployment("a", dScript(slow429))
	res := r.Serve(context.Background(), []*Deployment{d}, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 504 || e.Class != provider.Transport || res.Attempts != 1 {
		t.Errorf("expected a 504 after one attempt, got %v %+v after %d", res.Err, e, res.Attempts)
	}
}

// dHalfOpen opens d's circuit with a burst of failures and moves the clock
// past it: d's next request is its half-open probe.
func dHalfOpen(t *testing.T, d *Deployment, clock *fakeClock, r *Router) {
	t.Helper()
	for range 8 {
		d.State.Observe(clock.Now(), provider.NewObservation(provider.Server), r.Policy)
		clock.Advance(40 * time.Millisecond)
	}
	clock.Advance(r.Policy.BackoffMax + time.Second)
	if f := d.State.Features(clock.Now(), 10, false); !f.Probe {
		t.Fatalf("expected %s half-open, waiting for its probe: %+v", d.Name, f)
	}
}

// A half-open deployment's probe goes before an affinity preference: the
// request is sent to the probe, not to the preferred deployment.
func TestProbeBeforePreference(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	probed, preferred := dOK(), dOK()
	a, b := deployment("a", probed), deployment("b", preferred)
	dHalfOpen(t, a, clock, r)
	res := r.Serve(context.Background(), []*Deployment{a, b}, &Request{Request: chatReq.Request, Tokens: 10, Prefer: b})
	if res.Deployment != a || preferred.calls.Load() != 0 {
		t.Errorf("expected the probe a, got %v (b called %d times)", res.Deployment, preferred.calls.Load())
	}
}

// A request that meets a spent quota and a rate limit and runs out of
// attempts while another deployment was never tried is a 429 saying so
// (the quota's refusal spends no attempt); one that met a bad key and a
// server error is a 502.
func TestFinalErrorCountsLimitedFailures(t *testing.T) {
	quota := reply(429, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`)
	a, b, c0 := deployment("a", dScript(quota)), deployment("b", dScript(reply(429, rateLimited, "Retry-After", "5"))), deployment("c", dOK())
	a.Quality, b.Quality = 1, 0.9
	r := newRouter(newFakeClock())
	r.MaxAttempts = 1
	res := r.Serve(context.Background(), []*Deployment{a, b, c0}, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 429 || res.Attempts != 2 || !strings.Contains(e.Message, "tried (2 of 3) are rate-limited or out of quota") {
		t.Errorf("spent quota: expected a 429 for 2 of 3 tried, got %v after %d attempts", res.Err, res.Attempts)
	}

	badKey := reply(401, `{"error":{"message":"Incorrect API key","type":"invalid_request_error","code":"invalid_api_key"}}`)
	c, d := deployment("c", dScript(badKey)), deployment("d", dScript(reply(500, `{"error":{"message":"boom"}}`)))
	c.Quality = 1
	r = newRouter(newFakeClock())
	r.MaxAttempts = 2
	res = r.Serve(context.Background(), []*Deployment{c, d}, chatReq)
	if !errors.As(res.Err, &e) || e.Status != 502 || e.Message != "every deployment of this model failed; retry later" {
		t.Errorf("bad key and a 500: expected a 502 saying every deployment failed, got %v", res.Err)
	}
}

// A deployment whose quota is spent keeps later requests away: they are
// answered 429 at once (not 502: it is no failure of the provider's).
func TestSpentQuotaCoolingIs429(t *testing.T) {
	quota := reply(429, `{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`)
	s := dScript(quota)
	d := deployment("a", s)
	r := newRouter(newFakeClock())
	r.Serve(context.Background(), []*Deployment{d}, chatReq)
	res := r.Serve(context.Background(), []*Deployment{d}, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 429 || res.Attempts != 0 || s.calls.Load() != 1 {
		t.Errorf("expected a 429 at once, got %v after %d attempts (%d calls)", res.Err, res.Attempts, s.calls.Load())
	}
}

// dMute is a provider type whose error answers decode to no message.
type dMute struct{ provider.Provider }

func (dMute) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	return provider.NewObservation(provider.Server)
}

// A failed attempt's log line carries the first bytes of the provider's
// body only when nothing was decoded from it: never beside a message, and
// never an empty one.
func TestFailureLogBodyOnlyWithoutMessage(t *testing.T) {
	line := func(mute bool, rep func(*http.Request) (*http.Response, error)) map[string]any {
		core, logs := observer.New(zapcore.InfoLevel)
		r := newRouter(newFakeClock())
		r.Logger = zap.New(core)
		r.MaxAttempts = 1
		d := deployment("a", dScript(rep))
		if mute {
			d.Provider = dMute{d.Provider}
		}
		r.Serve(context.Background(), []*Deployment{d}, chatReq)
		entries := logs.FilterMessageSnippet("attempt failed").All()
		if len(entries) != 1 {
			t.Fatalf("expected one failure line, got %d", len(entries))
		}
		return entries[0].ContextMap()
	}
	if f := line(false, reply(500, `{"error":{"message":"boom"}}`)); f["message"] != "boom" {
		t.Errorf("a decoded message: expected it alone, got %v", f)
	} else if _, ok := f["body"]; ok {
		t.Errorf("a decoded message: expected no body, got %v", f)
	}
	if f := line(true, reply(500, "")); f["message"] != "" {
		t.Errorf("an empty answer: expected no message, got %v", f)
	} else if _, ok := f["body"]; ok {
		t.Errorf("an empty answer: expected no body, got %v", f)
	}
	if f := line(true, reply(502, "bad gateway!", "Content-Type", "text/plain")); f["message"] != "" || f["body"] != "bad gateway!" {
		t.Errorf("nothing decoded: expected the body, got %v", f)
	}
}

// A chain of MaxFallbacks fallback groups is walked to its end: the last
// group, the only one that can take the request, answers it.
func TestChainOfMaxFallbacks(t *testing.T) {
	last := NewGroup("last", []*Deployment{deployment("d", dOK())})
	g := last
	for i := range MaxFallbacks {
		g = &Group{Name: fmt.Sprintf("empty%d", i), Fallback: g}
	}
	if res := newRouter(newFakeClock()).ServeGroup(context.Background(), g, chatReq); res.Err != nil || res.Group != last {
		t.Errorf("expected the last group to answer, got %v from %v", res.Err, res.Group)
	}
}

// A request whose single deployment failed is told every deployment
// failed, not "1 of 1 tried".
func TestAllTriedFailedMessage(t *testing.T) {
	r := newRouter(newFakeClock())
	r.MaxAttempts = 1
	res := r.Serve(context.Background(), []*Deployment{deployment("a", dScript(reply(500, `{"error":{"message":"boom"}}`)))}, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 502 || e.Message != "every deployment of this model failed; retry later" {
		t.Errorf("expected a 502 saying every deployment failed, got %v", res.Err)
	}
}
