package router

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// cRouterC is a router on a fakeClock (which records every sleep) and a
// group of n deployments that know nothing yet.
func cRouterC(n int) (*Router, *Group, *fakeClock) {
	c := newFakeClock()
	r := newRouter(c)
	ds := make([]*Deployment, n)
	for i := range ds {
		ds[i] = deployment(string(rune('a'+i%26))+strings.Repeat("x", i/26), nil)
	}
	return r, NewGroup("c", ds), c
}

// cRequestsC makes d's requests window stated: limit, remaining, reset.
func cRequestsC(r *Router, d *Deployment, now time.Time, limit, remaining int64, reset time.Duration) {
	o := provider.NewObservation(provider.OK)
	o.Requests = provider.Window{Limit: limit, Remaining: remaining, Reset: reset}
	d.State.Observe(now, o, r.Policy)
}

// cTokensC makes d's token window stated (limit, remaining, reset) and its
// ratio learned (one attempt of 100 tokens counted as 100), so that its
// forecast is known.
func cTokensC(t *testing.T, r *Router, d *Deployment, now time.Time, limit, remaining int64, reset time.Duration) {
	t.Helper()
	o := provider.NewObservation(provider.OK)
	o.Tokens = provider.Window{Limit: limit, Remaining: remaining + 100, Reset: reset}
	d.State.Observe(now, o, r.Policy)
	a, ok := d.State.AcquireFor(now, capacity.Need{Tokens: 100})
	if !ok {
		t.Fatal("cTokensC: no attempt")
	}
	o.Tokens.Remaining = remaining
	d.State.ObserveAttempt(a, now, o, r.Policy)
	if _, tok := d.State.Forecast(now, now, 0); tok != remaining {
		t.Fatalf("cTokensC: expected a token forecast of %d, got %d", remaining, tok)
	}
}

// cJoinC puts a waiter of tokens tokens and deadline in g's queue.
func cJoinC(g *Group, now, deadline time.Time, tokens int64) *waiter {
	w := &waiter{priority: DefaultPriority, tokens: tokens, since: now, deadline: deadline}
	g.queue.join(w)
	return w
}

func cKickedC(w *waiter) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kicked
}

func cStatusC(t *testing.T, err error) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("expected an *Error, got %v", err)
	}
	return e
}

// A request of exactly the reserve's minimum priority may spend the
// reserve; one below it may not, and is told at once.
func TestCReserveIsSpentFromItsMinPriority(t *testing.T) {
	r, g, c := cRouterC(1)
	g.Deployments[0].Transport = &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	r.Reserve = Reserve{Share: 0.3, MinPriority: 7}
	r.Deadline = 5 * time.Second
	cRequestsC(r, g.Deployments[0], c.Now(), 10, 2, 10*time.Second) // 2 left, 3 kept
	low := &Request{Request: chatReq.Request, Tokens: 10, Priority: 6}
	if e := cStatusC(t, r.ServeGroup(context.Background(), g, low).Err); e.Status != 429 {
		t.Errorf("priority 6: expected 429 (the reserve is not its own), got %d", e.Status)
	}
	high := &Request{Request: chatReq.Request, Tokens: 10, Priority: 7}
	if res := r.ServeGroup(context.Background(), g, high); res.Err != nil || res.Status != 200 {
		t.Errorf("priority 7: expected 200 from the reserve, got %+v", res)
	}
}

// A head whose sleep ends at this very instant is no longer blocked: those
// behind it may not go past it; one whose sleep ends later is.
func TestCHeadBlockedUntilItsWakeUp(t *testing.T) {
	_, g, c := cRouterC(1)
	now := c.Now()
	head := cJoinC(g, now, now.Add(time.Minute), 10)
	me := cJoinC(g, now, now.Add(time.Minute), 10)
	head.waitsFor.Store(1)
	head.blockedUntil.Store(now.UnixNano())
	if _, blocked := g.queue.headBlocked(me, now); blocked {
		t.Error("a head waking now: expected it not blocked")
	}
	head.blockedUntil.Store(now.Add(time.Nanosecond).UnixNano())
	if waitsFor, blocked := g.queue.headBlocked(me, now); !blocked || waitsFor != 1 {
		t.Errorf("a head waking later: expected it blocked for deployment 0, got %v %b", blocked, waitsFor)
	}
}

// An attempt that ends wakes the queue's head (only it); a deployment whose
// capacity became known wakes every waiting request but the one named.
func TestCKicksWakeTheRightWaiters(t *testing.T) {
	_, g, c := cRouterC(1)
	now := c.Now()
	g.queue.kickHead() // an empty queue: nothing to wake
	head := cJoinC(g, now, now.Add(time.Minute), 10)
	second := cJoinC(g, now, now.Add(time.Minute), 10)
	third := cJoinC(g, now, now.Add(time.Minute), 10)
	g.queue.kickHead()
	if !cKickedC(head) || cKickedC(second) || cKickedC(third) {
		t.Errorf("kickHead: expected the head alone woken, got %v %v %v", cKickedC(head), cKickedC(second), cKickedC(third))
	}
	head.kicked = false
	g.queue.kickAllBut(second)
	if !cKickedC(head) || cKickedC(second) || !cKickedC(third) {
		t.Errorf("kickAllBut(second): expected the head and the third woken, got %v %v %v", cKickedC(head), cKickedC(second), cKickedC(third))
	}
}

// The queue's count is read before its lock: a queue emptied in between
// (the last request left) is no head to wake, and no panic.
func TestCKickHeadOfAQueueEmptiedMeanwhile(t *testing.T) {
	_, g, _ := cRouterC(1)
	g.queue.n.Store(1) // as read just before the last request left
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("kickHead panicked: %v", p)
		}
	}()
	g.queue.kickHead()
}
