package router

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// asleepE counts the Sleeps under way on c (timer set, context live).
func asleepE(c *manualClock) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for sl := range c.sleeps {
		if sl.t.set && sl.ctx.Err() == nil {
			n++
		}
	}
	return n
}

// A request queued behind a slow-starting deployment's four attempts in
// flight is woken as soon as one of them ends (a 400 passed on, which
// teaches nothing of capacity): it does not sleep out its wait.
func TestAnEndedAttemptWakesTheQueue(t *testing.T) {
	c := newManualClock()
	r := New()
	r.Clock, r.Rand = c, func() float64 { return 0 }
	gates := make([]chan struct{}, 4)
	replies := make([]func(*http.Request) (*http.Response, error), 5)
	for i := range gates {
		gates[i] = make(chan struct{})
		replies[i] = func(req *http.Request) (*http.Response, error) {
			<-gates[i]
			return reply(400, `{"error":{"message":"bad request","type":"invalid_request_error"}}`)(req)
		}
	}
	replies[4] = reply(200, okBody)
	s := &script{replies: replies}
	g := &Group{Name: "g", Deployments: []*Deployment{deployment("a", s)}}
	done := make(chan *Result, 5)
	serve := func() { done <- r.ServeGroup(context.Background(), g, chatReq) }
	for range 4 {
		go serve()
	}
	eventually(t, "four attempts in flight", func() bool { return s.calls.Load() == 4 })
	go serve()
	eventually(t, "the fifth request asleep in the queue", func() bool { return asleepE(c) == 1 && g.Queued() == 1 })
	close(gates[0])
	eventually(t, "the fifth request's attempt, with the clock still", func() bool { return s.calls.Load() == 5 })
	for _, gt := range gates[1:] {
		close(gt)
	}
	for range 5 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a request did not end")
		}
	}
}

// A Chat Completions client of an Anthropic deployment that thinks first
// gets no event for the thinking (its first content has nothing to relay):
// the text, the finish and the end, and no empty event.
func TestThinkingFirstRelaysNoEmptyEvent(t *testing.T) {
	think := brkEv("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Hmm"}}`)
	d := claude(deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){
		sse(brkStart("m", 10), brkBlockStart(0, "thinking"), think, brkBlockStop(0), brkBlockStart(1, "text"), brkDelta(1, "Hi"),
			brkBlockStop(1), brkMsgDelta("end_turn", 5), brkMsgStop)}}))
	res := newRouter(newFakeClock()).Serve(context.Background(), []*Deployment{d}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	got, err := relay(t, res.Stream)
	if err != nil || len(got) != 3 || got[2] != "[DONE]" {
		t.Fatalf("expected the text, the finish and [DONE], got %q %v", got, err)
	}
	for _, g := range got {
		if g == "" {
			t.Errorf("an empty event was relayed: %q", got)
		}
	}
}

// debugLinesE counts the log lines of msg.
func debugLinesE(logs *observer.ObservedLogs, msg string) int {
	return logs.FilterMessage(msg).Len()
}

const noStreamLineE = "a resume's attempts found no stream"

// A stream broken twice: the second attempt, which stated no usage, is
// estimated on the text it relayed itself (not the text before it), and
// the resumes that found a stream log no failure to find one.
func TestASecondBreakIsEstimatedOnItsOwnText(t *testing.T) {
	bText := "ld, and then a much longer continuation of it"
	a := replies(cut(roleChunk("a"), textChunk("a", "Hello, "), textChunk("a", "wor")))
	b := replies(cut(roleChunk("b"), textChunk("b", bText)))
	c := replies(sse(roleChunk("c"), textChunk("c", "!"), finalChunk("c"), usageChunk("c", 50, 2), "data: [DONE]"))
	da, db, dc := deployment("a", a), deployment("b", b), deployment("c", c)
	da.Quality, db.Quality = 1, 0.5
	for _, d := range []*Deployment{db, dc} {
		d.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	}
	core, logs := observer.New(zapcore.DebugLevel)
	r := newRouter(newFakeClock())
	r.Logger = zap.New(core)
	r.Resume = ResumeAny
	res := r.Serve(context.Background(), []*Deployment{da, db, dc}, streamReq(helloReq))
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	got, err := relay(t, res.Stream)
	if text, _, _, _, _ := chatText(t, got); err != nil || text != "Hello, world, and then a much longer continuation of it!" {
		t.Fatalf("expected the stream resumed twice, got %q %v", text, err)
	}
	legs := res.Stream.Legs()
	if len(legs) != 3 || legs[1].Deployment != db || legs[1].Stated {
		t.Fatalf("expected a's, b's and c's legs, got %+v", legs)
	}
	if want := int64(len(bText)+3) / 4; legs[1].Usage.OutputTokens != want {
		t.Errorf("expected b's %d bytes estimated at %d tokens, got %d", len(bText), want, legs[1].Usage.OutputTokens)
	}
	if n := debugLinesE(logs, noStreamLineE); n != 0 {
		t.Errorf("the resumes found their streams, yet %d lines say they found none", n)
	}
}

// A stream broken with attempts left for the replay alone is replayed,
// without a continuation looked for (its attempts would be none), nor any
// line of attempts that found no stream; with none left at all, no
// resume is looked for either.
func TestNoContinuationWithOnlyTheReplaysAttempt(t *testing.T) {
	for _, max := range []int{2, 1} {
		a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wo")))
		b := replies(sse(textChunk("b", "Hello, world!"), finalChunk("b"), "data: [DONE]"))
		da, db := deployment("a", a), deployment("b", b)
		da.Quality, db.Model = 1, da.Model
		db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
		core, logs := observer.New(zapcore.DebugLevel)
		r := newRouter(newFakeClock())
		r.Logger = zap.New(core)
		r.Resume = ResumeAny
		r.MaxAttempts = max
		res := r.Serve(context.Background(), []*Deployment{da, db}, streamReq(helloReq))
		if res.Stream == nil {
			t.Fatalf("expected a stream, got %v", res.Err)
		}
		got, err := relay(t, res.Stream)
		text, _, _, _, _ := chatText(t, got)
		if max == 2 && (err != nil || text != "Hello, world!" || b.calls.Load() != 1) {
			t.Errorf("max %d: expected b's replay, got %q %v after %d attempts on b", max, text, err, b.calls.Load())
		}
		if max == 1 && (err == nil || b.calls.Load() != 0) {
			t.Errorf("max %d: expected the in-band error and no attempt on b, got %v, %d", max, err, b.calls.Load())
		}
		if n := debugLinesE(logs, noStreamLineE); n != 0 {
			t.Errorf("max %d: no resume attempt could be made, yet %d lines say attempts found no stream", max, n)
		}
	}
}

// A resume treats every context window as large enough until a
// context_length failure says otherwise, even the smallest (1 token, of a
// request of 1).
func TestAResumeKnowsNoWindowTooSmall(t *testing.T) {
	a := replies(cut(textChunk("a", "Hello, "), textChunk("a", "wor")))
	b := replies(sse(textChunk("b", "ld!"), finalChunk("b"), "data: [DONE]"))
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	db.ContextWindow = 1
	db.Provider.(*adapters.OpenAI).Continuation = provider.PrefixFlag
	r := newRouter(newFakeClock())
	r.Resume = ResumeAny
	req := streamReq(helloReq)
	req.Tokens, req.PromptTokens = 1, 1
	res := r.Serve(context.Background(), []*Deployment{da, db}, req)
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	got, err := relay(t, res.Stream)
	if text, _, _, _, _ := chatText(t, got); err != nil || text != "Hello, world!" {
		t.Errorf("expected b to continue it, got %q %v", text, err)
	}
}

// A hedge is never a half-open deployment's probe: with the probe's
// deployment next to the slow attempt's in the group, the hedge goes to
// the other one, however well the probe's deployment scores.
func TestAHedgeSkipsTheProbe(t *testing.T) {
	c := newFakeClock()
	slow := newGate(reply(200, okBody))
	a := &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
	p, q := okScriptE(), okScriptE()
	da, dp, dq := deployment("a", a), deployment("p", p), deployment("q", q)
	da.Quality, dp.Quality = 1, 1
	dq.CostInput, dq.CostOutput = 100, 300
	r, _ := hedgeRouter(c)
	failed := provider.NewObservation(provider.Server)
	dp.State.Observe(c.Now(), failed, r.Policy) // open for its backoff (500 ms), half-open after
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, dp, dq}, chatReq) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	eventually(t, "the hedge", func() bool { return p.calls.Load()+q.calls.Load() == 1 })
	res := <-done
	if p.calls.Load() != 0 || res.Deployment != dq || res.Hedge != HedgeWon {
		t.Errorf("expected the hedge on q to win and p untouched, got %v %q, p %d", res.Deployment, res.Hedge, p.calls.Load())
	}
	eventually(t, "a cancelled", func() bool { return slow.cancelled.Load() == 1 })
}

// A half-open deployment's probe that loses a hedge with its stream
// already begun frees the probe when its stream is closed, and wakes the
// request queued for that probe at once (no sleep until it looks again).
func TestALosingProbeStreamWakesTheQueue(t *testing.T) {
	c := newManualClock()
	r := New()
	r.Clock, r.Rand = c, func() float64 { return 0 }
	r.HedgeAfter = 2 * time.Second
	streamed := sse(chunk, final, "data: [DONE]")
	pGate, qGate := make(chan struct{}), make(chan struct{})
	var pReq atomic.Pointer[http.Request]
	p := replies(func(req *http.Request) (*http.Response, error) {
		pReq.Store(req)
		<-pGate // answers even when cancelled meanwhile: a stream already under way
		return streamed(req)
	}, reply(200, okBody))
	q := replies(func(req *http.Request) (*http.Response, error) { <-qGate; return streamed(req) })
	dp, dq := deployment("p", p), deployment("q", q)
	dp.State.Observe(c.Now(), provider.NewObservation(provider.Server), r.Policy) // open for 500 ms
	withWindows(t, dq, c.Now(), provider.Window{Limit: 1, Remaining: 1, Reset: time.Hour}, provider.UnknownWindow)
	c.advanceTo(c.Now().Add(time.Second)) // p half-open: its probe is the next attempt
	g := &Group{Name: "g", Deployments: []*Deployment{dp, dq}}
	first := make(chan *Result, 1)
	go func() {
		first <- r.ServeGroup(context.Background(), g, &Request{Request: wire(chatReq.Body, true), Tokens: 10})
	}()
	eventually(t, "the probe on p", func() bool { return p.calls.Load() == 1 })
	c.advanceTo(c.Now().Add(2 * time.Second))
	eventually(t, "the hedge on q", func() bool { return q.calls.Load() == 1 })
	second := make(chan *Result, 1)
	go func() { second <- r.ServeGroup(context.Background(), g, chatReq) }()
	eventually(t, "the second request asleep in the queue", func() bool { return asleepE(c) == 1 && g.Queued() == 1 })
	close(qGate) // q's stream wins: p's attempt is cancelled...
	eventually(t, "p's attempt cancelled", func() bool { return pReq.Load() != nil && pReq.Load().Context().Err() != nil })
	close(pGate) // ...but its stream had begun: dropped, closed
	res := <-first
	if res.Deployment != dq || res.Hedge != HedgeWon || res.Stream == nil {
		t.Fatalf("expected q's stream to win the hedge, got %v %q %v", res.Deployment, res.Hedge, res.Err)
	}
	eventually(t, "the second request's probe of p, with the clock still", func() bool { return p.calls.Load() == 2 })
	res.Stream.Close()
	select {
	case res := <-second:
		if res.Deployment != dp || res.Err != nil {
			t.Errorf("expected p to answer the second request, got %v %v", res.Deployment, res.Err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second request did not end")
	}
}
