package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// instantClockE is a fakeClock whose timers of no duration fire at once,
// as a real timer of 0 does (synchronously here, so that tests can tell).
type instantClockE struct{ *fakeClock }

func (c instantClockE) AfterFunc(d time.Duration, f func()) Timer {
	t := c.fakeClock.AfterFunc(d, f)
	if d <= 0 {
		t.Stop()
		f()
	}
	return t
}

// recClockE is a fakeClock that records the duration of each timer set or
// reset.
type recClockE struct {
	*fakeClock
	mu    sync.Mutex
	waits []time.Duration
}

type recTimerE struct {
	Timer
	c *recClockE
}

func (c *recClockE) note(d time.Duration) {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
}

func (c *recClockE) AfterFunc(d time.Duration, f func()) Timer {
	c.note(d)
	return recTimerE{c.fakeClock.AfterFunc(d, f), c}
}

func (t recTimerE) Reset(d time.Duration) bool {
	t.c.note(d)
	return t.Timer.Reset(d)
}

// readsE is a response body of scripted reads: each call of Read runs the
// next step (which may move the clock) and returns what it gives.
type readsE struct {
	steps []func() ([]byte, error)
	rest  []byte
}

func (b *readsE) Read(p []byte) (int, error) {
	if len(b.rest) == 0 {
		if len(b.steps) == 0 {
			return 0, io.EOF
		}
		step := b.steps[0]
		b.steps = b.steps[1:]
		data, err := step()
		if err != nil {
			return 0, err
		}
		b.rest = data
	}
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	return n, nil
}

func (b *readsE) Close() error { return nil }

func streamOfE(body io.ReadCloser, req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body, Request: req}, nil
}

func evE(s string) []byte { return []byte(s + "\n\n") }

// A stream's usage adds up what its provider stated: cached input, cache
// writes and reasoning tokens as well as input and output.
func TestStreamUsageKeepsEveryCount(t *testing.T) {
	start := brkEv("message_start", `{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":10,"cache_read_input_tokens":100,"cache_creation_input_tokens":20,"output_tokens":1}}}`)
	d := claude(deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){
		sse(start, brkBlockStart(0, "text"), brkDelta(0, "Hi"), brkBlockStop(0), brkMsgDelta("end_turn", 5), brkMsgStop)}}))
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, messagesReq())
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	if _, err := relayMessages(res.Stream); err != nil {
		t.Fatal(err)
	}
	if u, ok := res.Stream.Usage(); !ok || u.InputTokens != 130 || u.CachedInputTokens != 100 || u.CacheWriteTokens != 20 || u.OutputTokens != 5 {
		t.Errorf("expected 130 in (100 cached, 20 written), 5 out; got %+v %v", u, ok)
	}

	usage := `data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":3}}}`
	o := deployment("o", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, final, usage, "data: [DONE]")}})
	res = newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{o}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	if _, err := relay(t, res.Stream); err != nil {
		t.Fatal(err)
	}
	if u, ok := res.Stream.Usage(); !ok || u.InputTokens != 12 || u.CachedInputTokens != 8 || u.ReasoningTokens != 3 || u.OutputTokens != 7 {
		t.Errorf("expected 12 in (8 cached), 7 out (3 reasoning); got %+v %v", u, ok)
	}
}

// An error event mid-stream ends it with the provider's own message.
func TestMidStreamErrorKeepsTheProvidersMessage(t *testing.T) {
	d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){
		sse(chunk, `data: {"error":{"message":"the model is overloaded","type":"server_error","param":null,"code":null}}`)}})
	r := newRouter(newFakeClock())
	r.Resume = ResumeOff
	res := r.Serve(context.Background(), []*Deployment{d}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	_, err := relay(t, res.Stream)
	var se *StreamError
	if !errors.As(err, &se) || se.Message != "stream failed: the model is overloaded" {
		t.Errorf("expected the provider's message, got %v", err)
	}
}

// A deployment with no idle_timeout (0) sets no idle timer: its stream is
// not cut for silence, however long the provider takes.
func TestNoIdleTimeoutNeverCuts(t *testing.T) {
	c := instantClockE{newFakeClock()}
	d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){func(req *http.Request) (*http.Response, error) {
		return streamOfE(&readsE{steps: []func() ([]byte, error){
			func() ([]byte, error) { return evE(chunk), nil },
			func() ([]byte, error) {
				c.Advance(time.Hour)
				if err := req.Context().Err(); err != nil {
					return nil, err
				}
				return append(evE(final), evE("data: [DONE]")...), nil
			},
		}}, req)
	}}})
	d.IdleTimeout = 0
	r := newRouter(c.fakeClock)
	r.Clock = c
	r.Resume = ResumeOff
	res := r.Serve(context.Background(), []*Deployment{d}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	if got, err := relay(t, res.Stream); err != nil || len(got) != 3 {
		t.Errorf("expected the whole stream, got %q %v", got, err)
	}
}

// RealClock.Sleep of nothing returns at once, with the context's error
// when the client already left; a positive sleep ends when the context
// does, with its error.
func TestRealClockSleep(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for range 64 {
		if err := (RealClock{}).Sleep(gone, 0); !errors.Is(err, context.Canceled) {
			t.Fatalf("a zero sleep of a client gone: expected context.Canceled, got %v", err)
		}
	}
	if err := (RealClock{}).Sleep(context.Background(), 0); err != nil {
		t.Errorf("a zero sleep: expected nil, got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := (RealClock{}).Sleep(leavesE{ctx, cancel}, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("a client leaving during a sleep: expected context.Canceled, got %v", err)
	}
}

// leavesE is a context whose client leaves as soon as someone waits on it.
type leavesE struct {
	context.Context
	cancel context.CancelFunc
}

func (l leavesE) Done() <-chan struct{} {
	l.cancel()
	return l.Context.Done()
}

// Both tiers rate-limited past the deadline: a 429 with the earliest
// Retry-After, no attempt.
func TestEveryTierLimitedIsA429(t *testing.T) {
	c := newFakeClock()
	r := newRouter(c)
	a, b := okScriptE(), okScriptE()
	group := []*Deployment{deployment("first", a), deployment("second", b)}
	group[1].Tier = 2
	for i, wait := range []time.Duration{2 * time.Minute, 3 * time.Minute} {
		rl := provider.NewObservation(provider.RateLimited)
		rl.RetryAfter = wait
		group[i].State.Observe(c.Now(), rl, r.Policy)
	}
	res := r.Serve(context.Background(), group, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != http.StatusTooManyRequests || e.RetryAfter < 2*time.Minute || e.RetryAfter > 2*time.Minute+time.Second {
		t.Fatalf("expected a 429 with Retry-After 2 min, got %v", res.Err)
	}
	if a.calls.Load()+b.calls.Load() != 0 {
		t.Errorf("expected no attempt")
	}
}

// With three tiers, the one after a tier that cannot serve is the next one
// up, not the highest, however well the highest scores.
func TestTheNextTierIsTheLowestAbove(t *testing.T) {
	c := newFakeClock()
	r := newRouter(c)
	group := []*Deployment{deployment("one", okScriptE()), deployment("two", okScriptE()), deployment("three", okScriptE())}
	group[1].Tier, group[2].Tier = 2, 3
	group[1].CostInput, group[1].CostOutput = 10, 30
	group[2].Quality = 1
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 2 * time.Minute
	group[0].State.Observe(c.Now(), rl, r.Policy)
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[1] {
		t.Errorf("expected tier 2, got %v", res.Deployment)
	}
}

// A first tier whose window comes back within the deadline, but too late
// for an answer of its latency before it, cannot serve: the second tier
// answers at once. The same for a tokens window.
func TestATierTooSlowForItsWindowIsPassed(t *testing.T) {
	for _, tokens := range []bool{false, true} {
		c := newFakeClock()
		r := newRouter(c)
		r.Deadline = time.Minute
		first, second := okScriptE(), okScriptE()
		group := []*Deployment{deployment("first", first), deployment("second", second)}
		group[1].Tier = 2
		spent := provider.Window{Limit: 1000, Remaining: 0, Reset: 20 * time.Second}
		if tokens {
			// A tokens window whose count per token is known: an attempt
			// estimated at 100 took 500 left to none.
			withWindows(t, group[0], c.Now(), provider.UnknownWindow, provider.Window{Limit: 1000, Remaining: 500, Reset: 20 * time.Second})
			claim, _ := group[0].State.AcquireFor(c.Now(), capacity.Need{Tokens: 100})
			o := provider.NewObservation(provider.OK)
			o.Requests, o.Tokens = provider.UnknownWindow, spent
			group[0].State.ObserveAttempt(claim, c.Now(), o, r.Policy)
			group[0].State.ReleaseAttempt(claim)
		} else {
			withWindows(t, group[0], c.Now(), spent, provider.UnknownWindow)
		}
		group[0].State.RecordLatency(50*time.Second, 0)
		res := r.Serve(context.Background(), group, chatReq)
		if res.Deployment != group[1] || len(c.Sleeps()) != 0 || first.calls.Load() != 0 {
			t.Errorf("tokens %v: expected the second tier at once, got %v after waits %v", tokens, res.Deployment, c.Sleeps())
		}
	}
}

// With hedge_after 0 nothing is hedged, even on a clock whose timers of 0
// fire at once: the slow attempt runs alone until its timeout.
func TestNoHedgeAfterZero(t *testing.T) {
	c := instantClockE{newFakeClock()}
	a := &script{replies: []func(*http.Request) (*http.Response, error){hang}}
	b := okScriptE()
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Quality, group[0].Timeout = 1, 10*time.Second
	r := newRouter(c.fakeClock)
	r.Clock = c
	r.HedgeAfter = 0
	done := serveAsyncE(r, group, chatReq)
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(10 * time.Second)
	res := <-done
	if res.Hedge != "" || res.Deployment != group[1] || res.Attempts != 2 || res.FailoverReason != provider.Transport {
		t.Errorf("expected b after a timed out, no hedge; got %v %q after %d (%v)", res.Deployment, res.Hedge, res.Attempts, res.FailoverReason)
	}
}
