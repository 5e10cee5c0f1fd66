package router

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Tiers: tier 2 is tried only when tier 1 cannot serve the request before
// its deadline, whatever the scores say.
func TestTiers(t *testing.T) {
	ok := func() *script {
		return &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	}

	// Healthy: the first tier serves although the second scores better.
	clock := newFakeClock()
	first, second := ok(), ok()
	group := []*Deployment{deployment("first", first), deployment("second", second)}
	group[0].CostInput, group[0].CostOutput = 10, 30 // expensive
	group[1].CostInput, group[1].CostOutput, group[1].Quality, group[1].Tier = 0.1, 0.3, 1, 2
	r := newRouter(clock)
	for range 5 {
		if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[0] {
			t.Fatalf("expected the first tier, got %v", res.Deployment)
		}
	}
	if second.calls.Load() != 0 {
		t.Errorf("expected the second tier untouched, got %d calls", second.calls.Load())
	}

	// The first tier rate-limited past the deadline: the second, at once.
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 2 * time.Minute
	group[0].State.Observe(clock.Now(), rl, r.Policy)
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[1] || res.Attempts != 1 || len(clock.Sleeps()) != 0 {
		t.Errorf("expected the second tier at once, got %v after %d attempts and waits %v", res.Deployment, res.Attempts, clock.Sleeps())
	}

	// Back within the deadline (2 s of 60): the request waits for it.
	clock = newFakeClock()
	r = newRouter(clock)
	group = []*Deployment{deployment("first", ok()), deployment("second", ok())}
	group[1].Tier = 2
	rl.RetryAfter = 2 * time.Second
	group[0].State.Observe(clock.Now(), rl, r.Policy)
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[0] {
		t.Errorf("expected to wait for the first tier, got %v", res.Deployment)
	}
	if s := clock.Sleeps(); len(s) != 1 || s[0] != 2*time.Second {
		t.Errorf("expected one 2 s wait, got %v", s)
	}

	// The first tier fails: the second at once, not a wait for a retry of
	// the first (its backoff would be well within the deadline).
	clock = newFakeClock()
	r = newRouter(clock)
	failing := &script{replies: []func(*http.Request) (*http.Response, error){reply(500, `{"error":{"message":"boom"}}`)}}
	group = []*Deployment{deployment("first", failing), deployment("second", ok())}
	group[1].Tier = 2
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[1] || res.Attempts != 2 || len(clock.Sleeps()) != 0 {
		t.Errorf("expected the second tier after the first failed, at once, got %v after %d attempts and waits %v", res.Deployment, res.Attempts, clock.Sleeps())
	}
	// The first tier answers 429 with a Retry-After well within the
	// deadline: it said it had no capacity, and may say it again; the
	// second tier at once rather than a wait and a retry.
	clock = newFakeClock()
	r = newRouter(clock)
	limited := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "2")}}
	group = []*Deployment{deployment("first", limited), deployment("second", ok())}
	group[1].Tier = 2
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[1] || res.Attempts != 2 || len(clock.Sleeps()) != 0 {
		t.Errorf("expected the second tier after the first's 429, at once, got %v after %d attempts and waits %v", res.Deployment, res.Attempts, clock.Sleeps())
	}
}

// A burst larger than the first tier's window before the deadline: the
// first tier serves what its window holds, the rest goes to the second
// tier at once instead of being refused.
func TestTiersTakeTheOverflow(t *testing.T) {
	r, g, p, c := limitedGroup(t) // 10 per 10 s, deadline 25 s
	r.Deadline = 5 * time.Second
	spare := &windowed{c: c, limit: 100, span: 10 * time.Second}
	second := deployment("spare", nil)
	second.Transport, second.Tier = spare, 2
	g.Deployments = append(g.Deployments, second)
	out := make([]served, 15)
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq("u", DefaultPriority)), 0)
	})
	for i, o := range out {
		if o.status != 200 {
			t.Errorf("request %d: %+v", i, o)
		}
	}
	// The forecast counts every request ahead against the first tier,
	// though some of them go to the second: a place or two of the first
	// tier may be left (how many depends on the order the burst arrives).
	if p.served < 8 || p.served+spare.served != 15 || p.got429+spare.got429 != 0 {
		t.Errorf("expected the first tier's 10 (at least 8) and the rest on the second, no 429, got %d and %d (%d 429s)", p.served, spare.served, p.got429+spare.got429)
	}
}

// A request that arrives while others wait for the first tier counts them
// when it picks its tier: it would join the queue behind them. (It counted
// none, stayed on the first tier, and the queue's forecast refused it with
// a 429 "10 waiting before it" although the second tier had room at once;
// found by the tier.go mutants.)
//
// Scenario: the first tier (10 per 10 s) spent, 10 requests waiting for
// its next window (10 s), deadline 15 s; 3 more arrive. Expected: the 10
// served by the first tier at its window, the 3 by the second tier at
// once. Got: the 3 answered 429 at once, the second tier untouched.
func TestOverflowBehindAQueueGoesToTheNextTier(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	r.Deadline = 15 * time.Second
	spare := &windowed{c: c, limit: 100, span: 10 * time.Second}
	second := deployment("spare", nil)
	second.Transport, second.Tier = spare, 2
	g.Deployments = append(g.Deployments, second)
	for range 10 { // spend the first tier's window
		if res := r.ServeGroup(context.Background(), g, userReq("w", DefaultPriority)); res.Deployment != g.Deployments[0] {
			t.Fatalf("warm-up: %v %v", res.Deployment, res.Err)
		}
	}
	p.served = 0
	var mu sync.Mutex
	var out []served
	simulate(t, c, 13, func(i int) {
		res := r.ServeGroup(context.Background(), g, userReq("u", DefaultPriority))
		mu.Lock()
		out = append(out, outcomeOf(res, 0))
		mu.Unlock()
	})
	for _, o := range out {
		if o.status != 200 {
			t.Errorf("expected every request served, got %+v", o)
		}
	}
	if p.served != 10 || spare.served != 3 {
		t.Errorf("expected 10 on the first tier and 3 on the second, got %d and %d", p.served, spare.served)
	}
}
