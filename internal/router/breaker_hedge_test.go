package router

// Adversarial tests of hedging (hedge.go). Tests named TestBreaker...
// expose defects (they fail until fixed); the others pin behaviour that
// held under attack.

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// deafGate holds a reply until opened, whatever happens to the attempt's
// context (a provider whose answer was already on its way when the
// router cancelled it).
type deafGate struct {
	open chan struct{}
	next replyFunc
}

func newDeafGate(next replyFunc) *deafGate { return &deafGate{open: make(chan struct{}), next: next} }

func (g *deafGate) reply(req *http.Request) (*http.Response, error) {
	<-g.open
	return g.next(req)
}

const overloaded503 = `{"error":{"message":"overloaded","type":"server_error"}}`

// ---------------------------------------------------------------------
// Defects a breaker found, each seen failing before its fix
// ---------------------------------------------------------------------

// docs/routing.md: "At most one hedge per request." A hedged pair that both fail
// sends the request on to its next attempt, and exchange hedges that one
// too: here a slow a is hedged on b, both fail, the slow c is hedged on
// d: two hedges (and a request that made 4 attempts for one answer).
func TestBreakerAtMostOneHedgePerRequest(t *testing.T) {
	c := newFakeClock()
	ga, gb := newGate(reply(503, overloaded503)), newGate(reply(503, overloaded503))
	gc := newGate(reply(200, okBody))
	a, b := replies(ga.reply), replies(gb.reply)
	cs := replies(gc.reply)
	d := replies(reply(200, okBody))
	da, db, dc, dd := deployment("a", a), deployment("b", b), deployment("c", cs), deployment("d", d)
	da.Quality, db.Quality, dc.Quality, dd.Quality = 1, 0.9, 0.8, 0.7
	r, obs := hedgeRouter(c)
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db, dc, dd}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	eventually(t, "the first hedge", func() bool { return b.calls.Load() == 1 })
	close(ga.open)
	close(gb.open)
	eventually(t, "c's attempt", func() bool { return cs.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	var res *Result
	select {
	case res = <-done:
	case <-time.After(200 * time.Millisecond):
		close(gc.open)
		res = <-done
	}
	obs.mu.Lock()
	hedges := 0
	for _, h := range obs.hedges {
		if !strings.HasPrefix(h, "won ") {
			hedges++
		}
	}
	all := append([]string(nil), obs.hedges...)
	obs.mu.Unlock()
	if hedges > 1 {
		t.Errorf("expected one hedge at most, got %d: %v (attempts %d, d asked %d)", hedges, all, res.Attempts, d.calls.Load())
	}
	inFlightZero(t, c, da, db, dc, dd)
}

// Tiers: "a deployment of tier n+1 is tried only when none of tier n or
// lower can serve the request". The hedge picks among every candidate
// with capacity now, tiers aside: a tier-2 deployment (the expensive
// backup) is hedged on although a tier-1 deployment is ready.
func TestBreakerHedgeIgnoresTiers(t *testing.T) {
	c := newFakeClock()
	slow := newGate(reply(200, okBody))
	a := replies(slow.reply)
	b := replies(reply(200, okBody))
	cs := replies(reply(200, okBody))
	da, db, dc := deployment("a", a), deployment("b", b), deployment("c", cs)
	da.Quality, db.Quality, dc.Quality = 1, 1, 0
	db.Tier = 2
	r, _ := hedgeRouter(c)
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db, dc}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	res := <-done
	if b.calls.Load() != 0 || cs.calls.Load() != 1 {
		t.Errorf("expected the hedge on c (tier 1, ready), not b (tier 2); b asked %d, c %d, answered by %s", b.calls.Load(), cs.calls.Load(), res.Deployment.Name)
	}
	close(slow.open)
	inFlightZero(t, c, da, db, dc)
}

// A hedged pair of streams whose loser had its first content by the time
// it was cancelled (its answer was on its way): drop closes the loser's
// stream, but its trace span was never handed to the stream (settle does
// that for the winner only), so the loser's attempt span never ends and
// is never exported.
func TestBreakerHedgeLoserStreamSpanNeverEnds(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	c := newFakeClock()
	slow := newDeafGate(sse(textChunk("a", "Hi from a"), finalChunk("a"), "data: [DONE]"))
	a := replies(slow.reply)
	b := replies(sse(textChunk("b", "Hi from b"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r, _ := hedgeRouter(c)
	ctx, parent := tp.Tracer("test").Start(context.Background(), "POST /v1/chat/completions")
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(ctx, []*Deployment{da, db}, streamReq(helloReq)) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	eventually(t, "the hedge", func() bool { return b.calls.Load() == 1 })
	time.Sleep(20 * time.Millisecond)
	close(slow.open) // a's answer arrives after b won
	res := <-done
	if res.Stream == nil || res.Deployment != db {
		t.Fatalf("expected b's stream, got %v %v", res.Err, res.Deployment)
	}
	if _, err := relay(t, res.Stream); err != nil {
		t.Fatal(err)
	}
	parent.End()
	var ended []string
	for _, s := range exp.GetSpans().Snapshots() {
		ended = append(ended, s.Name())
	}
	if len(ended) != 3 {
		t.Errorf("expected 3 ended spans (the request's, a's, b's), got %q", ended)
	}
	inFlightZero(t, c, da, db)
}

// ---------------------------------------------------------------------
// What held
// ---------------------------------------------------------------------

// The client leaves while both attempts of a hedged pair wait: the
// request ends with ErrClientGone, both attempts are cancelled, both
// claims released, no goroutine left.
func TestBreakerClientLeavesDuringAHedge(t *testing.T) {
	before := runtime.NumGoroutine()
	c := newFakeClock()
	ga, gb := newGate(reply(200, okBody)), newGate(reply(200, okBody))
	a, b := replies(ga.reply), replies(gb.reply)
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	r, _ := hedgeRouter(c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(ctx, []*Deployment{da, db}, streamReq(helloReq)) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	eventually(t, "the hedge", func() bool { return b.calls.Load() == 1 })
	cancel()
	res := <-done
	if !errors.Is(res.Err, ErrClientGone) || res.Stream != nil {
		t.Errorf("expected ErrClientGone, got %v", res.Err)
	}
	if ga.cancelled.Load() != 1 || gb.cancelled.Load() != 1 {
		t.Errorf("expected both attempts cancelled, got a %d b %d", ga.cancelled.Load(), gb.cancelled.Load())
	}
	for _, d := range []*Deployment{da, db} {
		if s := d.State.Snapshot(c.Now()); s.InFlight != 0 || s.ConsecutiveFailures != 0 {
			t.Errorf("%s: %d in flight, %d failures", d.Name, s.InFlight, s.ConsecutiveFailures)
		}
	}
	eventually(t, "goroutines back", func() bool { return runtime.NumGoroutine() <= before })
}

// The deadline passes while a hedged pair waits: a 504, both claims
// released, neither deployment blamed for the request's deadline.
func TestBreakerDeadlineDuringAHedge(t *testing.T) {
	c := newFakeClock()
	a, b := replies(hang), replies(hang)
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	da.TTFTTimeout, db.TTFTTimeout = time.Minute, time.Minute
	r, _ := hedgeRouter(c)
	r.Deadline = 10 * time.Second
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq)) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	eventually(t, "the hedge", func() bool { return b.calls.Load() == 1 })
	c.Advance(9 * time.Second)
	res := <-done
	if e, ok := res.Err.(*Error); !ok || e.Status != http.StatusGatewayTimeout {
		t.Errorf("expected a 504, got %v", res.Err)
	}
	inFlightZero(t, c, da, db)
}

// No hedge with max_attempts 1, with a single deployment, or with a
// Pinned request (whose only deployment is busy with it).
func TestBreakerNoHedgeWhenNotAllowed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    int
		single bool
		pinned bool
	}{{"max_attempts 1", 1, false, false}, {"one deployment", 4, true, false}, {"pinned", 4, false, true}} {
		c := newFakeClock()
		slow := newGate(reply(200, okBody))
		a := replies(slow.reply)
		b := replies(reply(200, okBody))
		da, db := deployment("a", a), deployment("b", b)
		da.Quality = 1
		group := []*Deployment{da, db}
		if tc.single {
			group = group[:1]
		}
		r, obs := hedgeRouter(c)
		r.MaxAttempts = tc.max
		req := &Request{Request: chatReq.Request, Tokens: 10}
		if tc.pinned {
			req.Pinned = da
		}
		done := make(chan *Result, 1)
		go func() { done <- r.Serve(context.Background(), group, req) }()
		eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
		c.Advance(5 * time.Second)
		time.Sleep(20 * time.Millisecond)
		close(slow.open)
		res := <-done
		obs.mu.Lock()
		if res.Err != nil || res.Hedge != "" || b.calls.Load() != 0 || len(obs.hedges) != 0 {
			t.Errorf("%s: expected no hedge, got %v %q, b asked %d, hedges %v", tc.name, res.Err, res.Hedge, b.calls.Load(), obs.hedges)
		}
		obs.mu.Unlock()
		inFlightZero(t, c, da, db)
	}
}

// Both attempts of a hedged pair answer at once: one answer, the other
// observed (it spoke for its deployment) and released; repeated many
// times so that either may come first.
func TestBreakerHedgedPairAnsweringTogether(t *testing.T) {
	for i := 0; i < 50; i++ {
		c := newFakeClock()
		gate := make(chan struct{})
		hold := func(req *http.Request) (*http.Response, error) { <-gate; return reply(200, okBody)(req) }
		a, b := replies(hold), replies(hold)
		da, db := deployment("a", a), deployment("b", b)
		da.Quality = 1
		for _, d := range []*Deployment{da, db} { // held: a claim released twice would show
			d.State.AcquireFor(c.Now(), capacity.Need{Tokens: 1})
		}
		r, _ := hedgeRouter(c)
		done := make(chan *Result, 1)
		go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, chatReq) }()
		eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
		c.Advance(2 * time.Second)
		eventually(t, "the hedge", func() bool { return b.calls.Load() == 1 })
		close(gate)
		res := <-done
		if res.Err != nil || res.Attempts != 2 || (res.Hedge != HedgeWon && res.Hedge != HedgeLost) ||
			(res.Hedge == HedgeWon) != (res.Deployment == db) {
			t.Fatalf("run %d: %v %d %q %v", i, res.Err, res.Attempts, res.Hedge, res.Deployment)
		}
		for _, d := range []*Deployment{da, db} {
			if s := d.State.Snapshot(c.Now()); s.InFlight != 1 {
				t.Fatalf("run %d: %s: expected the held claim alone in flight, got %d", i, d.Name, s.InFlight)
			}
		}
	}
}

// A stream won by a hedge that then breaks is resumed like any other;
// the lost attempt's claim is released.
func TestBreakerHedgedStreamIsResumed(t *testing.T) {
	c := newFakeClock()
	slow := newGate(sse(textChunk("a", "late"), finalChunk("a"), "data: [DONE]"))
	a := replies(slow.reply)
	b := replies(cut(textChunk("b", "Hello, "), textChunk("b", "wor")))
	cs := replies(sse(textChunk("c", "ld!"), finalChunk("c"), "data: [DONE]"))
	da, db, dc := deployment("a", a), deployment("b", b), deployment("c", cs)
	da.Quality, db.Quality = 1, 0.9
	dc.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	r, _ := hedgeRouter(c)
	r.Resume = ResumeAny
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db, dc}, streamReq(helloReq)) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	res := <-done
	if res.Stream == nil || res.Deployment != db || res.Hedge != HedgeWon {
		t.Fatalf("expected b's stream, got %v %v %q", res.Err, res.Deployment, res.Hedge)
	}
	got, err := relay(t, res.Stream)
	text, ids, finishes, dones, _ := chatText(t, got)
	if err != nil || text != "Hello, world!" || len(ids) != 1 || finishes != 1 || dones != 1 {
		t.Errorf("got %q %v %d %d %v", text, ids, finishes, dones, err)
	}
	if res.Stream.Resumes() != 1 || cs.calls.Load() != 1 {
		t.Errorf("expected one resume on c, got %d, c asked %d", res.Stream.Resumes(), cs.calls.Load())
	}
	eventually(t, "a cancelled", func() bool { return slow.cancelled.Load() == 1 })
	inFlightZero(t, c, da, db, dc)
}

// The first attempt fails at the very moment the hedge fires (its 503
// and the timer race): whichever way it goes, b answers, nothing hangs,
// every claim is released, a's failure is counted once at most (not at
// all when b answered first and a was cancelled).
func TestBreakerPrimaryFailsAsTheHedgeStarts(t *testing.T) {
	for i := 0; i < 100; i++ {
		c := newFakeClock()
		ga := newGate(reply(503, overloaded503))
		a, b := replies(ga.reply), replies(reply(200, okBody))
		da, db := deployment("a", a), deployment("b", b)
		da.Quality = 1
		r, _ := hedgeRouter(c)
		done := make(chan *Result, 1)
		go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, chatReq) }()
		eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
		go close(ga.open)
		c.Advance(2 * time.Second)
		select {
		case res := <-done:
			if res.Err != nil || res.Deployment != db || b.calls.Load() != 1 {
				t.Fatalf("run %d: expected b's answer, got %v %v, b asked %d", i, res.Err, res.Deployment, b.calls.Load())
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("run %d: hung", i)
		}
		inFlightZero(t, c, da, db)
		if s := da.State.Snapshot(c.Now()); s.ConsecutiveFailures > 1 {
			t.Fatalf("run %d: expected a's failure counted once at most, got %d", i, s.ConsecutiveFailures)
		}
	}
}

// max_attempts 2: the hedge is the second attempt; when both fail, no
// third is made (a 502, two attempts). With the best other deployment
// rate-limited, the hedge goes to the next one with capacity now.
func TestBreakerHedgeWithinMaxAttemptsAndCapacity(t *testing.T) {
	c := newFakeClock()
	ga, gb := newGate(reply(503, overloaded503)), newGate(reply(503, overloaded503))
	a, b, third := replies(ga.reply), replies(gb.reply), replies(reply(200, okBody))
	da, db, dc := deployment("a", a), deployment("b", b), deployment("c", third)
	da.Quality, db.Quality = 1, 0.9
	r, _ := hedgeRouter(c)
	r.MaxAttempts = 2
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db, dc}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	eventually(t, "the hedge", func() bool { return b.calls.Load() == 1 })
	close(ga.open)
	close(gb.open)
	res := <-done
	if e, ok := res.Err.(*Error); !ok || e.Status != http.StatusBadGateway || res.Attempts != 2 || third.calls.Load() != 0 {
		t.Errorf("expected a 502 after 2 attempts, got %v, %d attempts, c asked %d", res.Err, res.Attempts, third.calls.Load())
	}
	inFlightZero(t, c, da, db, dc)

	c = newFakeClock()
	slow := newGate(reply(200, okBody))
	a, b, third = replies(slow.reply), replies(reply(200, okBody)), replies(reply(200, okBody))
	da, db, dc = deployment("a", a), deployment("b", b), deployment("c", third)
	da.Quality, db.Quality = 1, 0.9
	r, _ = hedgeRouter(c)
	db.State.Observe(c.Now(), provider.Observation{Class: provider.RateLimited, RetryAfter: time.Minute}, r.Policy)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db, dc}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	res = <-done
	if res.Err != nil || res.Deployment != dc || b.calls.Load() != 0 || res.Hedge != HedgeWon {
		t.Errorf("expected the hedge on c to answer, got %v %v %q, b asked %d", res.Err, res.Deployment, res.Hedge, b.calls.Load())
	}
	close(slow.open)
	inFlightZero(t, c, da, db, dc)
}
