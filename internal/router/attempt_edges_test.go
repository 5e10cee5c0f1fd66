package router

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// okScriptE is a fake provider that answers every attempt with okBody.
func okScriptE() *script {
	return &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
}

// serveAsyncE serves req from group in its own goroutine.
func serveAsyncE(r *Router, group []*Deployment, req *Request) chan *Result {
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), group, req) }()
	return done
}

// thirdParty is a provider type of a third party that states no facts of
// its own (embedding the interface hides the adapter's).
type thirdParty struct{ provider.Provider }

// namedThirdParty is a third party's type that names its system in traces.
type namedThirdParty struct {
	provider.Provider
	name string
}

func (n namedThirdParty) GenAIProviderName() string { return n.name }

// A span names the provider system as its type states it (the semantic
// conventions' name: azure is azure.ai.openai; a third party's own), or by
// the type's name when it states none; a failed attempt says no finish
// reasons.
func TestSpanProviderNames(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	failing := func() *script {
		return &script{replies: []func(*http.Request) (*http.Response, error){reply(500, `{"error":{"message":"boom","type":"server_error"}}`)}}
	}
	group := []*Deployment{deployment("a", failing()), deployment("b", failing()), deployment("c", okScriptE())}
	group[0].Provider = &adapters.Azure{Endpoint: provider.Endpoint{BaseURL: "http://a.invalid/openai"}}
	group[1].Provider = namedThirdParty{group[1].Provider, "acme.cloud"}
	group[2].Provider = thirdParty{group[2].Provider}
	group[0].Quality, group[1].Quality = 1, 0.5
	group[0].ProviderType, group[1].ProviderType, group[2].ProviderType = "azure", "acme", "acme"
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	if res := newRouter(newFakeClock()).Serve(ctx, group, chatReq); res.Err != nil || res.Deployment != group[2] {
		t.Fatalf("expected c to answer, got %+v", res)
	}
	parent.End()
	spans := exp.GetSpans().Snapshots()
	if len(spans) != 4 {
		t.Fatalf("%d spans", len(spans))
	}
	for i, want := range []string{"azure.ai.openai", "acme.cloud", "acme"} {
		if got := spanAttrs(spans[i])["gen_ai.provider.name"].AsString(); got != want {
			t.Errorf("attempt %d: expected gen_ai.provider.name %q, got %q", i+1, want, got)
		}
	}
	if v, ok := spanAttrs(spans[0])["gen_ai.response.finish_reasons"]; ok {
		t.Errorf("the failed attempt has no finish reasons, got %v", v.AsStringSlice())
	}
}

// A hedge's span counts it as the request's second attempt.
func TestHedgeSpanIsTheSecondAttempt(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	c := newFakeClock()
	slow := newGate(reply(200, okBody))
	a := &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
	da, db := deployment("a", a), deployment("b", okScriptE())
	da.Quality = 1
	r, _ := hedgeRouter(c)
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(ctx, []*Deployment{da, db}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	if res := <-done; res.Deployment != db || res.Hedge != HedgeWon {
		t.Fatalf("expected the hedge on b to win, got %v %q", res.Deployment, res.Hedge)
	}
	eventually(t, "a cancelled", func() bool { return slow.cancelled.Load() == 1 })
	parent.End()
	numbers := map[string]int64{}
	for _, s := range exp.GetSpans().Snapshots() {
		if at := spanAttrs(s); at["llm_router.deployment"].AsString() != "" {
			numbers[at["llm_router.deployment"].AsString()] = at["llm_router.attempt"].AsInt64()
		}
	}
	if numbers["a"] != 1 || numbers["b"] != 2 {
		t.Errorf("expected a attempt 1 and its hedge b attempt 2, got %v", numbers)
	}
}

// A stream's deployment with no ttft_timeout is bounded by its timeout
// until the first content: past it, the next deployment streams.
func TestStreamWithoutTTFTTimeoutUsesTheTimeout(t *testing.T) {
	c := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){hang}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, final, "data: [DONE]")}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Quality, group[0].TTFTTimeout, group[0].Timeout = 1, 0, 10*time.Second
	r := newRouter(c)
	r.Deadline = time.Minute
	done := serveAsyncE(r, group, &Request{Request: wire(chatReq.Body, true), Tokens: 10})
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(10 * time.Second)
	eventually(t, "b's attempt after a's timeout", func() bool { return b.calls.Load() == 1 })
	res := <-done
	if res.Stream == nil || res.Deployment != group[1] || res.Attempts != 2 || res.FailoverReason != provider.Transport {
		t.Fatalf("expected b's stream after a timed out, got %v %v", res.Deployment, res.Err)
	}
	res.Stream.Close()
	if msg := group[0].State.Snapshot(c.Now()).LastMessage; msg != errAttemptTimeout.Error() {
		t.Errorf("expected a's failure to say %q, got %q", errAttemptTimeout, msg)
	}
}

// A deployment without a timeout of its own (0) is bounded by the request's
// deadline alone: its attempt is not cut before it, and running into the
// deadline is a 504. An attempt that hung for the whole deadline failed
// as a timeout would have (see TestAnAttemptCutByTheDeadlineTeachesItsLatency):
// it counts against the deployment. The same when its timeout ends
// exactly at the deadline.
func TestNoTimeoutMeansTheDeadline(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Minute} {
		c := newFakeClock()
		a := &script{replies: []func(*http.Request) (*http.Response, error){hang}}
		b := okScriptE()
		group := []*Deployment{deployment("a", a), deployment("b", b)}
		group[0].Quality, group[0].Timeout = 1, timeout
		r := newRouter(c)
		r.Deadline = time.Minute
		done := serveAsyncE(r, group, chatReq)
		eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
		c.Advance(time.Second)
		c.Advance(59 * time.Second)
		res := <-done
		var e *Error
		if !errors.As(res.Err, &e) || e.Status != http.StatusGatewayTimeout || res.FailoverReason != provider.OK {
			t.Errorf("timeout %v: expected a 504 at the deadline, got %v (%v)", timeout, res.Err, res.FailoverReason)
		}
		if s := group[0].State.Snapshot(c.Now()); s.ConsecutiveFailures != 1 || s.LastMessage != errRequestTimeout.Error() {
			t.Errorf("timeout %v: a hang for the whole deadline is a's failure, got %d failures (%q)", timeout, s.ConsecutiveFailures, s.LastMessage)
		}
	}
}

// errBodyE is a response body that fails as it is read: after its bytes,
// if any.
type errBodyE struct{ r io.Reader }

func (b *errBodyE) Read(p []byte) (int, error) {
	if n, _ := b.r.Read(p); n > 0 {
		return n, nil
	}
	return 0, errors.New("connection reset by peer")
}
func (b *errBodyE) Close() error { return nil }

// An error status whose body cannot be read at all is a transport failure
// (whatever the status); a partial body is read for what it says; an empty
// one that reads cleanly is the status's class.
func TestErrorBodies(t *testing.T) {
	for name, tc := range map[string]struct {
		status int
		body   string
		broken bool
		want   provider.Class
	}{
		"unreadable": {503, "", true, provider.Transport},
		"partial":    {429, rateLimited, true, provider.RateLimited},
		"empty":      {500, "", false, provider.Server},
	} {
		a := &script{replies: []func(*http.Request) (*http.Response, error){func(req *http.Request) (*http.Response, error) {
			var body io.ReadCloser = io.NopCloser(strings.NewReader(tc.body))
			if tc.broken {
				body = &errBodyE{strings.NewReader(tc.body)}
			}
			return &http.Response{StatusCode: tc.status, Header: http.Header{"Content-Type": {"application/json"}}, Body: body, Request: req}, nil
		}}}
		group := []*Deployment{deployment("a", a), deployment("b", okScriptE())}
		group[0].Quality = 1
		res := newRouter(newFakeClock()).Serve(context.Background(), group, chatReq)
		if res.Err != nil || res.Deployment != group[1] || res.FailoverReason != tc.want {
			t.Errorf("%s: expected b's answer after a %v failure, got %v %v (%v)", name, tc.want, res.Deployment, res.Err, res.FailoverReason)
		}
	}
}

// wholeAnswerE is a provider type whose plans answer with okBody for
// whatever answer they read (so that a huge answer costs no parse), and
// note how long it was.
type wholeAnswerE struct {
	provider.Provider
	got *atomic.Int64
}

type wholePlanE struct {
	provider.Plan
	got *atomic.Int64
}

func (p wholePlanE) Answer(body []byte) ([]byte, error) {
	p.got.Store(int64(len(body)))
	return []byte(okBody), nil
}

func (w wholeAnswerE) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	p, err := w.Provider.Plan(ctx, model, r)
	return wholePlanE{p, w.got}, err
}

// An answer of exactly 32 MiB is still an answer: read whole, translated.
func TestAnAnswerOfExactly32MiB(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, strings.Repeat(" ", maxResponseBody))}}
	d := deployment("a", a)
	var got atomic.Int64
	d.Provider = wholeAnswerE{d.Provider, &got}
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, chatReq)
	if res.Err != nil || res.Status != 200 || res.Attempts != 1 || got.Load() != maxResponseBody {
		t.Fatalf("expected the 32 MiB answer (%d bytes read), got %v after %d attempts", got.Load(), res.Err, res.Attempts)
	}
}

// A stream that ends before any content failed for an unexpected end, as
// its deployment's state says.
func TestAStreamEndingWithoutContentSaysSo(t *testing.T) {
	a := &script{replies: []func(*http.Request) (*http.Response, error){sse(": keep-alive")}}
	group := []*Deployment{deployment("a", a), deployment("b", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk, final, "data: [DONE]")}})}
	group[0].Quality = 1
	c := newFakeClock()
	res := newRouter(c).Serve(context.Background(), group, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil || res.Deployment != group[1] {
		t.Fatalf("expected b's stream, got %v", res.Err)
	}
	res.Stream.Close()
	if msg := group[0].State.Snapshot(c.Now()).LastMessage; msg != io.ErrUnexpectedEOF.Error() {
		t.Errorf("expected a's failure %q, got %q", io.ErrUnexpectedEOF, msg)
	}
}

// Exactly the bound (1 MiB) held before the first content is allowed.
func TestPendingExactlyAtTheBound(t *testing.T) {
	a := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){sse(chunk)}})
	a.Provider = scriptedStream{a.Provider, func() *fakeStream {
		return &fakeStream{
			events: []provider.Event{{Name: "ping", Data: bytes.Repeat([]byte("x"), maxPending)}, {Data: []byte(`{"choices":[]}`)}},
			kinds:  []provider.EventKind{provider.EventSkip, provider.EventData},
		}
	}}
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{a}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected the stream committed with %d bytes held, got %v", maxPending, res.Err)
	}
	res.Stream.Close()
}
