package router

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// budgetBody answers 100 prompt and 80 output tokens: $0.005 at
// budgetDeployment's prices, its worst case (max_tokens 80) too.
const budgetBody = `{"id":"x","object":"chat.completion","model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":80,"total_tokens":180}}`

var budgetReq = &Request{Request: wire([]byte(`{"model":"paid","max_tokens":80,"messages":[{"role":"user","content":"hi"}]}`), false),
	Tokens: 180, PromptTokens: 100, OutputTokens: 80}

// budgetDeployment prices 1M input tokens at $10 and 1M output at $50.
func budgetDeployment(name string, rt http.RoundTripper) *Deployment {
	d := deployment(name, &script{})
	d.Transport, d.CostInput, d.CostOutput = rt, 10, 50
	d.State.Declare(10000, 0) // bounded: no slow start's four at a time
	return d
}

// heldGate is a fake provider that holds each attempt until opened, counting
// the attempts that reached it.
type heldGate struct {
	calls atomic.Int32
	open  chan struct{}
}

func (g *heldGate) RoundTrip(req *http.Request) (*http.Response, error) {
	g.calls.Add(1)
	select {
	case <-g.open:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return reply(200, budgetBody)(req)
}

// serveConcurrently serves n requests at once through serve; once n of
// them have reached the provider or been answered, the provider answers.
func serveConcurrently(t *testing.T, n int, g *heldGate, serve func() *Result) []*Result {
	t.Helper()
	var answered atomic.Int32
	results := make([]*Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = serve()
			answered.Add(1)
		})
	}
	for deadline := time.Now().Add(10 * time.Second); answered.Load()+g.calls.Load() < int32(n); {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %d answered, %d at the provider", answered.Load(), g.calls.Load())
		}
		time.Sleep(time.Millisecond)
	}
	close(g.open)
	wg.Wait()
	return results
}

// checkBudgetRefusals checks that the results are served answers and
// refusals naming the budget, told at once: 429 quota_exhausted with a
// Retry-After until the budget renews and no attempt.
func checkBudgetRefusals(t *testing.T, results []*Result, served int, renews time.Duration) {
	t.Helper()
	ok := 0
	for _, res := range results {
		var e *Error
		switch {
		case res.Err == nil && res.Status == 200:
			ok++
		case errors.As(res.Err, &e) && e.Status == 429 && res.Attempts == 0:
			if !strings.Contains(e.Message, "budget of $0.01 per 1h") {
				t.Errorf("expected the refusal to name the budget, got %q", e.Message)
			}
			if e.RetryAfter != renews {
				t.Errorf("expected Retry-After %v (the budget's renewal), got %v", renews, e.RetryAfter)
			}
		default:
			t.Errorf("expected 200 or a 429 without attempts, got %d %v after %d attempts", res.Status, res.Err, res.Attempts)
		}
	}
	if ok != served {
		t.Errorf("expected %d served, got %d", served, ok)
	}
}

// A group's budget of $0.01 per 1h and 8 concurrent requests whose worst
// case (and answer) costs $0.005: each attempt holds its worst case before
// it is sent, so exactly 2 reach the provider and $0.01 is spent; the
// others are told at once (the budget renews at 13:00, after their
// deadline), with no wait on the clock.
func TestBudgetHeldBeforeDispatch(t *testing.T) {
	clock := newFakeClock() // 12:40
	r := newRouter(clock)
	g := &heldGate{open: make(chan struct{})}
	grp := NewGroup("paid", []*Deployment{budgetDeployment("a", g)})
	grp.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 0.01, Period: time.Hour}, nil, "group|paid")

	results := serveConcurrently(t, 8, g, func() *Result { return r.ServeGroup(context.Background(), grp, budgetReq) })
	if n := g.calls.Load(); n != 2 {
		t.Errorf("expected exactly 2 upstream calls, got %d", n)
	}
	checkBudgetRefusals(t, results, 2, 20*time.Minute)
	if rep := grp.Spending.Report(clock.Now()); rep.SpentUSD < 0.01-1e-12 || rep.SpentUSD > 0.01+1e-12 || rep.HeldUSD != 0 {
		t.Errorf("expected $0.01 spent and nothing held, got %+v", rep)
	}
	if s := clock.Sleeps(); len(s) != 0 {
		t.Errorf("expected no waits, got %v", s)
	}
}

// A deployment's budget holds alike: of 8 concurrent requests, 2 reach it.
func TestDeploymentBudgetHeldBeforeDispatch(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	g := &heldGate{open: make(chan struct{})}
	d := budgetDeployment("a", g)
	d.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 0.01, Period: time.Hour}, nil, "deployment|a")
	grp := NewGroup("paid", []*Deployment{d})

	results := serveConcurrently(t, 8, g, func() *Result { return r.ServeGroup(context.Background(), grp, budgetReq) })
	if n := g.calls.Load(); n != 2 {
		t.Errorf("expected exactly 2 upstream calls, got %d", n)
	}
	served := 0
	for _, res := range results {
		var e *Error
		if res.Err == nil {
			served++
		} else if !errors.As(res.Err, &e) || e.Status != 429 || !strings.Contains(e.Message, "budget") {
			t.Errorf("expected a 429 naming the budget, got %v", res.Err)
		}
	}
	if served != 2 {
		t.Errorf("expected 2 served, got %d", served)
	}
}

// A request whose hold fits only after the budget renews, before its
// deadline, waits for the renewal and is served then; one whose deadline
// comes first is told at once.
func TestBudgetWaitsForItsRenewal(t *testing.T) {
	clock := newFakeClock()
	clock.Advance(19*time.Minute + 50*time.Second) // 12:59:50, 10 s before the renewal
	r := newRouter(clock)
	s := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, budgetBody)}}
	grp := NewGroup("paid", []*Deployment{budgetDeployment("a", s)})
	grp.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 0.01, Period: time.Hour}, nil, "group|paid")
	grp.Spending.Add(clock.Now(), 0.008) // $0.002 left: not enough for $0.005

	r.Deadline = 5 * time.Second
	res := r.ServeGroup(context.Background(), grp, budgetReq)
	checkBudgetRefusals(t, []*Result{res}, 0, 10*time.Second)
	if n := s.calls.Load(); n != 0 {
		t.Errorf("expected no upstream call before the renewal, got %d", n)
	}

	r.Deadline = DefaultDeadline
	res = r.ServeGroup(context.Background(), grp, budgetReq)
	if res.Err != nil || res.Status != 200 {
		t.Fatalf("expected the request served after the renewal, got %d %v", res.Status, res.Err)
	}
	if n := s.calls.Load(); n != 1 {
		t.Errorf("expected one upstream call, got %d", n)
	}
	if got := clock.Now(); !got.Equal(time.Date(2025, 8, 21, 13, 0, 0, 0, time.UTC)) {
		t.Errorf("expected it sent at the renewal (13:00:00), got %v", got)
	}
	if rep := grp.Spending.Report(clock.Now()); rep.SpentUSD < 0.005-1e-12 || rep.SpentUSD > 0.005+1e-12 {
		t.Errorf("expected $0.005 spent in the new window, got %+v", rep)
	}
}

// A group whose budget cannot hold the request goes on to its fallback
// group at once, as when the budget is spent, rather than wait for the
// renewal.
func TestBudgetFallsBackRatherThanWait(t *testing.T) {
	clock := newFakeClock()
	clock.Advance(19*time.Minute + 50*time.Second) // 10 s before the renewal
	r := newRouter(clock)
	paid := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, budgetBody)}}
	cheap := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	grp := NewGroup("paid", []*Deployment{budgetDeployment("a", paid)})
	grp.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 0.01, Period: time.Hour}, nil, "group|paid")
	grp.Spending.Add(clock.Now(), 0.008)
	grp.Fallback = NewGroup("cheap", []*Deployment{deployment("b", cheap)})

	res := r.ServeGroup(context.Background(), grp, budgetReq)
	if res.Err != nil || res.Group != grp.Fallback || paid.calls.Load() != 0 || cheap.calls.Load() != 1 {
		t.Fatalf("expected the fallback group to answer, got %v group %v, calls %d and %d", res.Err, res.Group, paid.calls.Load(), cheap.calls.Load())
	}
	if s := clock.Sleeps(); len(s) != 0 {
		t.Errorf("expected no wait, got %v", s)
	}
}

// An attempt the provider refuses before generating (a 400 passed on, a
// 429 failed over) gives back its whole hold: nothing is spent or held
// after it, and the budget holds the next request.
func TestBudgetRefusalGivesBackItsHold(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	s := &script{replies: []func(*http.Request) (*http.Response, error){
		reply(400, `{"error":{"message":"bad","type":"invalid_request_error"}}`),
		reply(429, rateLimited, "Retry-After", "1"), reply(200, budgetBody)}}
	grp := NewGroup("paid", []*Deployment{budgetDeployment("a", s)})
	grp.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 0.005, Period: time.Hour}, nil, "group|paid")

	if res := r.ServeGroup(context.Background(), grp, budgetReq); res.Status != 400 {
		t.Fatalf("expected the provider's 400, got %d %v", res.Status, res.Err)
	}
	if rep := grp.Spending.Report(clock.Now()); rep.SpentUSD != 0 || rep.HeldUSD != 0 {
		t.Errorf("after a 400: %+v, want nothing spent or held", rep)
	}
	if res := r.ServeGroup(context.Background(), grp, budgetReq); res.Err != nil || res.Status != 200 || res.Attempts != 2 {
		t.Fatalf("expected a 429 then a 200 within the budget, got %d %v after %d attempts", res.Status, res.Err, res.Attempts)
	}
	if rep := grp.Spending.Report(clock.Now()); rep.SpentUSD != 0.005 || rep.HeldUSD != 0 {
		t.Errorf("after the answer: %+v, want $0.005 spent and nothing held", rep)
	}
}

// A stream holds its worst case until it ends, then spends what its usage
// says: while it is relayed the budget has no room for another.
func TestBudgetStreamHoldsUntilItEnds(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	s := replies(sse(textChunk("a", "hi"), finalChunk("a"), usageChunk("a", 100, 40), "data: [DONE]"))
	grp := NewGroup("paid", []*Deployment{budgetDeployment("a", s)})
	grp.Spending = capacity.NewSpending(capacity.SpendLimit{USD: 0.005, Period: time.Hour}, nil, "group|paid")
	req := streamReq(`{"model":"paid","stream":true,"max_tokens":80,"messages":[{"role":"user","content":"hi"}]}`)
	req.PromptTokens, req.OutputTokens = 100, 80

	res := r.ServeGroup(context.Background(), grp, req)
	if res.Err != nil || res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	if rep := grp.Spending.Report(clock.Now()); rep.HeldUSD != 0.005 {
		t.Errorf("while it streams: %+v, want its $0.005 held", rep)
	}
	if res := r.ServeGroup(context.Background(), grp, req); res.Err == nil || s.calls.Load() != 1 {
		t.Errorf("expected no room for a second stream while the first holds the budget, got %v, %d calls", res.Err, s.calls.Load())
	}
	if _, err := relay(t, res.Stream); err != nil {
		t.Fatal(err)
	}
	// 100 prompt tokens at $10 and 40 output at $50 per 1M.
	if rep := grp.Spending.Report(clock.Now()); rep.HeldUSD != 0 || rep.SpentUSD < 0.003-1e-12 || rep.SpentUSD > 0.003+1e-12 {
		t.Errorf("after the stream: %+v, want $0.003 spent and nothing held", rep)
	}
}

// A request whose worst case is more than the whole budget (here $0.005
// against $0.003 per 1h, nothing spent yet) fits after no renewal: it is
// told at once with a 400 that says to lower max_tokens, with no
// Retry-After (an SDK would wait for the renewal and be refused again),
// and reaches no provider; the same for a deployment's budget.
func TestABudgetSmallerThanTheWorstCaseRefusesAtOnce(t *testing.T) {
	clock := newFakeClock()
	clock.Advance(10 * time.Minute) // 12:50: the renewal, 13:00, is before the deadline
	r := newRouter(clock)
	r.Deadline = time.Hour
	for _, scope := range []string{"model group", "deployment"} {
		s := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, budgetBody)}}
		d := budgetDeployment("a", s)
		grp := NewGroup("paid", []*Deployment{d})
		limit := capacity.SpendLimit{USD: 0.003, Period: time.Hour}
		if scope == "deployment" {
			d.Spending = capacity.NewSpending(limit, nil, "deployment|a")
		} else {
			grp.Spending = capacity.NewSpending(limit, nil, "group|paid")
		}
		start := clock.Now()
		res := r.ServeGroup(context.Background(), grp, budgetReq)
		var e *Error
		if !errors.As(res.Err, &e) || e.Status != http.StatusBadRequest || e.RetryAfter != 0 ||
			!strings.Contains(e.Message, "more than the whole budget of $0.003 per 1h") || !strings.Contains(e.Message, "max_tokens") {
			t.Errorf("%s: expected a 400 naming the budget and max_tokens, with no Retry-After, got %d %+v", scope, res.Status, res.Err)
		}
		if n := s.calls.Load(); n != 0 || res.Attempts != 0 {
			t.Errorf("%s: expected no upstream call, got %d (%d attempts)", scope, n, res.Attempts)
		}
		if waited := clock.Now().Sub(start); waited != 0 {
			t.Errorf("%s: expected the refusal at once, it came after %v", scope, waited)
		}
	}
}
