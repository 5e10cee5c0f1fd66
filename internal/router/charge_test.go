package router

import (
	"context"
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// chargeCase is one deployment at gpt-4o's prices ($2.50 in, $10 out per
// 1M tokens) with a budget, in a group with one, and a streamed request
// of 1,000 prompt tokens and max_tokens 200 whose provider states its
// usage in the last chunk only (OpenAI's include_usage).
func chargeCase(body func(*http.Request) (*http.Response, error)) (*Router, *Group, *Request) {
	d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){body}})
	d.CostInput, d.CostOutput = 2.5, 10
	d.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 100, Period: time.Hour}, nil, "a")
	g := &Group{Name: "fast", Deployments: []*Deployment{d},
		Spending: capacity.NewSpending(capacity.SpendLimit{USD: 100, Period: time.Hour}, nil, "fast")}
	req := &Request{Request: wire([]byte(`{"model":"fast","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}`), true),
		Tokens: 1200, PromptTokens: 1000, OutputTokens: 200}
	r := newRouter(newFakeClock())
	r.Resume = ResumeOff
	return r, g, req
}

// spentOn checks what d's usage, d's budget and g's budget counted.
func spentOn(t *testing.T, now time.Time, g *Group, answers, input, output int64, usd float64) {
	t.Helper()
	d := g.Deployments[0]
	total := d.State.Usage(now).Total
	if total.Answers != answers || total.InputTokens != input || total.OutputTokens != output || math.Abs(total.CostUSD-usd) > 1e-9 {
		t.Errorf("usage: %d answers, %d in, %d out, %.6f USD; want %d, %d, %d, %.6f",
			total.Answers, total.InputTokens, total.OutputTokens, total.CostUSD, answers, input, output, usd)
	}
	for _, s := range []*capacity.Spending{d.Spending, g.Spending} {
		if got := s.Report(now).SpentUSD; math.Abs(got-usd) > 1e-9 {
			t.Errorf("budget spent %.6f USD, want %.6f", got, usd)
		}
	}
}

// Ten streams whose clients leave after the first chunk: the provider
// billed each prompt and, not knowing the client left until the router
// closed the connection, may have generated up to max_tokens: each is
// charged 1,000 input and 200 output tokens, $0.0045, in the
// deployment's usage, its budget and the group's, and the stream's own
// usage (the access log's) says the same.
func TestAbandonedStreamsAreCharged(t *testing.T) {
	const each = (1000*2.5 + 200*10) / 1e6
	usage := `data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":40,"total_tokens":1040}}`
	r, g, req := chargeCase(sse(chunk, chunk, chunk, final, usage, "data: [DONE]"))
	g.Deployments[0].State.Declare(0, 100000) // a token window of 100,000 a minute
	gone := errors.New("client went away")
	for i := range 10 {
		res := r.ServeGroup(context.Background(), g, req)
		if res.Stream == nil {
			t.Fatalf("stream %d: no stream: %v", i, res.Err)
		}
		sent := 0
		err := res.Stream.Relay(func(ev provider.Event, done bool) error {
			if sent++; sent > 1 {
				return gone
			}
			return nil
		})
		if !errors.Is(err, gone) {
			t.Fatalf("stream %d: expected the client's error, got %v", i, err)
		}
		u, ok := res.Stream.Usage()
		if cost := g.Deployments[0].Cost(u); !ok || u.InputTokens != 1000 || u.OutputTokens != 200 || math.Abs(cost-each) > 1e-9 {
			t.Errorf("stream %d: usage %+v (%v), cost %.6f USD; want 1000 in, 200 out, %.6f", i, u, ok, cost, each)
		}
	}
	spentOn(t, r.Clock.Now(), g, 10, 10000, 2000, 10*each)
	// The token window keeps what admission charged: prompt and max_tokens.
	if snap := g.Deployments[0].State.Snapshot(r.Clock.Now()); snap.TokensLastMinute != 10*1200 {
		t.Errorf("declared token window: %d tokens counted in the minute, want %d", snap.TokensLastMinute, 10*1200)
	}
}

// A stream that broke after its first chunk (cut, an error event) ended
// on the provider's side: it is charged its prompt and what it relayed
// (one chunk of "Hi": at least one token), not max_tokens.
func TestBrokenStreamIsChargedWhatItRelayed(t *testing.T) {
	const want = (1000*2.5 + 1*10) / 1e6
	for name, body := range map[string]func(*http.Request) (*http.Response, error){
		"cut":         reply(200, chunk+"\n\n"+`data: {"id":"c","obj`, "Content-Type", "text/event-stream"),
		"error event": sse(chunk, `data: {"error":{"message":"boom","type":"server_error","param":null,"code":null}}`),
	} {
		r, g, req := chargeCase(body)
		res := r.ServeGroup(context.Background(), g, req)
		if res.Stream == nil {
			t.Fatalf("%s: no stream: %v", name, res.Err)
		}
		_, err := relay(t, res.Stream)
		var se *StreamError
		if !errors.As(err, &se) {
			t.Fatalf("%s: expected a StreamError, got %v", name, err)
		}
		if u, ok := res.Stream.Usage(); !ok || u.InputTokens != 1000 || u.OutputTokens != 1 {
			t.Errorf("%s: stream usage %+v (%v), want 1000 in, 1 out", name, u, ok)
		}
		t.Run(name, func(t *testing.T) { spentOn(t, r.Clock.Now(), g, 1, 1000, 1, want) })
	}
}

// A stream that completed is charged what its provider stated, no more.
func TestCompletedStreamIsChargedAsStated(t *testing.T) {
	usage := `data: {"id":"c","object":"chat.completion.chunk","model":"up","choices":[],"usage":{"prompt_tokens":900,"completion_tokens":3,"total_tokens":903}}`
	r, g, req := chargeCase(sse(chunk, final, usage, "data: [DONE]"))
	res := r.ServeGroup(context.Background(), g, req)
	if _, err := relay(t, res.Stream); err != nil {
		t.Fatal(err)
	}
	spentOn(t, r.Clock.Now(), g, 1, 900, 3, (900*2.5+3*10)/1e6)
}

// A native Messages stream states its input in message_start (cache reads
// included): a client that leaves after the first text is charged that
// input, exact, at its prices, and max_tokens of output.
func TestAbandonedNativeStreamKeepsStatedInput(t *testing.T) {
	start := "event: message_start\ndata: " + `{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude","content":[],"usage":{"input_tokens":20,"cache_read_input_tokens":980,"output_tokens":1}}}`
	block := "event: content_block_start\ndata: " + `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	delta := "event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`
	r, g, req := chargeCase(sse(start, block, delta, delta, delta))
	d := g.Deployments[0]
	d.Provider = &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://a.invalid/v1", APIKey: "sk-ant"}}
	d.CostCached = 0.25
	req.Request = &provider.Request{Format: provider.Messages, Stream: true, Choices: 1,
		Body: []byte(`{"model":"fast","max_tokens":200,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)}
	req.PromptTokens = 700 // the estimate: the stated input wins
	res := r.ServeGroup(context.Background(), g, req)
	if res.Stream == nil {
		t.Fatalf("no stream: %v", res.Err)
	}
	gone := errors.New("client went away")
	sent := 0
	_ = res.Stream.Relay(func(ev provider.Event, done bool) error {
		if sent++; sent > 3 { // message_start, content_block_start, the first text
			return gone
		}
		return nil
	})
	want := (20*2.5 + 980*0.25 + 200*10) / 1e6
	spentOn(t, r.Clock.Now(), g, 1, 1000, 200, want)
}
