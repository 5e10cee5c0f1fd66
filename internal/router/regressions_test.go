package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Regressions the suite once missed (issue 18): each test fails with the
// bug it names.

// A stream that ends ([DONE]) before any content is no answer: the
// deployment failed (class server), and the next one answers. (Bug: the
// empty stream counted as a success, the client got an empty 200.)
func TestAStreamWithoutContentFailsOver(t *testing.T) {
	empty := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, "data: [DONE]\n\n", "Content-Type", "text/event-stream")}}
	sse := "data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	full := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, sse, "Content-Type", "text/event-stream")}}
	group := []*Deployment{deployment("empty", empty), deployment("full", full)}
	group[0].Quality = 1
	r := newRouter(newFakeClock())
	res := r.Serve(context.Background(), group, &Request{Request: wire([]byte(`{"model":"fast","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true), Tokens: 10})
	if res.Err != nil || res.Deployment != group[1] || res.Stream == nil || res.Attempts != 2 || res.FailoverReason != provider.Server {
		t.Fatalf("expected the empty stream failed over to full, got %+v %v", res, res.Err)
	}
	res.Stream.Close()
	if snap := group[0].State.Snapshot(time.Now()); snap.LastClass == nil || *snap.LastClass != provider.Server || snap.LastMessage != "stream ended before any content" {
		t.Errorf("expected the empty stream recorded as a server failure, got %+v", snap)
	}
}

// A deployment that cannot express the request (n > 1 to Anthropic) is
// left out, without an attempt, and the one that can answers at once.
// (Bug: it was tried, and its 400 went to the client.)
func TestADeploymentThatCannotExpressTheRequestIsSkipped(t *testing.T) {
	an := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, `{"type":"message"}`)}}
	oa := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	claude := deployment("claude", an)
	claude.Provider = &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://claude.invalid/v1", APIKey: "sk-ant"}}
	claude.Quality = 1
	group := []*Deployment{claude, deployment("gpt", oa)}
	req := &Request{Request: wire([]byte(`{"model":"fast","n":2,"messages":[{"role":"user","content":"hi"}]}`), false), Tokens: 10}
	req.Choices = 2
	res := within(t, func() *Result { return newRouter(newFakeClock()).Serve(context.Background(), group, req) })
	if res.Err != nil || res.Deployment != group[1] || res.Attempts != 1 || an.calls.Load() != 0 || oa.calls.Load() != 1 {
		t.Errorf("expected gpt at once and claude never asked, got %+v %v (claude %d calls)", res, res.Err, an.calls.Load())
	}
	// Alone, it answers the client 400 with why, and sends nothing.
	res = within(t, func() *Result { return newRouter(newFakeClock()).Serve(context.Background(), group[:1], req) })
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 400 || an.calls.Load() != 0 || res.Attempts != 0 {
		t.Errorf("expected a 400 without an attempt, got %+v %v", res, res.Err)
	}
}

// The deadline is checked before every attempt: a transport that ignores
// cancellation and answers past the deadline is not followed by another
// attempt, and the client gets the 504. (Bug: the next deployment
// answered 200, after the deadline.)
func TestNoAttemptStartsPastTheDeadline(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	r.Deadline = 10 * time.Second
	slow := &script{replies: []func(*http.Request) (*http.Response, error){func(req *http.Request) (*http.Response, error) {
		clock.Advance(11 * time.Second) // past the deadline, and deaf to its cancellation
		return reply(503, `{"error":{"message":"overloaded"}}`)(req)
	}}}
	fast := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("slow", slow), deployment("fast", fast)}
	group[0].Quality = 1
	group[0].Timeout, group[1].Timeout = time.Minute, time.Minute
	res := r.Serve(context.Background(), group, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != http.StatusGatewayTimeout || fast.calls.Load() != 0 {
		t.Errorf("expected a 504 and no attempt on fast, got %+v %v (fast %d calls)", res, res.Err, fast.calls.Load())
	}
}

// within runs serve, and fails the test with a message rather than hanging
// it when serve does not return within 10 s (real time: the router's own
// clock is fake).
func within(t *testing.T, serve func() *Result) *Result {
	t.Helper()
	done := make(chan *Result, 1)
	go func() { done <- serve() }()
	select {
	case res := <-done:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("the router did not return within 10 s: it loops (on a deployment it cannot plan for, or cannot acquire)")
		return nil
	}
}

// An answer over 32 MiB is no answer: the deployment failed, the next one
// answers.
func TestAnAnswerTooLargeFailsOver(t *testing.T) {
	huge := `{"id":"x","object":"chat.completion","model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("a", maxResponseBody) + `"},"finish_reason":"stop"}]}`
	big := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, huge)}}
	ok := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("big", big), deployment("ok", ok)}
	group[0].Quality = 1
	res := newRouter(newFakeClock()).Serve(context.Background(), group, chatReq)
	if res.Err != nil || res.Deployment != group[1] || res.Attempts != 2 || res.FailoverReason != provider.Server {
		t.Fatalf("expected the 32 MiB answer failed over, got %+v %v", res.Deployment, res.Err)
	}
	if snap := group[0].State.Snapshot(time.Now()); snap.LastMessage != "answer larger than 32 MiB" {
		t.Errorf("big: %q", snap.LastMessage)
	}
}

// A client that leaves while its request waits in the queue gets
// ErrClientGone at once, out of the queue, its place given up.
func TestAClientLeavingWhileItWaits(t *testing.T) {
	r, g, _, c := limitedGroup(t)
	for range 10 { // spend the window: the next request waits for the next one
		r.ServeGroup(context.Background(), g, chatReq)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Result, 1)
	go func() { done <- r.ServeGroup(ctx, g, chatReq) }()
	for i := 0; g.Queued() == 0; i++ {
		if i > 1000 {
			t.Fatal("the request never queued")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case res := <-done:
		if !errors.Is(res.Err, ErrClientGone) || res.Attempts != 0 || g.Queued() != 0 {
			t.Errorf("expected ErrClientGone, no attempt, the queue empty; got %+v %v (%d queued)", res, res.Err, g.Queued())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the request did not return when its client left (clock at %v)", c.Now())
	}
}

// A client that cannot take the stream any more (its write failed): the
// relay ends with that error, the upstream body is closed and the
// deployment's claim released.
func TestARelayWriteErrorReleasesTheStream(t *testing.T) {
	sse := "data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	body := &closeCounter{r: strings.NewReader(sse)}
	s := &script{replies: []func(*http.Request) (*http.Response, error){func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: body, Request: req}, nil
	}}}
	d := deployment("s", s)
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, &Request{Request: wire([]byte(`{"model":"fast","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true), Tokens: 10})
	if res.Stream == nil {
		t.Fatalf("%+v %v", res, res.Err)
	}
	broken := errors.New("client connection reset")
	if err := res.Stream.Relay(func(provider.Event, bool) error { return broken }); !errors.Is(err, broken) {
		t.Errorf("relay: %v", err)
	}
	if body.closed.Load() == 0 || d.State.Snapshot(time.Now()).InFlight != 0 {
		t.Errorf("expected the upstream closed and the claim released: closed %d, in flight %d", body.closed.Load(), d.State.Snapshot(time.Now()).InFlight)
	}
}

type closeCounter struct {
	r      io.Reader
	closed atomic.Int32
}

func (c *closeCounter) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *closeCounter) Close() error               { c.closed.Add(1); return nil }
