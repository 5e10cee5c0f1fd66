package router

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// withWindows gives d's state what a success response stating these
// windows would.
func withWindows(t testing.TB, d *Deployment, now time.Time, req, tok provider.Window) {
	t.Helper()
	o := provider.NewObservation(provider.OK)
	o.Requests, o.Tokens = req, tok
	d.State.Observe(now, o, capacity.DefaultPolicy)
}

func scoreOf(t *testing.T, r *Router, group []*Deployment, req *Request, now time.Time) map[string]float64 {
	t.Helper()
	var per [16]attemptState
	cands, _ := candidates(nil, group, &walk{per: per[:len(group)], minContext: -1}, now, now.Add(DefaultDeadline), req, capacity.Need{Tokens: req.Tokens})
	n := readyFirst(cands, now)
	r.score(group, cands[:n])
	out := map[string]float64{}
	for _, c := range cands[:n] {
		out[group[c.i].Name] = c.score
	}
	return out
}

func TestScoreNearlyExhaustedLosesToPlenty(t *testing.T) {
	clock := newFakeClock()
	low, plenty := deployment("low", &script{}), deployment("plenty", &script{})
	withWindows(t, low, clock.Now(), provider.Window{Limit: 1000, Remaining: 2, Reset: 50 * time.Second}, provider.UnknownWindow)
	withWindows(t, plenty, clock.Now(), provider.Window{Limit: 1000, Remaining: 900, Reset: 50 * time.Second}, provider.UnknownWindow)
	r := newRouter(clock)
	s := scoreOf(t, r, []*Deployment{low, plenty}, chatReq, clock.Now())
	if s["plenty"] <= s["low"]+nearTie {
		t.Errorf("expected 900 left to beat 2 left clearly, got %v", s)
	}
	// And the router sends the request there.
	ok := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	low.Transport, plenty.Transport = ok, ok
	for i := 0; i < 20; i++ {
		r.Rand = rand.New(rand.NewPCG(uint64(i), 1)).Float64
		if res := r.Serve(context.Background(), []*Deployment{low, plenty}, chatReq); res.Deployment != plenty {
			t.Fatalf("expected plenty, got %v", res.Deployment)
		}
	}
}

func TestRequestLargerThanTokensLeftSkipsDeployment(t *testing.T) {
	clock := newFakeClock()
	small, big := deployment("small", &script{}), deployment("big", &script{})
	withWindows(t, small, clock.Now(), provider.UnknownWindow, provider.Window{Limit: 40000, Remaining: 10000, Reset: 30 * time.Second})
	ok := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	small.Transport, big.Transport = ok, ok
	small.Quality = 1 // would win otherwise
	r := newRouter(clock)
	req := &Request{Request: wire(chatReq.Body, false), PromptTokens: 2000, OutputTokens: 28000, Tokens: 30000}
	if res := r.Serve(context.Background(), []*Deployment{small, big}, req); res.Deployment != big || res.Attempts != 1 {
		t.Errorf("a 30k-token request must skip 10k remaining, got %v after %d", res.Deployment, res.Attempts)
	}
	small2 := &Request{Request: wire(chatReq.Body, false), PromptTokens: 100, OutputTokens: 400, Tokens: 500}
	if res := r.Serve(context.Background(), []*Deployment{small, big}, small2); res.Deployment != small {
		t.Errorf("a 500-token request fits: expected small (higher quality), got %v", res.Deployment)
	}
}

func TestCostWeight(t *testing.T) {
	clock := newFakeClock()
	cheap, dear := deployment("cheap", &script{}), deployment("dear", &script{})
	cheap.CostInput, cheap.CostOutput = 0.15, 0.60
	dear.CostInput, dear.CostOutput = 5, 15
	r := newRouter(clock)
	req := &Request{Request: wire(chatReq.Body, false), PromptTokens: 1000, OutputTokens: 500, Tokens: 1500}
	s := scoreOf(t, r, []*Deployment{cheap, dear}, req, clock.Now())
	if s["cheap"] <= s["dear"]+nearTie {
		t.Errorf("with cost weight 1, expected the cheap one to win clearly, got %v", s)
	}
	r.Weights.Cost = 0
	s = scoreOf(t, r, []*Deployment{cheap, dear}, req, clock.Now())
	if s["cheap"] != s["dear"] {
		t.Errorf("with cost weight 0, expected price ignored (equal scores), got %v", s)
	}
}

func TestLatencyAndReliabilityCount(t *testing.T) {
	clock := newFakeClock()
	fast, slow, flaky := deployment("fast", &script{}), deployment("slow", &script{}), deployment("flaky", &script{})
	fast.State.RecordLatency(200*time.Millisecond, 0)
	slow.State.RecordLatency(3*time.Second, 0)
	for i := 0; i < 3; i++ {
		flaky.State.Observe(clock.Now(), provider.NewObservation(provider.Server), capacity.DefaultPolicy)
	}
	flaky.State.Observe(clock.Now(), provider.NewObservation(provider.OK), capacity.DefaultPolicy)
	s := scoreOf(t, newRouter(clock), []*Deployment{fast, slow, flaky}, chatReq, clock.Now())
	if !(s["fast"] > s["slow"]+nearTie && s["fast"] > s["flaky"]+nearTie) {
		t.Errorf("expected fast and reliable to win clearly, got %v", s)
	}
}

func TestEqualDeploymentsShareTraffic(t *testing.T) {
	ok := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", ok), deployment("b", ok), deployment("c", ok)}
	r := New()
	r.Clock = newFakeClock()
	r.Rand = rand.New(rand.NewPCG(42, 7)).Float64
	counts := map[string]int{}
	for i := 0; i < 1000; i++ {
		res := r.Serve(context.Background(), group, chatReq)
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		counts[res.Deployment.Name]++
	}
	for _, d := range group {
		if n := counts[d.Name]; n < 300 || n > 367 {
			t.Errorf("expected about 333 (+/-10%%) on %s, got %d (all: %v)", d.Name, n, counts)
		}
	}
}

func TestWeightSharesTiesProportionally(t *testing.T) {
	ok := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", ok), deployment("b", ok)}
	group[0].Weight = 3
	r := New()
	r.Clock = newFakeClock()
	r.Rand = rand.New(rand.NewPCG(1, 2)).Float64
	a := 0
	for i := 0; i < 1000; i++ {
		if r.Serve(context.Background(), group, chatReq).Deployment == group[0] {
			a++
		}
	}
	if a < 700 || a > 800 {
		t.Errorf("weight 3:1: expected about 750 on a, got %d", a)
	}
}

func TestHalfOpenProbeLetsOneRequestThrough(t *testing.T) {
	clock := newFakeClock()
	release := make(chan struct{})
	probing := make(chan struct{})
	var once sync.Once
	// Only the first call (the probe) waits for release: a second probe,
	// a bug, answers at once, so that the test fails with a message
	// rather than waiting forever.
	a := &script{}
	a.replies = []func(*http.Request) (*http.Response, error){func(req *http.Request) (*http.Response, error) {
		first := false
		once.Do(func() { first = true; close(probing) })
		if first {
			<-release
		}
		return reply(200, okBody)(req)
	}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	group := []*Deployment{deployment("a", a), deployment("b", b)}
	group[0].Quality = 1 // a first whenever it is usable
	group[0].State.Observe(clock.Now(), provider.NewObservation(provider.Server), capacity.DefaultPolicy)
	clock.Advance(time.Second) // past the backoff: half-open
	r := newRouter(clock)

	done := make(chan *Result)
	go func() { done <- r.Serve(context.Background(), group, chatReq) }()
	<-probing
	// While the probe is out, others go to b.
	for i := 0; i < 3; i++ {
		if res := within(t, func() *Result { return r.Serve(context.Background(), group, chatReq) }); res.Deployment != group[1] {
			t.Errorf("while a's probe is out, expected b, got %v", res.Deployment)
		}
	}
	close(release)
	if res := <-done; res.Deployment != group[0] {
		t.Errorf("expected the probe answered by a, got %v", res.Deployment)
	}
	if n := a.calls.Load(); n != 1 {
		t.Errorf("expected exactly one probe, got %d", n)
	}
	// Closed again: a takes the next request.
	if res := within(t, func() *Result { return r.Serve(context.Background(), group, chatReq) }); res.Deployment != group[0] {
		t.Errorf("expected a after its probe succeeded, got %v", res.Deployment)
	}
}

// Ranking must stay cheap: it runs for every attempt.
func BenchmarkRank16(b *testing.B) {
	clock := newFakeClock()
	group := make([]*Deployment, 16)
	for i := range group {
		group[i] = deployment("d", &script{})
		group[i].CostInput, group[i].CostOutput = float64(i+1)/10, float64(i+1)/5
		group[i].State.RecordLatency(time.Duration(100+i*10)*time.Millisecond, 0)
		withWindows(b, group[i], clock.Now(), provider.Window{Limit: 1000, Remaining: int64(900 - i*10), Reset: time.Minute}, provider.UnknownWindow)
	}
	r := newRouter(clock)
	req := &Request{Request: wire(chatReq.Body, false), PromptTokens: 1000, OutputTokens: 500, Tokens: 1500}
	var per [16]attemptState
	var buf [16]scored
	w := &walk{per: per[:], minContext: -1}
	now := clock.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		cands, _ := candidates(buf[:0], group, w, now, now.Add(DefaultDeadline), req, capacity.Need{Tokens: req.Tokens})
		n := readyFirst(cands, now)
		r.score(group, cands[:n])
		_ = r.pick(group, cands[:n])
	}
}

// The worked example of docs/routing.md, "How deployments are ranked".
func TestWorkedExample(t *testing.T) {
	clock := newFakeClock()
	oa, groq := deployment("openai/gpt-4o-mini", &script{}), deployment("groq/llama-3.1-8b-instant", &script{})
	oa.CostInput, oa.CostOutput, oa.Quality = 0.15, 0.60, 0.8
	groq.CostInput, groq.CostOutput, groq.Quality = 0.05, 0.08, 0.6
	withWindows(t, oa, clock.Now(), provider.Window{Limit: 5000, Remaining: 4000, Reset: 10 * time.Second}, provider.UnknownWindow)
	withWindows(t, groq, clock.Now(), provider.Window{Limit: 30, Remaining: 2, Reset: 50 * time.Second}, provider.UnknownWindow)
	oa.State.RecordLatency(900*time.Millisecond, 0)
	groq.State.RecordLatency(300*time.Millisecond, 0)
	// groq: 9 successes in 10 (+1 virtual): 10/11 = 0.91.
	for i := 0; i < 10; i++ {
		o := provider.NewObservation(provider.OK)
		if i == 0 {
			o = provider.NewObservation(provider.Server)
		}
		groq.State.Observe(clock.Now(), o, capacity.DefaultPolicy)
	}
	withWindows(t, groq, clock.Now(), provider.Window{Limit: 30, Remaining: 2, Reset: 50 * time.Second}, provider.UnknownWindow)
	req := &Request{Request: wire(chatReq.Body, false), PromptTokens: 1000, OutputTokens: 500, Tokens: 1500}
	s := scoreOf(t, newRouter(clock), []*Deployment{oa, groq}, req, clock.Now())
	near := func(got, want float64) bool { return got > want-0.005 && got < want+0.005 }
	if !near(s[oa.Name], 0.667) || !near(s[groq.Name], 0.596) {
		t.Errorf("expected openai 0.667 and groq 0.596 as in docs/routing.md, got %v", s)
	}
	withWindows(t, groq, clock.Now(), provider.Window{Limit: 30, Remaining: 25, Reset: 50 * time.Second}, provider.UnknownWindow)
	s = scoreOf(t, newRouter(clock), []*Deployment{oa, groq}, req, clock.Now())
	if !near(s[groq.Name], 0.852) {
		t.Errorf("expected groq 0.852 with 25 left, got %v", s)
	}
}

// Scores that compare to nothing (NaN, from a cost that overflowed to
// +Inf for a deployment used as a library with a price past any config's
// bound) still pick a deployment: the router never indexes out of range.
func TestPickWithScoresThatCompareToNothing(t *testing.T) {
	r := newRouter(newFakeClock())
	group := []*Deployment{deployment("a", nil), deployment("b", nil)}
	cands := []scored{{i: 0, score: math.NaN()}, {i: 1, score: math.NaN()}}
	if k := r.pick(group, cands); k != 0 {
		t.Fatalf("expected the first candidate, got %d", k)
	}
}
