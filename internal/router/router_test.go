package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// fakeClock advances only when the router sleeps, and records each sleep.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	timers []*fakeTimer
	firing sync.WaitGroup // the timers' functions that run
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	c.mu.Unlock()
	c.fire()
	c.mu.Lock()
	return ctx.Err()
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	c.fire()
}

// fakeTimer is a timer of fakeClock: it fires when the clock passes it.
type fakeTimer struct {
	c   *fakeClock
	at  time.Time
	f   func()
	set bool
}

// AfterFunc implements Clock: f runs once the clock has been advanced (or
// slept) past d from now.
func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f, set: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.set
	t.set = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.set
	t.at, t.set = t.c.now.Add(d), true
	return was
}

// fire runs the timers the clock has passed.
func (c *fakeClock) fire() {
	c.mu.Lock()
	var due []func()
	for _, t := range c.timers {
		if t.set && !t.at.After(c.now) {
			t.set = false
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	c.firing.Add(len(due))
	for _, f := range due {
		go func() {
			defer c.firing.Done()
			f()
		}()
	}
}

// Settle waits until the functions of the timers the clock has passed
// have returned.
func (c *fakeClock) Settle() { c.firing.Wait() }

func (c *fakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// script is a fake provider: each call answers with the next reply (the
// last one repeats) and counts attempts.
type script struct {
	calls   atomic.Int32
	replies []func(*http.Request) (*http.Response, error)
}

func (s *script) RoundTrip(req *http.Request) (*http.Response, error) {
	n := int(s.calls.Add(1)) - 1
	if n >= len(s.replies) {
		n = len(s.replies) - 1
	}
	return s.replies[n](req)
}

func reply(status int, body string, headers ...string) func(*http.Request) (*http.Response, error) {
	return func(req *http.Request) (*http.Response, error) {
		h := http.Header{"Content-Type": {"application/json"}}
		for i := 0; i+1 < len(headers); i += 2 {
			h.Set(headers[i], headers[i+1])
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
	}
}

// hang answers only when the attempt's context ends.
func hang(req *http.Request) (*http.Response, error) {
	<-req.Context().Done()
	return nil, req.Context().Err()
}

const okBody = `{"id":"x","object":"chat.completion","model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`

const rateLimited = `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`

func deployment(name string, s *script) *Deployment {
	return &Deployment{
		Name: name, Model: name + "-up",
		Provider:  &adapters.OpenAI{Endpoint: provider.Endpoint{BaseURL: "http://" + name + ".invalid/v1", APIKey: "sk-" + name}},
		Transport: s, Timeout: 30 * time.Second, TTFTTimeout: 15 * time.Second, IdleTimeout: 30 * time.Second,
		State: capacity.NewState(),
	}
}

// newRouter returns a router on clock whose near-ties go to the first
// candidate in config order, so tests can tell which deployment answers.
func newRouter(clock *fakeClock) *Router {
	r := New()
	r.Clock = clock
	r.Rand = func() float64 { return 0 }
	return r
}

var chatReq = &Request{Request: wire([]byte(`{"model":"fast","messages":[{"role":"user","content":"hi"}]}`), false), Tokens: 10}

// wire is a Chat Completions request as the chat client API makes it.
func wire(body []byte, stream bool) *provider.Request {
	return &provider.Request{Format: provider.Chat, Body: body, Stream: stream, Choices: 1}
}

func TestFailoverAtOnceOn429(t *testing.T) {
	clock := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "30")}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	r := newRouter(clock)

	res := r.Serve(context.Background(), group, chatReq)
	if res.Err != nil || res.Deployment != group[1] || res.Status != 200 {
		t.Fatalf("expected b to answer 200, got %v %v %d", res.Err, res.Deployment, res.Status)
	}
	if res.Attempts != 2 || res.FailoverReason != provider.RateLimited {
		t.Errorf("expected 2 attempts after rate_limited, got %d %q", res.Attempts, res.FailoverReason)
	}
	if s := clock.Sleeps(); len(s) != 0 {
		t.Errorf("expected no wait while b was ready, got %v", s)
	}
	// Within the 30 s, a is not touched again.
	for i := 0; i < 5; i++ {
		clock.Advance(5 * time.Second)
		if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[1] {
			t.Fatalf("request %d: expected b, got %v", i, res.Err)
		}
	}
	if n := a.calls.Load(); n != 1 {
		t.Errorf("expected a attempted once within its 30 s, got %d", n)
	}
	clock.Advance(6 * time.Second)
	if at, _ := group[0].State.AvailableAt(clock.Now(), 10); at.After(clock.Now()) {
		t.Errorf("expected a usable again after its 30 s, got %v", at.Sub(clock.Now()))
	}
}

func TestWaitIsMaxNotPlus(t *testing.T) {
	clock := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){
		reply(429, rateLimited, "Retry-After", "3"), reply(200, okBody)}}
	r := newRouter(clock)
	res := r.Serve(context.Background(), []*Deployment{deployment("a", a)}, chatReq)
	if res.Err != nil || res.Attempts != 2 {
		t.Fatalf("expected success on attempt 2, got %v after %d", res.Err, res.Attempts)
	}
	if s := clock.Sleeps(); len(s) != 1 || s[0] != 3*time.Second {
		t.Errorf("expected one wait of max(3s, 500ms) = 3s, got %v", s)
	}
}

func TestRetryAfterZeroIsFlooredByBackoff(t *testing.T) {
	clock := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "0")}}
	r := newRouter(clock)
	res := r.Serve(context.Background(), []*Deployment{deployment("a", a)}, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 429 {
		t.Fatalf("expected 429, got %v", res.Err)
	}
	if n := a.calls.Load(); n != 4 {
		t.Errorf("expected max_attempts = 4 attempts, got %d", n)
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
	got := clock.Sleeps()
	if len(got) != len(want) {
		t.Fatalf("expected waits %v, got %v", want, got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("wait %d: expected %v, got %v", i, want[i], got[i])
		}
	}
	if e.RetryAfter < time.Second {
		t.Errorf("expected Retry-After of at least 1 s, got %v", e.RetryAfter)
	}
}

func TestServerRetryAfterBeatsBackoff(t *testing.T) {
	clock := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){
		reply(503, `{"error":{"message":"overloaded","type":"server_error"}}`, "Retry-After", "30"), reply(200, okBody)}}
	r := newRouter(clock)
	r.Policy.BackoffBase = 2 * time.Second
	res := r.Serve(context.Background(), []*Deployment{deployment("a", a)}, chatReq)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if s := clock.Sleeps(); len(s) != 1 || s[0] != 30*time.Second {
		t.Errorf("expected a 30 s wait (server's, over 2 s backoff), got %v", s)
	}
}

func TestAllCoolingPastDeadlineAnswers429AtOnce(t *testing.T) {
	clock := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "30")}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "20")}}
	r := newRouter(clock)
	r.Deadline = 10 * time.Second
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	res := r.Serve(context.Background(), group, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 429 || e.RetryAfter != 20*time.Second {
		t.Fatalf("expected 429 with Retry-After 20s, got %#v", res.Err)
	}
	if res.FailoverReason != provider.RateLimited {
		t.Errorf("expected the failover reason on the error answer too, got %q", res.FailoverReason)
	}
	if len(clock.Sleeps()) != 0 || res.Attempts != 2 {
		t.Errorf("expected 2 attempts and no wait, got %d and %v", res.Attempts, clock.Sleeps())
	}
	// The next request touches neither.
	res = r.Serve(context.Background(), group, chatReq)
	if !errors.As(res.Err, &e) || e.Status != 429 || res.Attempts != 0 {
		t.Errorf("expected an immediate 429 without attempts, got %v after %d", res.Err, res.Attempts)
	}
	if a.calls.Load() != 1 || b.calls.Load() != 1 {
		t.Errorf("expected one attempt each, got %d and %d", a.calls.Load(), b.calls.Load())
	}
}

func TestWaitsOnlyWhenItEndsBeforeDeadline(t *testing.T) {
	for _, tc := range []struct {
		retryAfter string
		wantWait   bool
	}{{"5", true}, {"7", false}} {
		clock := newFakeClock()
		a := &script{replies: []func(*http.Request) (*http.Response, error){
			reply(429, rateLimited, "Retry-After", tc.retryAfter), reply(200, okBody)}}
		r := newRouter(clock)
		r.Deadline = 6 * time.Second
		res := r.Serve(context.Background(), []*Deployment{deployment("a", a)}, chatReq)
		if tc.wantWait && (res.Err != nil || len(clock.Sleeps()) != 1) {
			t.Errorf("Retry-After %s: expected a wait then success, got %v, %v", tc.retryAfter, res.Err, clock.Sleeps())
		}
		if !tc.wantWait && (res.Err == nil || len(clock.Sleeps()) != 0) {
			t.Errorf("Retry-After %s: expected 429 without waiting, got %v, %v", tc.retryAfter, res.Err, clock.Sleeps())
		}
	}
}

func TestSuccessWithNothingRemainingIsSkipped(t *testing.T) {
	clock := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody,
		"x-ratelimit-limit-requests", "3", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "20s")}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Quality = 1 // a first while it has capacity
	r := newRouter(clock)
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[0] {
		t.Fatalf("expected a first, got %v", res.Deployment)
	}
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[1] || res.Attempts != 1 {
		t.Fatalf("expected b at once (a has 0 left), got %v after %d", res.Deployment, res.Attempts)
	}
	clock.Advance(21 * time.Second)
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[0] {
		t.Errorf("expected a after its reset, got %v", res.Deployment)
	}
}

func TestContextLengthTriesLargerWindow(t *testing.T) {
	tooLong := reply(400, `{"error":{"message":"maximum context length is 8192","type":"invalid_request_error","code":"context_length_exceeded"}}`)
	small := &script{replies: []func(*http.Request) (*http.Response, error){tooLong}}
	same := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	large := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("small", small), deployment("same", same), deployment("large", large)}
	group[0].ContextWindow, group[1].ContextWindow, group[2].ContextWindow = 8192, 8192, 128000
	group[0].Quality, group[1].Quality = 1, 0.5
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), group, chatReq)
	if res.Deployment != group[2] || same.calls.Load() != 0 {
		t.Fatalf("expected the larger window to answer and the same-size one untouched, got %v (same: %d)", res.Deployment, same.calls.Load())
	}
	// With no larger window, the provider's 400 goes to the client.
	res = r.Serve(context.Background(), group[:2], chatReq)
	if res.Err != nil || res.Status != 400 || !strings.Contains(string(res.Body), "context_length_exceeded") {
		t.Errorf("expected the provider's 400 passed on, got %v %d %s", res.Err, res.Status, res.Body)
	}
	if small.calls.Load() != 2 {
		t.Errorf("expected small tried once per request, got %d", small.calls.Load())
	}
}

func TestClientErrorIsPassedOnWithoutRetry(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(400, `{"error":{"message":"bad","type":"invalid_request_error","code":"content_policy_violation"}}`)}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), []*Deployment{deployment("a", a), deployment("b", b)}, chatReq)
	if res.Status != 400 || res.Attempts != 1 || b.calls.Load() != 0 {
		t.Errorf("expected the 400 after 1 attempt, got %d after %d (b: %d)", res.Status, res.Attempts, b.calls.Load())
	}
}

func TestHangEndsAtDeadline(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){hang}}
	r := New()
	r.Deadline = 100 * time.Millisecond
	start := time.Now()
	res := r.Serve(context.Background(), []*Deployment{deployment("a", a)}, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 504 {
		t.Fatalf("expected 504, got %v", res.Err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("expected the deadline to end it, took %v", el)
	}
}

func TestProviderTimeoutFailsOverAndIsNotRetried(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){hang}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(503, `{"error":"busy"}`), reply(200, okBody)}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Timeout = 20 * time.Millisecond
	group[0].Quality = 1
	r := New()
	r.Rand = func() float64 { return 0 }
	r.Policy.BackoffBase = time.Millisecond
	res := r.Serve(context.Background(), group, chatReq)
	if res.Err != nil || res.Deployment != group[1] {
		t.Fatalf("expected b to answer, got %v", res.Err)
	}
	if a.calls.Load() != 1 || b.calls.Load() != 2 {
		t.Errorf("expected the silent a tried once and b twice, got %d and %d", a.calls.Load(), b.calls.Load())
	}
}

func sse(events ...string) func(*http.Request) (*http.Response, error) {
	return reply(200, strings.Join(events, "\n\n")+"\n\n", "Content-Type", "text/event-stream")
}

const chunk = `data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`
const final = `data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`

func relay(t *testing.T, s *Stream) ([]string, error) {
	t.Helper()
	var got []string
	err := s.Relay(func(ev provider.Event, done bool) error {
		if done {
			got = append(got, "[DONE]")
		} else {
			got = append(got, string(ev.Data))
		}
		return nil
	})
	return got, err
}

func TestStreamFailsOverBeforeFirstContent(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){
		sse(": keep-alive", `data: {"error":{"message":"overloaded","type":"server_error","code":null}}`)}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){sse(": keep-alive", chunk, final, "data: [DONE]")}}
	req := &Request{Request: wire(chatReq.Body, true), Tokens: 10}
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), []*Deployment{deployment("a", a), deployment("b", b)}, req)
	if res.Err != nil || res.Stream == nil || res.Attempts != 2 {
		t.Fatalf("expected b's stream after 2 attempts, got %v after %d", res.Err, res.Attempts)
	}
	got, err := relay(t, res.Stream)
	if err != nil || len(got) != 3 || got[2] != "[DONE]" || !strings.Contains(got[0], `"Hi"`) {
		t.Errorf("expected chunk, final, [DONE], got %q %v", got, err)
	}
}

// A stream that opens without content (a role-only delta, an empty
// string, usage alone) is not committed by it: an error, a cut or a spent
// quota right after fails over, and the client receives b's stream and
// nothing of a's.
func TestEmptyOpeningChunksDoNotCommit(t *testing.T) {
	roleOnly := `data: {"id":"a","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
	empty := `data: {"id":"a","object":"chat.completion.chunk","model":"up","choices":[{"index":0,"delta":{"content":"","tool_calls":[],"refusal":null},"finish_reason":null}]}`
	usageOnly := `data: {"id":"a","object":"chat.completion.chunk","model":"up","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0,"total_tokens":3}}`
	quota := `data: {"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	for name, tc := range map[string]struct {
		a     func(*http.Request) (*http.Response, error)
		class provider.Class
	}{
		"role-only then error": {sse(roleOnly, `data: {"error":{"message":"boom","type":"server_error","code":null}}`), provider.Server},
		"role-only then quota": {sse(roleOnly, quota), provider.QuotaExhausted},
		"empty then cut":       {reply(200, roleOnly+"\n\n"+empty+"\n\n"+`data: {"id":"a","obj`, "Content-Type", "text/event-stream"), provider.Transport},
		"usage then end":       {sse(": keep-alive", roleOnly, usageOnly), provider.Transport},
	} {
		a := &script{replies: []func(*http.Request) (*http.Response, error){tc.a}}
		b := &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, final, "data: [DONE]")}}
		group := []*Deployment{deployment("a", a), deployment("b", b)}
		group[0].Quality = 1
		res := newRouter(newFakeClock()).Serve(context.Background(), group, &Request{Request: wire(chatReq.Body, true), Tokens: 10})
		if res.Err != nil || res.Stream == nil || res.Deployment != group[1] || res.Attempts != 2 {
			t.Errorf("%s: expected b's stream after 2 attempts, got %v %v after %d", name, res.Err, res.Deployment, res.Attempts)
			continue
		}
		if res.FailoverReason != tc.class {
			t.Errorf("%s: expected failover for %s, got %s", name, tc.class, res.FailoverReason)
		}
		got, err := relay(t, res.Stream)
		if err != nil || len(got) != 3 || !strings.Contains(got[0], `"Hi"`) || strings.Contains(strings.Join(got, ""), `"id":"a"`) {
			t.Errorf("%s: expected b's chunk, final, [DONE] and nothing of a's, got %q %v", name, got, err)
		}
	}
	// Once content comes, the opening chunks are relayed before it.
	a := &script{replies: []func(*http.Request) (*http.Response, error){sse(roleOnly, empty, chunk, final, "data: [DONE]")}}
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{deployment("a", a)}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a's stream, got %v", res.Err)
	}
	if got, err := relay(t, res.Stream); err != nil || len(got) != 5 || !strings.Contains(got[0], `"role":"assistant"`) || !strings.Contains(got[2], `"Hi"`) {
		t.Errorf("expected role-only, empty, content, final, [DONE], got %q %v", got, err)
	}
}

func TestStreamMidwayErrorIsInBand(t *testing.T) {
	for name, body := range map[string]func(*http.Request) (*http.Response, error){
		"error event":   sse(chunk, `data: {"error":{"message":"boom","type":"server_error","param":null,"code":null}}`),
		"cut":           reply(200, chunk+"\n\n"+`data: {"id":"c","obj`, "Content-Type", "text/event-stream"),
		"no terminator": reply(200, chunk+"\n\n", "Content-Type", "text/event-stream"),
	} {
		a := &script{replies: []func(*http.Request) (*http.Response, error){body}}
		d := deployment("a", a)
		r := newRouter(newFakeClock())
		res := r.Serve(context.Background(), []*Deployment{d}, &Request{Request: wire(chatReq.Body, true)})
		if res.Stream == nil {
			t.Fatalf("%s: expected a committed stream, got %v", name, res.Err)
		}
		got, err := relay(t, res.Stream)
		var se *StreamError
		if !errors.As(err, &se) {
			t.Errorf("%s: expected a StreamError, got %v", name, err)
		}
		for _, g := range got {
			if g == "[DONE]" {
				t.Errorf("%s: a failed stream must not end with [DONE]", name)
			}
		}
		if snap := d.State.Snapshot(time.Now()); snap.ConsecutiveFailures != 1 {
			t.Errorf("%s: expected the failure counted on the deployment, got %d", name, snap.ConsecutiveFailures)
		}
	}
}

func TestStreamWithFinishButNoDoneIsFinalized(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, final)}}
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), []*Deployment{deployment("a", a)}, &Request{Request: wire(chatReq.Body, true)})
	got, err := relay(t, res.Stream)
	if err != nil || len(got) != 3 || got[2] != "[DONE]" {
		t.Errorf("expected the stream finished with [DONE], got %q %v", got, err)
	}
}

func TestUpstreamNeverSeesClientModelOrOtherKeys(t *testing.T) {
	var got *http.Request
	var body []byte
	a := &script{replies: []func(*http.Request) (*http.Response, error){func(req *http.Request) (*http.Response, error) {
		got = req
		body, _ = io.ReadAll(req.Body)
		return reply(200, okBody)(req)
	}}}
	r := newRouter(newFakeClock())
	r.Serve(context.Background(), []*Deployment{deployment("a", a)}, chatReq)
	if got.Header.Get("Authorization") != "Bearer sk-a" {
		t.Errorf("expected the provider key, got %q", got.Header.Get("Authorization"))
	}
	if !strings.Contains(string(body), `"model":"a-up"`) || strings.Contains(string(body), `"fast"`) {
		t.Errorf("expected the upstream model in the body, got %s", body)
	}
	if got.URL.String() != "http://a.invalid/v1/chat/completions" {
		t.Errorf("expected the chat completions URL, got %s", got.URL)
	}
}

func TestNotAnAnswerFailsOver(t *testing.T) {
	for name, bad := range map[string]func(*http.Request) (*http.Response, error){
		"html":           reply(200, "<html>captive portal login</html>", "Content-Type", "text/html"),
		"empty":          reply(200, ""),
		"error in 200":   reply(200, `{"error":{"message":"internal","type":"server_error"}}`),
		"no choices":     reply(200, `{"id":"x","object":"chat.completion","choices":[]}`),
		"null choice":    reply(200, `{"id":"x","object":"chat.completion","choices":[null]}`),
		"no message":     reply(200, `{"id":"x","object":"chat.completion","choices":[{}]}`),
		"number content": reply(200, `{"id":"x","object":"chat.completion","choices":[{"message":{"content":5}}]}`),
		"model gone 404": reply(404, `{"error":{"message":"The model does not exist","type":"invalid_request_error","code":"model_not_found"}}`),
	} {
		a := &script{replies: []func(*http.Request) (*http.Response, error){bad}}
		b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
		group := []*Deployment{deployment("a", a), deployment("b", b)}
		group[0].Quality = 1
		res := newRouter(newFakeClock()).Serve(context.Background(), group, chatReq)
		if res.Err != nil || res.Deployment != group[1] || res.Status != 200 {
			t.Errorf("%s: expected b to answer after a's bad answer, got %v %v", name, res.Err, res.Deployment)
		}
		if snap := group[0].State.Snapshot(time.Now()); snap.ConsecutiveFailures != 1 {
			t.Errorf("%s: expected a's failure counted, got %+v", name, snap)
		}
	}
}

// Four deployments of four types, all rate-limited with resets of 12-20 s;
// max_attempts 2. The answer follows what was learned: a 429 with
// Retry-After until the earliest reset known, and a message that says two
// of four were tried.
func TestRateLimitedEverywhereIsA429(t *testing.T) {
	replies := map[string]func(*http.Request) (*http.Response, error){
		"openai": reply(429, `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`,
			"Retry-After", "12", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "12s"),
		"anthropic": reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`,
			"retry-after", "15"),
		"gemini": reply(429, `{"error":{"code":429,"message":"Resource exhausted","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"18s"}]}}`),
		"azure": reply(429, `{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation have exceeded call rate limit. Please retry after 20 seconds."}}`,
			"retry-after", "20"),
	}
	ep := func(name string) provider.Endpoint {
		return provider.Endpoint{BaseURL: "http://" + name + ".invalid/v1", APIKey: "k-" + name}
	}
	providers := map[string]provider.Provider{
		"openai": &adapters.OpenAI{Endpoint: ep("openai")}, "anthropic": &adapters.Anthropic{Endpoint: ep("anthropic")},
		"gemini": &adapters.Gemini{Endpoint: ep("gemini")}, "azure": &adapters.Azure{Endpoint: provider.Endpoint{BaseURL: "http://azure.invalid/openai", APIKey: "k"}},
	}
	var group []*Deployment
	scripts := map[string]*script{}
	for i, name := range []string{"openai", "anthropic", "gemini", "azure"} {
		scripts[name] = &script{replies: []func(*http.Request) (*http.Response, error){replies[name]}}
		d := deployment(name, scripts[name])
		d.Provider, d.Quality = providers[name], 1-float64(i)/10
		group = append(group, d)
	}
	clock := newFakeClock()
	r := newRouter(clock)
	r.MaxAttempts, r.Deadline = 2, 5*time.Second
	res := r.Serve(context.Background(), group, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != http.StatusTooManyRequests || e.Class != provider.RateLimited {
		t.Fatalf("expected a 429, got %v after %d attempts", res.Err, res.Attempts)
	}
	if e.RetryAfter != 12*time.Second || res.Attempts != 2 {
		t.Errorf("expected Retry-After 12 s (the earliest reset known) after 2 attempts, got %v after %d", e.RetryAfter, res.Attempts)
	}
	if !strings.Contains(e.Message, "2 of 4") || !strings.Contains(e.Message, "rate-limited") {
		t.Errorf("expected a true message (2 of 4 tried, rate-limited), got %q", e.Message)
	}
	if n := scripts["gemini"].calls.Load() + scripts["azure"].calls.Load(); n != 0 {
		t.Errorf("expected the lower-ranked deployments untried, got %d calls", n)
	}

	// The same with a failure that is no rate limit among the attempts: a
	// 502 that says so.
	for _, sc := range scripts {
		sc.replies = []func(*http.Request) (*http.Response, error){reply(500, `{"error":{"message":"boom","type":"server_error"}}`)}
	}
	clock.Advance(time.Minute)
	res = r.Serve(context.Background(), group, chatReq)
	if !errors.As(res.Err, &e) || e.Status != http.StatusBadGateway || !strings.Contains(e.Message, "of 4") {
		t.Errorf("expected a 502 saying how many were tried, got %v", res.Err)
	}
}

func TestContextLengthTriesUnknownWindows(t *testing.T) {
	tooLong := reply(400, `{"error":{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}}`)
	a := &script{replies: []func(*http.Request) (*http.Response, error){tooLong}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Quality = 1
	res := newRouter(newFakeClock()).Serve(context.Background(), group, chatReq)
	if res.Deployment != group[1] || res.Err != nil {
		t.Errorf("expected b (window unknown, maybe larger) to answer, got %v %v", res.Deployment, res.Err)
	}
	// With nothing left, the 400 goes back naming the deployment that gave it.
	res = newRouter(newFakeClock()).Serve(context.Background(), group[:1], chatReq)
	if res.Status != 400 || res.Deployment != group[0] {
		t.Errorf("expected a's 400 with a named, got %d %v", res.Status, res.Deployment)
	}
}

func TestStreamCompletenessWithoutDone(t *testing.T) {
	usage := `data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	finalOne := `data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[{"index":1,"delta":{},"finish_reason":"stop"}]}`
	for _, tc := range []struct {
		name     string
		choices  int
		usage    bool
		events   []string
		complete bool
	}{
		{"n=2, one choice finished", 2, false, []string{chunk, final}, false},
		{"n=2, both finished", 2, false, []string{chunk, final, finalOne}, true},
		{"usage asked, not sent", 1, true, []string{chunk, final}, false},
		{"usage asked and sent", 1, true, []string{chunk, final, usage}, true},
		{"n=2, one choice finished twice", 2, false, []string{chunk, final, final}, false},
		{"usage asked and sent, spaced", 1, true, []string{chunk, final, strings.Replace(usage, `"usage":{`, `"usage": {`, 1)}, true},
		{"usage null in every chunk", 1, true, []string{strings.Replace(chunk, `}]}`, `}],"usage":null}`, 1), final}, false},
	} {
		a := &script{replies: []func(*http.Request) (*http.Response, error){sse(tc.events...)}}
		pr := wire(chatReq.Body, true)
		pr.Choices, pr.IncludeUsage = tc.choices, tc.usage
		res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{deployment("a", a)}, &Request{Request: pr})
		got, err := relay(t, res.Stream)
		done := len(got) > 0 && got[len(got)-1] == "[DONE]"
		if done != tc.complete || (err == nil) != tc.complete {
			t.Errorf("%s: expected complete=%v, got [DONE]=%v err=%v", tc.name, tc.complete, done, err)
		}
	}
}

// A 429 to the client means the capacity is spent: not while a deployment
// is only failing.
func TestNo429WhileADeploymentIsOnlyFailing(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(503, `{"error":"busy"}`)}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "1")}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Quality = 1
	r := newRouter(newFakeClock())
	r.MaxAttempts = 2
	res := r.Serve(context.Background(), group, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 502 || res.FailoverReason != provider.RateLimited {
		t.Errorf("expected 502 (a failed, b rate-limited), got %v (%q)", res.Err, res.FailoverReason)
	}
}

// refusing is a provider that can express no request (as Anthropic cannot
// n > 1).
type refusing struct{ provider.Provider }

func (refusing) Plan(context.Context, string, *provider.Request) (provider.Plan, error) {
	return nil, errors.New("n > 1 is not supported by refusing")
}

// A deployment that cannot express the request is skipped without an
// attempt, and spends none of its windows; when no deployment can, the
// router answers 400 with why.
func TestUnplannableDeploymentSpendsNothing(t *testing.T) {
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	a := deployment("a", &script{})
	a.Provider = refusing{a.Provider}
	a.Quality = 1
	a.State.Declare(1, 0)
	group := []*Deployment{a, deployment("b", b)}
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), group, chatReq)
	if res.Err != nil || res.Deployment != group[1] || res.Attempts != 1 || res.FailoverReason != provider.OK {
		t.Fatalf("expected b after no attempt on a, got %v %v after %d (%s)", res.Err, res.Deployment, res.Attempts, res.FailoverReason)
	}
	if snap := a.State.Snapshot(r.Clock.Now()); snap.RequestsLastMinute != 0 || snap.InFlight != 0 {
		t.Errorf("expected a's declared window unspent, got %+v", snap)
	}
	res = r.Serve(context.Background(), group[:1], chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 400 || e.Class != provider.ClientError || !strings.Contains(e.Message, "n > 1") || res.Attempts != 0 {
		t.Errorf("expected a 400 saying why, without attempts, got %v after %d", res.Err, res.Attempts)
	}
}

// brokenPlans is a provider type with bugs: a plan without a request, or
// without a stream reader.
type brokenPlans struct {
	provider.Provider
	noRequest bool
}

type streamless struct{ provider.Plan }

func (streamless) Stream(io.Reader) provider.Stream { return nil }

func (b brokenPlans) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	if b.noRequest {
		return nil, nil
	}
	p, err := b.Provider.Plan(ctx, model, r)
	return streamless{p}, err
}

// A provider type's bug fails its deployment over, never the router.
func TestBrokenProviderTypeFailsOver(t *testing.T) {
	for _, noRequest := range []bool{true, false} {
		a := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, final, "data: [DONE]")}})
		a.Provider = brokenPlans{a.Provider, noRequest}
		a.Quality = 1
		b := deployment("b", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, final, "data: [DONE]")}})
		res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{a, b}, &Request{Request: wire(chatReq.Body, true)})
		if res.Err != nil || res.Deployment != b || res.Stream == nil {
			t.Errorf("noRequest=%v: expected b's stream, got %v %v", noRequest, res.Err, res.Deployment)
			continue
		}
		if got, err := relay(t, res.Stream); err != nil || got[len(got)-1] != "[DONE]" {
			t.Errorf("noRequest=%v: expected b's whole stream, got %q %v", noRequest, got, err)
		}
	}
}

// okErrors is a provider type with a bug: every status reads as OK.
type okErrors struct{ provider.Provider }

func (o okErrors) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	return provider.NewObservation(provider.OK)
}

// An error status the provider type calls OK is no answer: the deployment
// fails over, and its body never reaches the client as one.
func TestErrorStatusCalledOKFailsOver(t *testing.T) {
	a := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){
		reply(404, "<html>not found sk-a</html>", "Content-Type", "text/html")}})
	a.Provider = okErrors{a.Provider}
	a.Quality = 1
	b := deployment("b", &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}})
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{a, b}, chatReq)
	if res.Err != nil || res.Deployment != b || res.Status != 200 || res.FailoverReason != provider.Server {
		t.Fatalf("expected b after a's 404, got %v %v %d (%s)", res.Err, res.Deployment, res.Status, res.FailoverReason)
	}
	alone := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){
		reply(404, "<html>not found</html>", "Content-Type", "text/html")}})
	alone.Provider = okErrors{alone.Provider}
	res = newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{alone}, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Class != provider.Server || strings.Contains(string(res.Body), "html") {
		t.Errorf("expected a router error, not the 404 page as an answer, got %d %s %v", res.Status, res.Body, res.Err)
	}
}

// keptAlive is an upstream stream body: one chunk, then keep-alive
// comments every 10 ms until closed.
func keptAlive(req *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	go func() {
		defer pw.Close()
		if _, err := pw.Write([]byte(chunk + "\n\n")); err != nil {
			return
		}
		for {
			select {
			case <-req.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
				if _, err := pw.Write([]byte(": keep-alive\n\n")); err != nil {
					return
				}
			}
		}
	}()
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr, Request: req}, nil
}

// A provider that sends keep-alives but no content after its first chunk
// is silent: idle_timeout ends the stream (the client is not held).
func TestKeepAlivesDoNotHoldAStream(t *testing.T) {
	d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){keptAlive}})
	d.IdleTimeout = 50 * time.Millisecond
	r := New()
	res := r.Serve(context.Background(), []*Deployment{d}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a committed stream, got %v", res.Err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := relay(t, res.Stream)
		done <- err
	}()
	select {
	case err := <-done:
		var se *StreamError
		if !errors.As(err, &se) || !strings.Contains(se.Message, "went silent") {
			t.Errorf("expected the stream to end silent, got %v", err)
		}
	case <-time.After(5 * time.Second):
		res.Stream.Close()
		t.Fatal("keep-alives held the stream past idle_timeout")
	}
}

// fakeStream is a provider stream of scripted events.
type fakeStream struct {
	events []provider.Event
	kinds  []provider.EventKind
}

func (f *fakeStream) Next() (provider.Event, provider.EventKind, provider.Observation, error) {
	if len(f.events) == 0 {
		return provider.Event{}, provider.EventSkip, provider.Observation{}, io.EOF
	}
	ev, kind := f.events[0], f.kinds[0]
	f.events, f.kinds = f.events[1:], f.kinds[1:]
	return ev, kind, provider.Observation{}, nil
}

func (f *fakeStream) Complete() bool { return true }

// scriptedStream is a provider whose plans read a fakeStream.
type scriptedStream struct {
	provider.Provider
	stream func() *fakeStream
}

type scriptedPlan struct {
	provider.Plan
	s *fakeStream
}

func (p scriptedPlan) Stream(io.Reader) provider.Stream { return p.s }

func (s scriptedStream) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	p, err := s.Provider.Plan(ctx, model, r)
	return scriptedPlan{p, s.stream()}, err
}

// What a stream sends before its first content is held for the client up
// to a bound in bytes: past it, the attempt fails over.
func TestPendingBeforeContentIsBounded(t *testing.T) {
	kb := provider.Event{Name: "ping", Data: bytes.Repeat([]byte("x"), 1<<10)}
	many := func(n int) func() *fakeStream {
		return func() *fakeStream {
			f := &fakeStream{}
			for i := 0; i < n; i++ {
				f.events, f.kinds = append(f.events, kb), append(f.kinds, provider.EventSkip)
			}
			f.events = append(f.events, provider.Event{Data: []byte(`{"choices":[]}`)})
			f.kinds = append(f.kinds, provider.EventData)
			return f
		}
	}
	for _, tc := range []struct {
		pings int
		ok    bool
	}{{100, true}, {2000, false}} {
		a := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk)}})
		a.Provider = scriptedStream{a.Provider, many(tc.pings)}
		res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{a}, &Request{Request: wire(chatReq.Body, true)})
		if (res.Stream != nil) != tc.ok {
			t.Errorf("%d KiB before the first content: expected committed=%v, got %v", tc.pings, tc.ok, res.Err)
		}
		if res.Stream != nil {
			got, _ := relay(t, res.Stream)
			if len(got) != tc.pings+2 {
				t.Errorf("expected the %d held events, the content and the end, got %d", tc.pings, len(got))
			}
		}
	}
}

// A provider's answer that echoes its key has it redacted from what the
// router keeps, logs and passes on.
func TestEchoedKeyIsRedacted(t *testing.T) {
	const key = "sk-proj-SECRET123456"
	echo401 := reply(401, `{"error":{"message":"Incorrect API key provided: `+key+`","type":"invalid_request_error","code":"invalid_api_key"}}`)
	echo400 := reply(400, `{"error":{"message":"bad request for key `+key+`","type":"invalid_request_error","code":null}}`)
	a := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){echo401}})
	b := deployment("b", &script{replies: []func(*http.Request) (*http.Response, error){echo400}})
	a.Secrets, b.Secrets, a.Quality = []string{key}, []string{key}, 1
	core, logs := observer.New(zapcore.DebugLevel)
	r := newRouter(newFakeClock())
	r.Logger = zap.New(core)
	res := r.Serve(context.Background(), []*Deployment{a, b}, chatReq)
	if res.Status != 400 || res.Deployment != b || strings.Contains(string(res.Body), key) || !strings.Contains(string(res.Body), "[redacted]") ||
		strings.Contains(res.Error.Message, key) {
		t.Errorf("expected b's 400 with the key redacted, got %d %s %+v", res.Status, res.Body, res.Error)
	}
	if snap := a.State.Snapshot(time.Now()); strings.Contains(snap.LastMessage, key) || !strings.Contains(snap.LastMessage, "[redacted]") {
		t.Errorf("expected a's last message redacted, got %q", snap.LastMessage)
	}
	for _, e := range logs.All() {
		if strings.Contains(fmt.Sprint(e.Message, e.ContextMap()), key) {
			t.Errorf("a log line holds the key: %s %v", e.Message, e.ContextMap())
		}
	}
	if logs.Len() == 0 {
		t.Error("expected the disabled deployment logged")
	}
}

// A short key (under 8 characters) and a masked one (stars before its
// last 4, as DeepSeek shows it) echoed in a client error are redacted from
// the body passed on, the restated message and the log; in a 401, from
// the deployment's last message; in a stream's error event, from the
// StreamError.
func TestEchoedShortOrMaskedKeyIsRedacted(t *testing.T) {
	for _, tc := range []struct{ key, shown string }{{"x7Q2p", "x7Q2p"}, {"sk-0123456789abcdefXYZ9", "****XYZ9"}} {
		bad := `{"error":{"message":"credential ` + tc.shown + ` refused","type":"invalid_request_error","code":null}}`
		d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){reply(400, bad)}})
		d.Secrets = []string{tc.key}
		core, logs := observer.New(zapcore.DebugLevel)
		r := newRouter(newFakeClock())
		r.Logger = zap.New(core)
		res := r.Serve(context.Background(), []*Deployment{d}, chatReq)
		for where, got := range map[string]string{"body": string(res.Body), "message": res.Error.Message} {
			if strings.Contains(got, tc.shown) || !strings.Contains(got, "credential [redacted] refused") {
				t.Errorf("key %s, %s: expected it redacted, got %q", tc.key, where, got)
			}
		}
		for _, e := range logs.All() {
			if strings.Contains(fmt.Sprint(e.Message, e.ContextMap()), tc.shown) {
				t.Errorf("key %s: a log line holds it: %s %v", tc.key, e.Message, e.ContextMap())
			}
		}
		// A 401 is kept as the deployment's last message (the admin API's,
		// the status page's).
		d = deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){reply(401, bad)}})
		d.Secrets = []string{tc.key}
		newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, chatReq)
		if last := d.State.Snapshot(time.Now()).LastMessage; strings.Contains(last, tc.shown) || !strings.Contains(last, "[redacted]") {
			t.Errorf("key %s: expected the last message redacted, got %q", tc.key, last)
		}
		event := `data: {"error":{"message":"credential ` + tc.shown + ` refused","type":"server_error"}}`
		s := deployment("s", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, event)}})
		s.Secrets = []string{tc.key}
		res = newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{s}, &Request{Request: wire(chatReq.Body, true)})
		if res.Stream == nil {
			t.Fatalf("expected a stream, got %v", res.Err)
		}
		if _, err := relay(t, res.Stream); err == nil || strings.Contains(err.Error(), tc.shown) || !strings.Contains(err.Error(), "[redacted]") {
			t.Errorf("key %s: expected the stream's error redacted, got %v", tc.key, err)
		}
	}
}

// Log lines say what happened: "failing over" only when another attempt
// follows (naming it), and a quota spent mid-stream is the once-only error
// line of a disabled deployment, not a warning.
func TestFailureLogLinesAreTrue(t *testing.T) {
	lines := func(logs *observer.ObservedLogs) []string {
		var out []string
		for _, e := range logs.All() {
			if e.Level >= zapcore.InfoLevel {
				out = append(out, e.Level.String()+": "+e.Message+" "+fmt.Sprint(e.ContextMap()["to"]))
			}
		}
		return out
	}
	boom := reply(500, `{"error":{"message":"boom","type":"server_error"}}`)
	core, logs := observer.New(zapcore.DebugLevel)
	r := newRouter(newFakeClock())
	r.Logger = zap.New(core)
	a := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){boom}})
	b := deployment("b", &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}})
	a.Quality = 1
	r.Serve(context.Background(), []*Deployment{a, b}, chatReq)
	if got := lines(logs); len(got) != 1 || got[0] != "info: attempt failed, failing over b" {
		t.Errorf("expected one line failing over to b, got %q", got)
	}

	core, logs = observer.New(zapcore.DebugLevel)
	r.Logger = zap.New(core)
	alone := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){boom}})
	r.MaxAttempts = 1
	r.Serve(context.Background(), []*Deployment{alone, deployment("b", &script{replies: []func(*http.Request) (*http.Response, error){boom}})}, chatReq)
	if got := lines(logs); len(got) != 1 || !strings.HasPrefix(got[0], "info: attempt failed, no other attempt follows") {
		t.Errorf("expected one line saying no attempt follows, got %q", got)
	}

	core, logs = observer.New(zapcore.DebugLevel)
	r.Logger = zap.New(core)
	r.MaxAttempts = DefaultMaxAttempts
	quota := `data: {"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`
	q := deployment("q", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, quota)}})
	res := r.Serve(context.Background(), []*Deployment{q}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a committed stream, got %v", res.Err)
	}
	if _, err := relay(t, res.Stream); err == nil {
		t.Fatal("expected the stream to fail")
	}
	if got := lines(logs); len(got) != 1 || !strings.HasPrefix(got[0], "error: deployment disabled") {
		t.Errorf("expected the once-only error line of a spent quota, got %q", got)
	}
}

// A success speaks only for the moment its attempt was sent. Request #0
// meets A's 429 (Retry-After 60) after 50 ms; #1, sent 10 ms after #0 and
// admitted before the limit hit, answers 200 after 500 ms. No request
// reaches A before the 60 s are over.
func TestLateSuccessDoesNotReopenADeployment(t *testing.T) {
	clock := newFakeClock()
	sent0, sent1, release0, release1 := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	a := &script{replies: []func(*http.Request) (*http.Response, error){
		func(req *http.Request) (*http.Response, error) {
			close(sent0)
			<-release0
			return reply(429, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "60")(req)
		},
		func(req *http.Request) (*http.Response, error) {
			close(sent1)
			<-release1
			return reply(200, okBody)(req)
		},
		reply(200, okBody),
	}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Quality = 1
	r := newRouter(clock)
	done0, done1 := make(chan *Result, 1), make(chan *Result, 1)
	go func() { done0 <- r.Serve(context.Background(), group, chatReq) }()
	<-sent0
	clock.Advance(10 * time.Millisecond)
	go func() { done1 <- r.Serve(context.Background(), group, chatReq) }()
	<-sent1
	clock.Advance(40 * time.Millisecond)
	close(release0)
	if res := <-done0; res.Deployment != group[1] {
		t.Fatalf("expected #0 to fail over to b, got %v %v", res.Deployment, res.Err)
	}
	clock.Advance(460 * time.Millisecond)
	close(release1)
	if res := <-done1; res.Deployment != group[0] || res.Status != 200 {
		t.Fatalf("expected #1 answered by a, got %v %v", res.Deployment, res.Err)
	}
	// The late 200 predates the 429: a stays closed until its reset.
	for i := 0; i < 3; i++ {
		if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[1] {
			t.Fatalf("request %d at +%v: expected b while a cools, got %v", i, clock.Now().Sub(newFakeClock().Now()), res.Deployment)
		}
		clock.Advance(19 * time.Second)
	}
	if n := a.calls.Load(); n != 2 {
		t.Errorf("expected no request at a before 60 s, got %d calls", n)
	}
	// Now 57.51 s; the 429 came at 0.05 s with Retry-After 60.
	if at, why := group[0].State.AvailableAt(clock.Now(), 0); why != provider.RateLimited || at.Sub(clock.Now()) != 2540*time.Millisecond {
		t.Errorf("expected a rate-limited until 60.05 s, 2.54 s from now, got %v (%s)", at.Sub(clock.Now()), why)
	}
	clock.Advance(2540 * time.Millisecond)
	if at, _ := group[0].State.AvailableAt(clock.Now(), 0); at.After(clock.Now()) {
		t.Errorf("expected a available after its reset, got %v", at.Sub(clock.Now()))
	}
}

// A deployment whose circuit turns half-open is probed by the next
// request, whatever the ranking says (its failures hold its reliability
// below the others'), and a successful probe restores its place.
func TestHalfOpenDeploymentIsProbedAndRestored(t *testing.T) {
	clock := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Weight = 200
	r := newRouter(clock)
	// A burst of 8 failures in 0.3 s (requests in flight together).
	for i := 0; i < 8; i++ {
		group[0].State.Observe(clock.Now(), provider.NewObservation(provider.Server), r.Policy)
		clock.Advance(40 * time.Millisecond)
	}
	open := clock.Now() // the circuit is open for backoff_max (30 s)
	probed := time.Duration(0)
	for i := 0; i < 40 && probed == 0; i++ {
		res := r.Serve(context.Background(), group, chatReq)
		if res.Deployment == group[0] {
			probed = clock.Now().Sub(open)
		}
		clock.Advance(1500 * time.Millisecond)
	}
	if probed == 0 || probed > r.Policy.BackoffMax+1500*time.Millisecond {
		t.Fatalf("expected a probed within backoff_max plus one request gap, got %v", probed)
	}
	if n := a.calls.Load(); n != 1 {
		t.Errorf("expected exactly one probe, got %d calls at a", n)
	}
	// The probe succeeded: a is back in its place.
	for i := 0; i < 5; i++ {
		if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[0] {
			t.Errorf("request %d after the probe: expected a (weight 200), got %s", i, res.Deployment.Name)
		}
		clock.Advance(1500 * time.Millisecond)
	}
}

// No key or key fragment a provider shows in a message (OpenAI's masked
// "sk-ab*****wxyz", Anthropic, Google, AWS and Azure keys, bearer tokens)
// reaches a log line, the admin state, or the client.
func TestKeyFragmentsNeverLeave(t *testing.T) {
	fragments := []string{
		"sk-ab*****wxyz", "sk-proj-Abc123DEF456ghi789", "sk-ant-api03-xyz987-AAAA", "AIzaSyA1b2C3d4E5f6G7h8I9j0",
		"AKIAIOSFODNN7EXAMPLE", "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "0123456789abcdef0123456789abcdef", "gsk_12****7890",
	}
	for _, frag := range fragments {
		msg := "Incorrect API key provided: " + frag + ". You can find your API key at https://platform.openai.com/account/api-keys."
		body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": nil}})
		core, logs := observer.New(zapcore.DebugLevel)
		r := newRouter(newFakeClock())
		r.Logger = zap.New(core)
		a := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){reply(401, string(body))}})
		b := deployment("b", &script{replies: []func(*http.Request) (*http.Response, error){reply(400, string(body))}})
		c := deployment("c", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, "data: "+string(body))}})
		a.Quality = 1
		res := r.Serve(context.Background(), []*Deployment{a, b}, chatReq)
		seen := []string{string(res.Body), a.State.Snapshot(time.Now()).LastMessage}
		if res.Error != nil {
			seen = append(seen, res.Error.Message)
		}
		sres := r.Serve(context.Background(), []*Deployment{c}, &Request{Request: wire(chatReq.Body, true)})
		if sres.Stream == nil {
			t.Fatalf("%s: expected c's stream, got %v", frag, sres.Err)
		}
		_, err := relay(t, sres.Stream)
		seen = append(seen, fmt.Sprint(err), c.State.Snapshot(time.Now()).LastMessage)
		for _, e := range logs.All() {
			seen = append(seen, fmt.Sprint(e.Message, e.ContextMap()))
		}
		key := strings.TrimPrefix(frag, "Bearer ")
		for _, s := range seen {
			if strings.Contains(s, key) || strings.Contains(s, key[:min(len(key), 6)]+"*") {
				t.Errorf("%s: found in %q", frag, s)
			}
		}
		if !strings.Contains(string(res.Body), "[redacted]") {
			t.Errorf("%s: expected the passed-on body redacted, got %s", frag, res.Body)
		}
		if !strings.Contains(string(res.Body), "platform.openai.com/account/api-keys") {
			t.Errorf("%s: expected the rest of the message kept, got %s", frag, res.Body)
		}
	}
}

// Only the probe's own answer ends the probe: a success of a request sent
// before the failures (answered while the probe is out) neither frees the
// probe nor takes the probe's place, so the probe's success restores a.
func TestOnlyTheProbeEndsTheProbe(t *testing.T) {
	clock := newFakeClock()
	sentL, relL, sentP, relP := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	a := scriptOf(
		func(req *http.Request) (*http.Response, error) { close(sentL); <-relL; return reply(200, okBody)(req) },
		func(req *http.Request) (*http.Response, error) { close(sentP); <-relP; return reply(200, okBody)(req) },
		reply(200, okBody),
	)
	b := scriptOf(reply(200, okBody))
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Weight = 200
	r := newRouter(clock)
	doneL, doneP := make(chan *Result, 1), make(chan *Result, 1)
	go func() { doneL <- r.Serve(context.Background(), group, chatReq) }()
	<-sentL
	for i := 0; i < 8; i++ {
		group[0].State.Observe(clock.Now(), provider.NewObservation(provider.Server), r.Policy)
		clock.Advance(40 * time.Millisecond)
	}
	clock.Advance(31 * time.Second) // half-open
	go func() { doneP <- r.Serve(context.Background(), group, chatReq) }()
	<-sentP
	close(relL) // the long request sent before the failures answers 200
	if res := <-doneL; res.Deployment != group[0] {
		t.Fatalf("L: %v", res.Err)
	}
	close(relP)
	if res := <-doneP; res.Deployment != group[0] {
		t.Fatalf("P: expected the probe on a, got %v %v", res.Deployment, res.Err)
	}
	// The probe succeeded: a should be back in its place.
	var got []string
	for i := 0; i < 5; i++ {
		res := r.Serve(context.Background(), group, chatReq)
		got = append(got, res.Deployment.Name)
		clock.Advance(1500 * time.Millisecond)
	}
	snap := group[0].State.Snapshot(clock.Now())
	if strings.Count(strings.Join(got, ","), "a") < 4 || snap.SuccessRate < 0.99 {
		t.Errorf("after a successful probe, expected a (weight 200) back in its place, got %v (a success rate %.2f)", got, snap.SuccessRate)
	}
}

// While the probe is out, another attempt's answer does not free it: no
// second request reaches the half-open deployment.
func TestOneProbeAtATime(t *testing.T) {
	clock := newFakeClock()
	sentL, relL, sentP, relP := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	a := scriptOf(
		func(req *http.Request) (*http.Response, error) { close(sentL); <-relL; return reply(200, okBody)(req) },
		func(req *http.Request) (*http.Response, error) {
			close(sentP)
			<-relP
			return reply(500, `{"error":{"message":"boom"}}`)(req)
		},
		reply(500, `{"error":{"message":"boom"}}`),
	)
	b := scriptOf(reply(200, okBody))
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	r := newRouter(clock)
	doneL, doneP := make(chan *Result, 1), make(chan *Result, 1)
	go func() { doneL <- r.Serve(context.Background(), group, chatReq) }()
	<-sentL
	for i := 0; i < 3; i++ {
		group[0].State.Observe(clock.Now(), provider.NewObservation(provider.Server), r.Policy)
		clock.Advance(40 * time.Millisecond)
	}
	clock.Advance(31 * time.Second)
	go func() { doneP <- r.Serve(context.Background(), group, chatReq) }()
	<-sentP
	close(relL)
	<-doneL
	// The probe P is still out: a third request must not reach a.
	r.Serve(context.Background(), group, chatReq)
	if n := a.calls.Load(); n != 2 {
		t.Errorf("expected one probe out at a time (2 calls at a), got %d calls", n)
	}
	close(relP)
	<-doneP
}

func scriptOf(r ...func(*http.Request) (*http.Response, error)) *script { return &script{replies: r} }

// A context-length error is the answer only when no deployment could take
// the prompt: when a larger one is only rate-limited, the client is told to
// come back (429 with its reset), not that its prompt is too long.
func TestContextLengthAfterARateLimitIsA429(t *testing.T) {
	rateLimited := `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`
	big := scriptOf(reply(429, rateLimited, "Retry-After", "30"))
	small := scriptOf(reply(400, `{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}`))
	group := []*Deployment{deployment("big", big), deployment("small", small)}
	group[0].Quality, group[0].ContextWindow, group[1].ContextWindow = 1, 128000, 8192
	r := newRouter(newFakeClock())
	r.MaxAttempts = 2
	res := r.Serve(context.Background(), group, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != http.StatusTooManyRequests || e.RetryAfter != 30*time.Second {
		t.Errorf("expected a 429 with Retry-After 30 s (the prompt fits big), got %v, %d from %v", res.Err, res.Status, res.Deployment)
	}
}

// Keys that providers show in other shapes (JSON escapes, Unicode masks, a
// code field, a URL parameter, a long token named a key) are redacted too
// (found by adversarial testing).
func TestEscapedAndMaskedKeysNeverLeave(t *testing.T) {
	const key = "sk-proj-Abc123DEF456ghi789"
	leaks := []struct{ name, raw, secret string }{
		{"json-escaped dash", `{"error":{"message":"Incorrect API key provided: sk\u002dproj\u002dAbc123DEF456ghi789.","type":"invalid_request_error","code":"invalid_api_key"}}`, "sk-proj-Abc123DEF456ghi789"},
		{"json-escaped slash in header secret", `{"error":{"message":"bad token abc\/def+ghi\/jkl012345","type":"invalid_request_error"}}`, "abc/def+ghi/jkl012345"},
		{"unicode ellipsis mask", `{"error":{"message":"Incorrect API key provided: sk-ab…wxyz.","type":"invalid_request_error"}}`, "sk-ab…wxyz"},
		{"bullets mask", `{"error":{"message":"Incorrect API key provided: sk-ab••••wxyz.","type":"invalid_request_error"}}`, "sk-ab••"},
		{"key in code field", `{"error":{"message":"Invalid key","type":"invalid_request_error","code":"invalid_key:AIzaSyA1b2C3d4E5f6G7h8I9j0"}}`, "AIzaSyA1b2C3d4E5f6G7h8I9j0"},
		{"url key", `{"error":{"message":"Forbidden: https://x.invalid/v1/models?key=AIzaSyA1b2C3d4E5f6G7h8I9j0","type":"invalid_request_error"}}`, "AIzaSyA1b2C3d4E5f6G7h8I9j0"},
		{"azure 84-char fragment", `{"error":{"message":"Key 3fJk9QwErTyUiOpAsDfGhJkLzXcVbNm1 is not valid for this resource","type":"invalid_request_error"}}`, "3fJk9QwErTyUiOpAsDfGhJkLzXcVbNm1"},
	}
	for _, tc := range leaks {
		core, logs := observer.New(zapcore.DebugLevel)
		r := newRouter(newFakeClock())
		r.Logger = zap.New(core)
		a := deployment("a", scriptOf(reply(401, tc.raw)))
		b := deployment("b", scriptOf(reply(400, tc.raw)))
		a.Quality = 1
		a.Secrets = []string{key, "abc/def+ghi/jkl012345"}
		b.Secrets = a.Secrets
		res := r.Serve(context.Background(), []*Deployment{a, b}, chatReq)
		var decoded any
		_ = json.Unmarshal(res.Body, &decoded)
		seen := map[string]string{"passed-on body (decoded)": fmt.Sprint(decoded), "a last message": a.State.Snapshot(time.Now()).LastMessage}
		if res.Error != nil {
			seen["restated message"] = res.Error.Message
			seen["restated code"] = res.Error.Code
		}
		for _, e := range logs.All() {
			seen["log "+e.Message] = fmt.Sprint(e.ContextMap())
		}
		for where, s := range seen {
			if strings.Contains(s, tc.secret) {
				t.Errorf("%s: leaks in %s: %q", tc.name, where, s)
			}
		}
	}
}

// The context pre-check: a deployment whose context_window is smaller than
// the request's estimate (prompt + max_tokens) is never tried; when no
// deployment is large enough the client gets a 400 context_length at once.
func TestContextWindowPreCheck(t *testing.T) {
	clock := newFakeClock()
	ok := func() *script {
		return &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	}
	small, mid, big := ok(), ok(), ok()
	group := []*Deployment{deployment("small", small), deployment("mid", mid), deployment("big", big)}
	group[0].ContextWindow, group[1].ContextWindow = 1000, 2000 // big: unknown, may be larger
	group[0].Quality, group[1].Quality = 1, 1
	r := newRouter(clock)
	req := &Request{Request: wire(chatReq.Body, false), Tokens: 5000}
	if res := r.Serve(context.Background(), group, req); res.Err != nil || res.Deployment != group[2] || res.Attempts != 1 {
		t.Fatalf("expected big alone tried, got %+v", res)
	}
	if small.calls.Load()+mid.calls.Load() != 0 {
		t.Errorf("expected the small windows never tried, got %d and %d calls", small.calls.Load(), mid.calls.Load())
	}
	res := r.Serve(context.Background(), group[:2], req)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 400 || e.Class != provider.ContextLength || res.Attempts != 0 ||
		!strings.Contains(e.Message, "5000 tokens") || !strings.Contains(e.Message, "2000") {
		t.Fatalf("expected a 400 context_length at once, got %+v %v", res, res.Err)
	}
	// A request that fits goes as before.
	if res := r.Serve(context.Background(), group[:2], chatReq); res.Err != nil {
		t.Errorf("a small request: %v", res.Err)
	}
}

// Near its window, a model that counts with o200k_base is checked by the
// exact count, not by bytes / 4: a prompt of 8,000 tokens (40 KB of
// English, 10,000 by bytes / 4) fits an 9,000-token window; another
// model's window is checked by the estimate.
func TestContextWindowExactCount(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello world` + strings.Repeat(" hello world", 3999) + `"}]}`)
	req := &Request{Request: wire(body, false), PromptTokens: int64(len(body))/4 + 1, OutputTokens: 500}
	req.Tokens = req.PromptTokens + req.OutputTokens
	if req.Tokens <= 9000 {
		t.Fatalf("the estimate should be over the window, got %d", req.Tokens)
	}
	for _, exact := range []bool{true, false} {
		s := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
		d := deployment("gpt", s)
		d.ContextWindow, d.ExactTokens = 9000, exact
		res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, req)
		var e *Error
		switch {
		case exact && (res.Err != nil || s.calls.Load() != 1):
			t.Errorf("exact count: expected the request sent, got %v after %d calls", res.Err, s.calls.Load())
		case !exact && (!errors.As(res.Err, &e) || e.Class != provider.ContextLength || s.calls.Load() != 0):
			t.Errorf("estimate: expected a 400 context_length at once, got %v after %d calls", res.Err, s.calls.Load())
		}
	}
	if c := req.exact.Load(); c == nil || !c.complete || c.n < 8000 || c.n > 8020 {
		t.Errorf("expected the exact count (about 8,000 tokens) cached, got %+v", c)
	}
	// Far below the window, the estimate decides and nothing is counted.
	small := &Request{Request: wire(chatReq.Body, false), Tokens: 20}
	d := deployment("gpt", &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}})
	d.ContextWindow, d.ExactTokens = 9000, true
	if res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, small); res.Err != nil || small.exact.Load() != nil {
		t.Errorf("expected a small request sent without an exact count, got %v (count %+v)", res.Err, small.exact.Load())
	}
}

// A failed attempt's log line is enough to diagnose it: the URL requested
// (never its query, which may hold a key), and when the provider's error
// said nothing decodable, the first bytes of what it sent.
func TestFailureLogLinesAreDiagnosable(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	r := newRouter(newFakeClock())
	r.Logger = zap.New(core)
	r.MaxAttempts = 1
	html := reply(404, `<html><body>nginx: no such route</body></html>`, "Content-Type", "text/html")
	d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){html}})
	r.Serve(context.Background(), []*Deployment{d}, chatReq)
	entries := logs.FilterMessageSnippet("attempt failed").All()
	if len(entries) != 1 {
		t.Fatalf("expected one failure line, got %d", len(entries))
	}
	f := entries[0].ContextMap()
	if f["url"] != "http://a.invalid/v1/chat/completions" || f["status"] != int64(404) {
		t.Errorf("expected the URL and status, got %v", f)
	}
	msg, _ := f["message"].(string)
	body, _ := f["body"].(string)
	if !strings.Contains(msg+body, "no such route") {
		t.Errorf("expected what the provider said (its message, or the body's first bytes), got %v", f)
	}
}
