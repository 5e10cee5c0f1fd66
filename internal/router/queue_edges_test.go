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
	g.queue.join(w, 1<<30)
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
func TestReserveIsSpentFromItsMinPriority(t *testing.T) {
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
func TestHeadBlockedUntilItsWakeUp(t *testing.T) {
	_, g, c := cRouterC(1)
	now := c.Now()
	head := cJoinC(g, now, now.Add(time.Minute), 10)
	me := cJoinC(g, now, now.Add(time.Minute), 10)
	head.waitsFor.Store(1)
	head.blockedUntil.Store(now.UnixNano())
	if _, blocked := g.queue.headBlocked(me, false, g.Deployments, now); blocked {
		t.Error("a head waking now: expected it not blocked")
	}
	head.blockedUntil.Store(now.Add(time.Nanosecond).UnixNano())
	if waitsFor, blocked := g.queue.headBlocked(me, false, g.Deployments, now); !blocked || waitsFor != 1 {
		t.Errorf("a head waking later: expected it blocked for deployment 0, got %v %b", blocked, waitsFor)
	}
}

// An attempt that ends wakes the queue's head (only it); a deployment whose
// capacity became known wakes every waiting request but the one named.
func TestKicksWakeTheRightWaiters(t *testing.T) {
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
func TestKickHeadOfAQueueEmptiedMeanwhile(t *testing.T) {
	_, g, _ := cRouterC(1)
	g.queue.n.Store(1) // as read just before the last request left
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("kickHead panicked: %v", p)
		}
	}()
	g.queue.kickHead()
}

// cCandC is deployment i as a candidate: back at at for why, latency
// seconds of latency.
func cCandC(i int, at time.Time, why provider.Class, latency float64) scored {
	return scored{i: i, f: capacity.Features{At: at, Why: why, Latency: latency}}
}

// A request behind others whose deployments all come back only after its
// deadline is told so at once (429 with Retry-After until the first is
// back), not held in the queue until its deadline.
func TestWaitingBehindOthersForADeploymentBackTooLate(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	deadline := now.Add(25 * time.Second)
	cJoinC(g, now, deadline, 10)
	me := cJoinC(g, now, deadline, 10)
	me.kick() // a sleep would return at once
	cands := []scored{cCandC(0, now.Add(60*time.Second), provider.RateLimited, 0)}
	err := r.wait(context.Background(), g, me, cands, 0, &walk{}, capacity.Need{Tokens: 10}, now, deadline)
	if err == nil {
		t.Fatal("expected an answer at once, got a wait")
	}
	if e := cStatusC(t, err); e.Status != 429 || e.RetryAfter != 60*time.Second {
		t.Errorf("expected 429 with Retry-After 60 s, got %d %v", e.Status, e.RetryAfter)
	}
}

// The head's window is spent until 5 s and its deployment answers in 2 s:
// with a deadline at 6 s, an attempt started at the reset cannot answer in
// time, so it is told at once (429), not made to wait for the reset.
func TestWaitCountsTheLatencyAgainstTheDeadline(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	deadline := now.Add(6 * time.Second)
	cRequestsC(r, g.Deployments[0], now, 10, 0, 5*time.Second)
	me := cJoinC(g, now, deadline, 10)
	me.kick()
	back, _ := g.Deployments[0].State.AvailableAt(now, 10)
	cands := []scored{cCandC(0, back, provider.RateLimited, 2)}
	err := r.wait(context.Background(), g, me, cands, 0, &walk{}, capacity.Need{Tokens: 10}, now, deadline)
	if err == nil {
		t.Fatal("expected an answer at once, got a wait")
	}
	if e := cStatusC(t, err); e.Status != 429 {
		t.Errorf("expected 429, got %d", e.Status)
	}
	// With 5 s of latency allowed (deadline at 8 s), it waits for the reset.
	deadline = now.Add(8 * time.Second)
	if err := r.wait(context.Background(), g, me, cands, 0, &walk{}, capacity.Need{Tokens: 10}, now, deadline); err != nil {
		t.Errorf("deadline at 8 s: expected it to wait, got %v", err)
	}
}

// As above with a spent token window: the request is told at once.
func TestWaitOnASpentTokenWindow(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	deadline := now.Add(6 * time.Second)
	cTokensC(t, r, g.Deployments[0], now, 1000, 0, 10*time.Second)
	me := cJoinC(g, now, deadline, 10)
	me.kick()
	cands := []scored{cCandC(0, now.Add(5*time.Second), provider.RateLimited, 0)}
	err := r.wait(context.Background(), g, me, cands, 0, &walk{}, capacity.Need{Tokens: 10}, now, deadline)
	if err == nil {
		t.Fatal("expected an answer at once, got a wait")
	}
	if e := cStatusC(t, err); e.Status != 429 {
		t.Errorf("expected 429, got %d", e.Status)
	}
}

// Two requests wait before this one, 400 tokens each as it is, on a token
// window of 1000 spent until 10 s: with a deadline at 15 s (one reset,
// 1000 tokens) it is told at once, with its place in the message and
// Retry-After at the window that holds the three (the second reset, 20 s).
func TestUnservablePlaceSaysWhenAndHowManyAhead(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	deadline := now.Add(15 * time.Second)
	cTokensC(t, r, g.Deployments[0], now, 1000, 0, 10*time.Second)
	cJoinC(g, now, now.Add(time.Minute), 400)
	cJoinC(g, now, now.Add(time.Minute), 400)
	me := cJoinC(g, now, deadline, 400)
	me.kick()
	back, _ := g.Deployments[0].State.AvailableAt(now, 400)
	cands := []scored{cCandC(0, back, provider.RateLimited, 0)}
	err := r.wait(context.Background(), g, me, cands, 0, &walk{}, capacity.Need{Tokens: 400}, now, deadline)
	e := cStatusC(t, err)
	if e.Status != 429 || e.RetryAfter != 21*time.Second {
		t.Errorf("expected 429 with Retry-After 21 s, got %d %v", e.Status, e.RetryAfter)
	}
	if !strings.Contains(e.Message, "(2 waiting before it)") {
		t.Errorf("expected the message to say 2 wait before it, got %q", e.Message)
	}
}

// The head, as it looks, wakes the requests at the back of the queue that
// the windows can no longer serve before their deadlines: with 1 request
// left until the reset at 10 s, the one behind it (deadline 1 s) is
// marked late and woken to get its 429 now.
func TestTheHeadPrunesTheTail(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	cRequestsC(r, g.Deployments[0], now, 10, 1, 10*time.Second)
	me := cJoinC(g, now, now.Add(25*time.Second), 10)
	tail := cJoinC(g, now, now.Add(time.Second), 10)
	me.kick()
	cands := []scored{cCandC(0, now, provider.OK, 0)}
	if err := r.wait(context.Background(), g, me, cands, 1, &walk{}, capacity.Need{Tokens: 10}, now, me.deadline); err != nil {
		t.Fatalf("the head: expected it to wait its turn, got %v", err)
	}
	if !tail.late.Load() || !cKickedC(tail) {
		t.Errorf("expected the tail marked late and woken, got late %v, kicked %v", tail.late.Load(), cKickedC(tail))
	}
	if me.late.Load() {
		t.Error("expected the head not marked late")
	}
}

// Only the head prunes: a request with another before it leaves the
// tail alone.
func TestOnlyTheHeadPrunes(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	cRequestsC(r, g.Deployments[0], now, 10, 5, 10*time.Second)
	cJoinC(g, now, now.Add(25*time.Second), 10)
	me := cJoinC(g, now, now.Add(25*time.Second), 10)
	tail := cJoinC(g, now, now.Add(time.Second), 10)
	tail2 := cJoinC(g, now, now.Add(time.Second), 10)
	tail3 := cJoinC(g, now, now.Add(time.Second), 10)
	tail4 := cJoinC(g, now, now.Add(time.Second), 10)
	tail5 := cJoinC(g, now, now.Add(time.Second), 10)
	me.kick()
	cands := []scored{cCandC(0, now, provider.OK, 0)}
	if err := r.wait(context.Background(), g, me, cands, 1, &walk{}, capacity.Need{Tokens: 10}, now, me.deadline); err != nil {
		t.Fatalf("expected it to wait its turn, got %v", err)
	}
	for i, w := range []*waiter{tail, tail2, tail3, tail4, tail5} {
		if w.late.Load() {
			t.Errorf("tail %d: expected no pruning by a request that is not the head", i)
		}
	}
}

// Pruning goes from the back and never marks the head: with the window
// spent until after every deadline, the requests behind it are marked late,
// the head is not (it gets its own answer when it looks).
func TestPruningSparesTheHead(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	cRequestsC(r, g.Deployments[0], now, 10, 0, 10*time.Second)
	head := cJoinC(g, now, now.Add(time.Second), 10)
	second := cJoinC(g, now, now.Add(time.Second), 10)
	third := cJoinC(g, now, now.Add(time.Second), 10)
	r.pruneTail(g, head, []scored{cCandC(0, now.Add(10*time.Second), provider.RateLimited, 0)}, now, 0, 0, false)
	if head.late.Load() || cKickedC(head) {
		t.Error("expected the head neither marked late nor woken")
	}
	if !second.late.Load() || !third.late.Load() {
		t.Errorf("expected the two behind it marked late, got %v %v", second.late.Load(), third.late.Load())
	}
}

// Pruning counts the tokens of those before: the second request's 400
// tokens and the head's 400 do not fit the 500 left before its deadline,
// so it is marked late; the head's alone would.
func TestPruningCountsTokensAhead(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	cTokensC(t, r, g.Deployments[0], now, 1000, 500, 10*time.Second)
	head := cJoinC(g, now, now.Add(25*time.Second), 400)
	tail := cJoinC(g, now, now.Add(time.Second), 400)
	r.pruneTail(g, head, []scored{cCandC(0, now, provider.OK, 0)}, now, 0, 0, false)
	if !tail.late.Load() {
		t.Error("expected the tail marked late (800 tokens before its deadline, 500 left)")
	}
}

// A request behind a head blocked for deployment 0 goes at once when it
// has deployment 1 free, but waits when deployment 0 is all it has (its
// client gone here, so that the wait ends at once).
func TestGoingPastABlockedHeadOnlyToWhatItDoesNotWaitFor(t *testing.T) {
	r, g, c := cRouterC(2)
	now := c.Now()
	deadline := now.Add(25 * time.Second)
	head := cJoinC(g, now, deadline, 10)
	head.waitsFor.Store(1 << 0)
	head.blockedUntil.Store(now.Add(10 * time.Second).UnixNano())
	me := cJoinC(g, now, deadline, 10)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	both := []scored{cCandC(0, now, provider.OK, 0), cCandC(1, now, provider.OK, 0)}
	if err := r.wait(gone, g, me, both, 2, &walk{}, capacity.Need{Tokens: 10}, now, deadline); err != nil {
		t.Errorf("deployment 1 free: expected it to go now, got %v", err)
	}
	if both[0].i != 1 {
		t.Errorf("expected deployment 1 first among those it may take, got %d", both[0].i)
	}
	only := []scored{cCandC(0, now, provider.OK, 0)}
	if err := r.wait(gone, g, me, only, 1, &walk{}, capacity.Need{Tokens: 10}, now, deadline); err != ErrClientGone {
		t.Errorf("only deployment 0: expected it to wait (ErrClientGone), got %v", err)
	}
}

// The head waits for its deployment's return, and after failures, to
// retry one that failed this request, for the backoff when that is longer:
// 100 ms without failure, 1 s (the backoff of a second failure) after two,
// 100 ms after two failures elsewhere.
func TestTheHeadWaitsTheBackoffOnlyAfterFailures(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	deadline := now.Add(25 * time.Second)
	me := cJoinC(g, now, deadline, 10)
	cands := []scored{cCandC(0, now.Add(100*time.Millisecond), provider.Server, 0)}
	for _, w := range []*walk{
		{per: make([]attemptState, 1)},
		{failures: 2, per: []attemptState{{tried: true, failed: true}}},
		{failures: 2, per: make([]attemptState, 1)},
	} {
		if err := r.wait(context.Background(), g, me, cands, 0, w, capacity.Need{Tokens: 10}, now, deadline); err != nil {
			t.Fatal(err)
		}
	}
	if s := c.Sleeps(); len(s) != 3 || s[0] != 100*time.Millisecond || s[1] != r.Policy.Backoff(2) || s[1] != time.Second || s[2] != 100*time.Millisecond {
		t.Errorf("expected sleeps of 100 ms, 1 s, 100 ms, got %v", s)
	}
}

// A head blocked on deployment 64 of a group of 65 cannot say which
// deployments it waits for in its bit set: it is taken to wait for all.
func TestABlockedHeadPastSixtyFourDeploymentsWaitsForAll(t *testing.T) {
	r, g, c := cRouterC(65)
	now := c.Now()
	deadline := now.Add(25 * time.Second)
	me := cJoinC(g, now, deadline, 10)
	me.kick()
	cands := []scored{cCandC(64, now.Add(time.Second), provider.RateLimited, 0)}
	if err := r.wait(context.Background(), g, me, cands, 0, &walk{}, capacity.Need{Tokens: 10}, now, deadline); err != nil {
		t.Fatal(err)
	}
	if got := me.waitsFor.Load(); got != ^uint64(0) {
		t.Errorf("expected it to wait for every deployment, got %b", got)
	}
	if n := bypass([]scored{cCandC(3, now, provider.OK, 0)}, 1, me.waitsFor.Load()); n != 0 {
		t.Errorf("expected no request behind it to go past it to deployment 3, got %d", n)
	}
}

// A head that blocks for capacity of its own wakes those behind it once
// for the instant it waits for, not again at each look for that instant.
func TestABlockedHeadWakesThoseBehindOncePerInstant(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	deadline := now.Add(25 * time.Second)
	me := cJoinC(g, now, deadline, 10)
	behind := cJoinC(g, now, deadline, 10)
	cands := []scored{cCandC(0, now.Add(time.Second), provider.RateLimited, 0)}
	for i, want := range []bool{true, false} {
		me.kick()
		behind.mu.Lock()
		behind.kicked = false
		behind.mu.Unlock()
		if err := r.wait(context.Background(), g, me, cands, 0, &walk{}, capacity.Need{Tokens: 10}, now, deadline); err != nil {
			t.Fatal(err)
		}
		if cKickedC(behind) != want {
			t.Errorf("look %d: expected the one behind woken %v, got %v", i, want, cKickedC(behind))
		}
	}
}

// The forecast counts a request whose tokens are exactly what the window
// has left as served; one token more is not.
func TestExactlyTheTokensLeftServe(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	cTokensC(t, r, g.Deployments[0], now, 1000, 300, 10*time.Second)
	s := supplyOf(g.Deployments, []scored{cCandC(0, now, provider.OK, 0)}, 0, now, now, false)
	if enough, known := s.serves(1, 300); !enough || !known {
		t.Errorf("300 tokens of 300 left: expected enough and known, got %v %v", enough, known)
	}
	if enough, known := s.serves(1, 301); enough || !known {
		t.Errorf("301 tokens of 300 left: expected not enough, known, got %v %v", enough, known)
	}
}

// A place the windows cannot serve in time is a 429 when the deployments
// are rate-limited or out of quota, a 502 when one is out for failures.
func TestUnservableStatusFollowsWhyTheDeploymentsAreOut(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	deadline := now.Add(5 * time.Second)
	cRequestsC(r, g.Deployments[0], now, 10, 0, 10*time.Second)
	for _, tc := range []struct {
		why  provider.Class
		want int
	}{
		{provider.RateLimited, 429},
		{provider.QuotaExhausted, 429},
		{provider.Server, 502},
	} {
		cands := []scored{cCandC(0, now.Add(10*time.Second), tc.why, 0)}
		if e := cStatusC(t, r.unservable(g.Deployments, cands, 1, 10, 0, now, deadline, false)); e.Status != tc.want {
			t.Errorf("%v: expected %d, got %d", tc.why, tc.want, e.Status)
		}
	}
}

// cFleetTurnC runs fleetTurn for a new waiter of tokens tokens on g (whose
// fleet queue has others ahead), deployment 0 free at now.
func cFleetTurnC(r *Router, g *Group, now time.Time, others int64, tokens int64, naps int, deadline time.Time) (*waiter, bool, error) {
	g.Fleet = &fakeFleetQueue{others: others}
	me := &waiter{priority: DefaultPriority, tokens: tokens, since: now, deadline: deadline, naps: naps}
	ok, err := r.fleetTurn(context.Background(), g, me, []scored{cCandC(0, now, provider.OK, 0)}, capacity.Need{Tokens: tokens}, now, deadline)
	return me, ok, err
}

// Fleet mode, requests: 3 wait before it fleet-wide and the window has 3
// left until 10 s. It does not take one: it naps shortly while those ahead
// take theirs; once its naps are spent it sleeps until the window forecast
// to serve its place (the reset, 10 s); past its deadline it is told at
// once, with its place.
func TestAFleetTurnNapsThenSleepsUntilItsPlaceIsServed(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	cRequestsC(r, g.Deployments[0], now, 10, 3, 10*time.Second)
	deadline := now.Add(25 * time.Second)
	me, ok, err := cFleetTurnC(r, g, now, 3, 10, 0, deadline)
	if ok || err != nil || me.naps != 1 {
		t.Errorf("first look: expected a nap (not its turn), got ok %v, err %v, naps %d", ok, err, me.naps)
	}
	me, ok, err = cFleetTurnC(r, g, now, 3, 10, r.FleetNaps, deadline)
	if ok || err != nil || me.naps != 0 {
		t.Errorf("naps spent: expected a sleep until its place is served, got ok %v, err %v, naps %d", ok, err, me.naps)
	}
	s := c.Sleeps()
	if len(s) != 2 || s[0] != fleetNap || s[1] < 10*time.Second || s[1] > 10*time.Second+100*time.Millisecond {
		t.Errorf("expected a nap of %v, then a sleep until the reset (10 s), got %v", fleetNap, s)
	}
	_, ok, err = cFleetTurnC(r, g, now, 3, 10, r.FleetNaps, now.Add(5*time.Second))
	if e := cStatusC(t, err); ok || e.Status != 429 || !strings.Contains(e.Message, "(3 waiting before it)") {
		t.Errorf("deadline before the reset: expected 429 saying 3 wait before it, got %v %v", ok, err)
	}
	// With 3 ahead fleet-wide and 4 left, it is its turn.
	r, g, c = cRouterC(1)
	now = c.Now()
	cRequestsC(r, g.Deployments[0], now, 10, 4, 10*time.Second)
	if _, ok, err := cFleetTurnC(r, g, now, 3, 10, 0, deadline); !ok || err != nil {
		t.Errorf("4 left for 3 ahead: expected its turn, got %v %v", ok, err)
	}
}

// Fleet mode, a spent window: there is nothing to take now, so no nap; it
// sleeps until the reset.
func TestAFleetTurnOnASpentWindowDoesNotNap(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	cRequestsC(r, g.Deployments[0], now, 10, 0, 10*time.Second)
	me, ok, err := cFleetTurnC(r, g, now, 0, 10, 0, now.Add(25*time.Second))
	if ok || err != nil || me.naps != 0 {
		t.Errorf("expected a sleep without a nap, got ok %v, err %v, naps %d", ok, err, me.naps)
	}
	if s := c.Sleeps(); len(s) != 1 || s[0] < 10*time.Second || s[0] > 10*time.Second+100*time.Millisecond {
		t.Errorf("expected one sleep until the reset (10 s), got %v", s)
	}
}

// Fleet mode, tokens: 25 requests of 250 tokens wait before its 100, the
// window has 300 left until 10 s. It is not its turn; it sleeps until the
// reset, or is told at once (Retry-After at the reset) when its deadline is
// before; with 350 left it is its turn.
func TestAFleetTurnCountsTokensAhead(t *testing.T) {
	r, g, c := cRouterC(1)
	now := c.Now()
	r.FleetNaps = 0
	cTokensC(t, r, g.Deployments[0], now, 1000, 300, 10*time.Second)
	_, ok, err := cFleetTurnC(r, g, now, 25, 100, 0, now.Add(25*time.Second))
	if ok || err != nil {
		t.Errorf("expected not its turn, got %v %v", ok, err)
	}
	if s := c.Sleeps(); len(s) != 1 || s[0] < 10*time.Second || s[0] > 10*time.Second+100*time.Millisecond {
		t.Errorf("expected one sleep until the reset (10 s), got %v", s)
	}
	_, _, err = cFleetTurnC(r, g, now, 25, 100, 0, now.Add(5*time.Second))
	if e := cStatusC(t, err); e.Status != 429 || e.RetryAfter != 11*time.Second {
		t.Errorf("deadline at 5 s: expected 429 with Retry-After 11 s (the reset, past its margin, rounded up), got %d %v", e.Status, e.RetryAfter)
	}
	r, g, c = cRouterC(1)
	now = c.Now()
	cTokensC(t, r, g.Deployments[0], now, 1000, 350, 10*time.Second)
	if _, ok, err := cFleetTurnC(r, g, now, 25, 100, 0, now.Add(25*time.Second)); !ok || err != nil {
		t.Errorf("350 left for 350: expected its turn, got %v %v", ok, err)
	}
}

// A weekly window (Anthropic's 7-day limit, the case MaxCooldown is for):
// the instant a spent one serves the request again is found at its reset,
// not at the last doubling below MaxCooldown (6 or 4 days, when the
// request could not yet be served and a client told to retry then would
// meet a 429 again).
func TestServableAtFindsAWeeklyReset(t *testing.T) {
	for _, back := range []time.Duration{0, provider.MaxCooldown >> 19} {
		r, g, c := cRouterC(1)
		now := c.Now()
		cRequestsC(r, g.Deployments[0], now, 1, 0, 7*24*time.Hour) // 1 a week, spent
		cands := []scored{cCandC(0, now.Add(back), provider.RateLimited, 0)}
		at := r.servableAt(g.Deployments, cands, 1, 10, 0, now, now, false)
		if enough, _ := forecast(g.Deployments, cands, 1, 10, 0, now, at, false); !enough {
			t.Errorf("back in %v: servable at now+%v, where the forecast does not serve it", back, at.Sub(now))
		}
		if d := at.Sub(now); d < 7*24*time.Hour || d > 7*24*time.Hour+time.Second {
			t.Errorf("back in %v: expected the weekly reset (168h and the margin), got now+%v", back, d)
		}
	}
}
