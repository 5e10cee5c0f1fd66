package router

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// spanAttrs is a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// Each upstream attempt of a traced request is a client span, a child of
// the request's, with the GenAI semantic conventions' attributes and the
// router's: the rate-limited first attempt is an error of type
// rate_limited; the second says it fails over from it, and what the
// answer used and why it finished. A streamed answer's span ends with the
// stream, with its usage.
func TestAttemptsAreTraced(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	const answered = `{"id":"x","object":"chat.completion","model":"up-2025","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}}`
	limited := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "20")}}
	ok := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, answered)}}
	group := []*Deployment{deployment("a", limited), deployment("b", ok)}
	group[0].Quality, group[0].ProviderType, group[1].ProviderType = 1, "openai", "acme"
	group[1].Provider = thirdParty{group[1].Provider} // named by its type
	r := newRouter(newFakeClock())

	ctx, parent := tp.Tracer("test").Start(context.Background(), "POST /v1/chat/completions")
	if res := r.Serve(ctx, group, chatReq); res.Err != nil || res.Deployment != group[1] {
		t.Fatalf("%+v", res)
	}
	parent.End()
	spans := exp.GetSpans().Snapshots()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want the request's and two attempts'", len(spans))
	}
	first, second := spans[0], spans[1]
	for i, s := range []sdktrace.ReadOnlySpan{first, second} {
		if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindClient || s.Name() != "chat "+group[i].Model {
			t.Errorf("span %d: %q kind %v parent %v", i, s.Name(), s.SpanKind(), s.Parent().SpanID())
		}
	}
	a, b := spanAttrs(first), spanAttrs(second)
	if a["gen_ai.operation.name"].AsString() != "chat" || a["gen_ai.provider.name"].AsString() != "openai" ||
		a["gen_ai.request.model"].AsString() != "a-up" || a["llm_router.deployment"].AsString() != "a" ||
		a["llm_router.attempt"].AsInt64() != 1 || a["error.type"].AsString() != "rate_limited" ||
		a["server.address"].AsString() != "a.invalid" || a["server.port"].AsInt64() != 80 || first.Status().Code != codes.Error {
		t.Errorf("first attempt: %v %v", a, first.Status())
	}
	if _, ok := a["llm_router.failover_reason"]; ok {
		t.Error("the first attempt fails over from nothing")
	}
	if b["gen_ai.provider.name"].AsString() != "acme" || b["llm_router.attempt"].AsInt64() != 2 ||
		b["llm_router.failover_reason"].AsString() != "rate_limited" || b["gen_ai.usage.input_tokens"].AsInt64() != 12 ||
		b["gen_ai.usage.output_tokens"].AsInt64() != 5 || b["llm_router.usage.cached_input_tokens"].AsInt64() != 8 ||
		!slices.Equal(b["gen_ai.response.finish_reasons"].AsStringSlice(), []string{"stop"}) ||
		b["gen_ai.response.model"].AsString() != "up-2025" || second.Status().Code == codes.Error {
		t.Errorf("second attempt: %v", b)
	}
	if _, ok := b["error.type"]; ok {
		t.Error("the answered attempt has no error type")
	}

	// A stream: its span ends when it was relayed, with its usage.
	exp.Reset()
	sse := "data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n" +
		"data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"model\":\"up\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n"
	streaming := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, sse, "Content-Type", "text/event-stream")}}
	d := deployment("c", streaming)
	ctx, parent = tp.Tracer("test").Start(context.Background(), "request")
	res := r.Serve(ctx, []*Deployment{d}, &Request{Request: wire([]byte(`{"model":"fast","stream":true,"messages":[{"role":"user","content":"hi"}]}`), true), Tokens: 10})
	if res.Stream == nil {
		t.Fatalf("%+v", res)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans ended before the stream was relayed", n)
	}
	var relayed []string
	if err := res.Stream.Relay(func(ev provider.Event, done bool) error { relayed = append(relayed, string(ev.Data)); return nil }); err != nil {
		t.Fatal(err)
	}
	parent.End()
	spans = exp.GetSpans().Snapshots()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	c := spanAttrs(spans[0])
	if c["gen_ai.usage.output_tokens"].AsInt64() != 7 || !slices.Equal(c["gen_ai.response.finish_reasons"].AsStringSlice(), []string{"length"}) ||
		c["llm_router.stream"].AsBool() != true {
		t.Errorf("stream span: %v", c)
	}
	if u, ok := res.Stream.Usage(); !ok || u.OutputTokens != 7 || d.State.Usage(r.Clock.Now()).Total.OutputTokens != 7 {
		t.Errorf("stream usage %+v %v; recorded %+v", u, ok, d.State.Usage(r.Clock.Now()))
	}
	for _, ev := range relayed {
		if strings.Contains(ev, `"usage"`) {
			t.Errorf("the client did not ask for usage, got %s", ev)
		}
	}

	// Without a request span: no spans at all.
	exp.Reset()
	if res := r.Serve(context.Background(), []*Deployment{deployment("d", ok)}, chatReq); res.Err != nil {
		t.Fatal(res.Err)
	}
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans of an untraced request", n)
	}
}

// A deployment whose budget its answers spent is out until the budget
// renews, as a spent quota: the next request goes to another deployment
// at once. A group whose budget is spent answers 429 until it renews,
// with no attempt.
func TestBudgets(t *testing.T) {
	const costly = `{"id":"x","object":"chat.completion","model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000000,"completion_tokens":0}}`
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, costly)}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, costly)}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Quality = 1
	group[0].CostInput, group[1].CostInput = 2, 2 // $2 per 1M input tokens: each answer costs $2
	clock := newFakeClock()
	group[0].Spending = capacity.NewSpending(capacity.SpendLimit{USD: 3, Period: time.Hour}, nil, "a")
	g := NewGroup("g", group)
	g.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 7, Period: time.Hour}, nil, "g")
	r := newRouter(clock)
	for i, want := range []string{"a", "a", "b"} {
		res := r.ServeGroup(context.Background(), g, chatReq)
		if res.Err != nil || res.Deployment.Name != want || res.Attempts != 1 {
			t.Fatalf("request %d: %+v, want %s at once", i, res, want)
		}
	}
	snap := group[0].State.Snapshot(clock.Now())
	if !snap.BudgetSpentUntil.Equal(time.Date(2025, 8, 21, 13, 0, 0, 0, time.UTC)) || *snap.LastClass != provider.QuotaExhausted ||
		!strings.Contains(snap.LastMessage, "budget of $3 per 1h spent") || snap.Circuit != capacity.Closed {
		t.Errorf("a after its budget: %+v", snap)
	}
	// Raised (a reload): a is back at the next request.
	group[0].Spending.SetLimit(capacity.SpendLimit{USD: 100, Period: time.Hour})
	if res := r.ServeGroup(context.Background(), g, chatReq); res.Err != nil || res.Deployment.Name != "a" {
		t.Fatalf("raised budget: %+v %v", res, res.Err)
	}
	group[0].Spending.SetLimit(capacity.SpendLimit{USD: 3, Period: time.Hour}) // spent again: $6 of 3
	// $8 spent of the group's $7: 429 until the hour ends, nothing sent.
	calls := a.calls.Load() + b.calls.Load()
	res := r.ServeGroup(context.Background(), g, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != 429 || e.Class != provider.QuotaExhausted || e.RetryAfter <= 0 || e.RetryAfter > time.Hour ||
		!strings.Contains(e.Message, "model group g: budget of $7") || a.calls.Load()+b.calls.Load() != calls {
		t.Errorf("group over budget: %+v %v", res, res.Err)
	}
	if sp := g.Spending.Report(clock.Now()); sp.SpentUSD != 8 {
		t.Errorf("group spent %+v", sp)
	}
	// The next window: both serve again.
	clock.Advance(time.Hour)
	if res := r.ServeGroup(context.Background(), g, chatReq); res.Err != nil || res.Deployment.Name != "a" {
		t.Errorf("next window: %+v %v", res, res.Err)
	}
}

// An answer's cost: uncached input at CostInput, cached at CostCached,
// output at CostOutput, per 1M tokens.
func TestCost(t *testing.T) {
	d := &Deployment{CostInput: 2, CostCached: 0.5, CostOutput: 8}
	if got := d.Cost(provider.Usage{InputTokens: 100, CachedInputTokens: 60, OutputTokens: 10}); got != (40*2+60*0.5+10*8)/1e6 {
		t.Errorf("cost %v", got)
	}
	if got := d.Cost(provider.Usage{InputTokens: 5, CachedInputTokens: 50}); got != 5*0.5/1e6 {
		t.Errorf("cached more than input (a provider's odd count): %v", got)
	}
}
