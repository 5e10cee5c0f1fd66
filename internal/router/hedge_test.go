package router

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// gate is a fake provider's reply held until the test opens it, or the
// attempt is cancelled (then the attempt's error, counted).
type gate struct {
	open      chan struct{}
	next      func(*http.Request) (*http.Response, error)
	cancelled atomic.Int32
}

func newGate(next func(*http.Request) (*http.Response, error)) *gate {
	return &gate{open: make(chan struct{}), next: next}
}

func (g *gate) reply(req *http.Request) (*http.Response, error) {
	select {
	case <-g.open:
		return g.next(req)
	case <-req.Context().Done():
		g.cancelled.Add(1)
		return nil, req.Context().Err()
	}
}

// eventually waits up to 10 s for cond, failing t with what.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func hedgeRouter(c *fakeClock) (*Router, *countingObserver) {
	r := newRouter(c)
	r.HedgeAfter = 2 * time.Second
	obs := &countingObserver{unpredicted: map[string]int{}}
	r.Observer = obs
	return r, obs
}

// A slow first attempt gets a hedge once HedgeAfter has passed on the
// clock; the hedge answers first, the slow one is cancelled without
// counting against its deployment, and both are counted attempts.
func TestASlowAttemptIsHedged(t *testing.T) {
	c := newFakeClock()
	slow := newGate(reply(200, okBody))
	a := &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, strings.Replace(okBody, `"hi"`, `"from b"`, 1))}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r, obs := hedgeRouter(c)
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(time.Second)
	time.Sleep(20 * time.Millisecond)
	if b.calls.Load() != 0 {
		t.Fatal("hedged before hedge_after")
	}
	c.Advance(time.Second)
	res := <-done
	if res.Err != nil || res.Deployment != db || !strings.Contains(string(res.Body), "from b") || res.Attempts != 2 || res.Hedge != HedgeWon {
		t.Fatalf("expected b's answer after 2 attempts, hedge won; got %v %v %d %q", res.Err, res.Deployment, res.Attempts, res.Hedge)
	}
	eventually(t, "a cancelled", func() bool { return slow.cancelled.Load() == 1 })
	now := c.Now()
	if s := da.State.Snapshot(now); s.ConsecutiveFailures != 0 || s.InFlight != 0 {
		t.Errorf("expected the lost attempt neither failed nor in flight, got %d failures, %d in flight", s.ConsecutiveFailures, s.InFlight)
	}
	if s := db.State.Snapshot(now); s.InFlight != 0 {
		t.Errorf("expected b's claim released, %d in flight", s.InFlight)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.hedges) != 2 || obs.hedges[0] != "b" || obs.hedges[1] != "won b" {
		t.Errorf("expected a hedge on b that won, got %v", obs.hedges)
	}
}

// The first attempt may still answer first: the hedge is cancelled.
func TestAHedgeThatLosesIsCancelled(t *testing.T) {
	c := newFakeClock()
	slow := newGate(reply(200, okBody))
	hedge := newGate(reply(200, okBody))
	a := &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){hedge.reply}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r, obs := hedgeRouter(c)
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	eventually(t, "the hedge", func() bool { return b.calls.Load() == 1 })
	close(slow.open)
	res := <-done
	if res.Err != nil || res.Deployment != da || res.Attempts != 2 || res.Hedge != HedgeLost {
		t.Fatalf("expected a's answer, hedge lost, 2 attempts; got %v %v %d %q", res.Err, res.Deployment, res.Attempts, res.Hedge)
	}
	eventually(t, "the hedge cancelled", func() bool { return hedge.cancelled.Load() == 1 })
	if s := db.State.Snapshot(c.Now()); s.ConsecutiveFailures != 0 || s.InFlight != 0 {
		t.Errorf("expected the cancelled hedge neither failed nor in flight, got %d, %d", s.ConsecutiveFailures, s.InFlight)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.hedges) != 1 || obs.hedges[0] != "b" {
		t.Errorf("expected one hedge that did not win, got %v", obs.hedges)
	}
}

// An attempt that answers within hedge_after is not hedged; nor is one
// when no other deployment has capacity now.
func TestNoHedgeWhenNotNeeded(t *testing.T) {
	c := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r, _ := hedgeRouter(c)
	res := r.Serve(context.Background(), []*Deployment{da, db}, chatReq)
	if res.Err != nil || res.Hedge != "" || res.Attempts != 1 || b.calls.Load() != 0 {
		t.Errorf("expected a's answer alone, got %v %q %d, b asked %d", res.Err, res.Hedge, res.Attempts, b.calls.Load())
	}

	slow := newGate(reply(200, okBody))
	a = &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
	da, db = deployment("a", a), deployment("b", b)
	db.State.Observe(c.Now(), provider.Observation{Class: provider.RateLimited, RetryAfter: time.Minute}, r.Policy)
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(3 * time.Second)
	time.Sleep(20 * time.Millisecond)
	close(slow.open)
	res = <-done
	if res.Err != nil || res.Hedge != "" || res.Attempts != 1 || b.calls.Load() != 0 {
		t.Errorf("expected no hedge on a rate-limited b, got %v %q %d, b asked %d", res.Err, res.Hedge, res.Attempts, b.calls.Load())
	}
}

// A hedged stream: the first content wins; a first attempt that then
// fails is a failure like any other, and the hedge answers.
func TestAHedgedStream(t *testing.T) {
	c := newFakeClock()
	slow := newGate(reply(503, `{"error":{"message":"overloaded","type":"server_error"}}`))
	a := &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
	hedge := newGate(sse(textChunk("b", "Hello"), finalChunk("b"), "data: [DONE]"))
	b := &script{replies: []func(*http.Request) (*http.Response, error){hedge.reply}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r, _ := hedgeRouter(c)
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq)) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	eventually(t, "the hedge", func() bool { return b.calls.Load() == 1 })
	close(slow.open) // a fails first: the hedge is awaited
	time.Sleep(20 * time.Millisecond)
	close(hedge.open)
	res := <-done
	if res.Stream == nil || res.Deployment != db || res.Attempts != 2 || res.Hedge != HedgeWon || res.FailoverReason != provider.Overloaded {
		t.Fatalf("expected b's stream after a's failure, got %v %v %d %q %s", res.Err, res.Deployment, res.Attempts, res.Hedge, res.FailoverReason)
	}
	got, err := relay(t, res.Stream)
	if text, _, _, dones, _ := chatText(t, got); err != nil || text != "Hello" || dones != 1 {
		t.Errorf("expected b's stream, got %q %v", text, err)
	}
	if s := da.State.Snapshot(c.Now()); s.ConsecutiveFailures != 1 {
		t.Errorf("expected a's failure counted, got %d", s.ConsecutiveFailures)
	}
}
