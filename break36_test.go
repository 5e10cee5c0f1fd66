package llmrouter

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// alwaysCountLimited is an Anthropic account whose token counting is
// over its own limit (every count_tokens request is answered 429 with
// Anthropic's rate_limit_error body and retry-after 20, as
// testdata/count/anthropic-count-429.http without its far reset), while
// its Messages requests are answered 200 (countLimitedAccount's).
func alwaysCountLimited(t *testing.T) (*countLimitedAccount, *httptest.Server) {
	a := &countLimitedAccount{counts: 1}
	serve := a.serve(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/messages/count_tokens" {
			a.mu.Lock()
			a.counts++
			a.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("retry-after", "20")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests has exceeded your per-minute rate limit for token counting."}}`))
			return
		}
		serve(w, r)
	}))
	t.Cleanup(srv.Close)
	return a, srv
}

// A count of tokens that waits for the count's own limit (a count_tokens
// 429's retry-after) does not hold up the Messages requests of its model
// group, whose limits are separate (docs.anthropic.com, "Token
// counting"): a Messages request that arrives while the count waits is
// served at once, not queued behind it.
func TestWaitingCountDoesNotHoldUpMessages(t *testing.T) {
	acct, srv := alwaysCountLimited(t)
	h := handlerFromCaddyfile(t, `llm_router {
		provider a {
			type anthropic
			base_url `+srv.URL+`/v1
			api_key sk-ant-a
		}
		model solo {
			deployment a claude-x
		}
	}`)
	defer h.Cleanup()
	clock := newBGClock()
	h.router.Clock = clock
	count := func() int {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON("/v1/messages/count_tokens", `{"model":"solo","messages":[{"role":"user","content":"Count these words."}]}`), nil)
		return w.Code
	}
	count()                           // its 429s cool the deployment's counts (answered with an estimate)
	h.router.Clock = heldClock{clock} // from now on a wait lasts until the clock is advanced
	countDone := make(chan int, 1)
	go func() { countDone <- count() }()
	g := h.groups["solo"]
	for i := 0; g.Queued() == 0; i++ {
		if i == 500 {
			t.Fatalf("the count did not wait for its limit (queued %d, counts asked %d)", g.Queued(), acct.counts)
		}
		time.Sleep(10 * time.Millisecond)
	}
	msgDone := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON("/v1/messages", `{"model":"solo","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`), nil)
		msgDone <- w
	}()
	ended := false
	select {
	case w := <-msgDone:
		ended = true
		if w.Code != 200 || w.Header().Get(HeaderAttempts) != "1" {
			t.Errorf("the Messages request: expected 200 at once, got %d %v %s", w.Code, w.Header(), w.Body)
		}
	case <-time.After(5 * time.Second):
		acct.mu.Lock()
		n := acct.messages
		acct.mu.Unlock()
		t.Errorf("the Messages request waited behind the count's own limit (Messages asked %d times, %d queued, no time passed on the clock)", n, g.Queued())
	}
	advanceUntil(t, clock, 2*time.Minute, func() { <-countDone })
	if !ended {
		<-msgDone
	}
}

// advanceUntil advances c by step until wait returns, at most 100 times:
// a request woken by an Advance that sleeps again once the Advance has
// returned waits for the next one (a single Advance then a wait hung, 1
// run in 6 of TestWaitingCountDoesNotHoldUpMessages).
func advanceUntil(t *testing.T, c *bgClock, step time.Duration, wait func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { wait(); close(done) }()
	for i := 0; ; i++ {
		c.Advance(step)
		select {
		case <-done:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if i == 100 {
			t.Fatalf("still waiting after 100 steps of %v on the clock", step)
		}
	}
}

// heldClock is a bgClock whose Sleep lasts until Advance passes it (or
// ctx ends), so that a request that waits stays waiting.
type heldClock struct{ *bgClock }

func (c heldClock) Sleep(ctx context.Context, d time.Duration) error {
	done := make(chan struct{})
	t := c.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
	case <-ctx.Done():
		t.Stop()
	}
	return ctx.Err()
}

// A request whose client goes away before its answer came was billed by
// its provider all the same (its prompt, and the output it went on
// generating: PROVIDERS.md, "Billing"), and the router charges the
// deployment's budget for it (its prompt and max_tokens): the consumer's
// budget is charged as much, not released at nothing, so that a client
// that always hangs up never spends its budget.
func TestConsumerBudgetChargesARequestItsClientLeft(t *testing.T) {
	u := newHeldUpstream(t)
	h := handlerFromJSON(t, `{
		"providers": {"oa": {"type": "openai", "base_url": "`+u.URL+`/v1", "api_key": "sk-provider-key"}},
		"models": {"fast": {"deployments": [{"provider": "oa", "model": "m1", "cost_input": 1000, "cost_output": 1000}]}},
		"consumer": "{http.request.header.X-Team}",
		"plans": {"default": {"budget": {"usd": 1.5, "per": 3600000000000}}}}`)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	// Its prompt and max_tokens 1000 at $0.001 a token: about $1.02.
	body := `{"model":"fast","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`
	alice := http.Header{"X-Team": {"alice"}}
	r := postJSON("/v1/chat/completions", body)
	r.Header.Set("X-Team", "alice")
	caddyhttp.NewTestReplacer(r) // the http.request.* placeholders, as askAs
	ctx, hangUp := context.WithCancel(r.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = h.ServeHTTP(httptest.NewRecorder(), r.WithContext(ctx), nil)
	}()
	if !settledWithin(func() bool { return u.arrived.Load() == 1 }) {
		t.Fatal("the request never reached the provider")
	}
	hangUp()
	<-done
	var spent float64
	for _, use := range h.Consumers.registry.Report(h.router.Clock.Now()) {
		if use.Consumer == "alice" {
			spent = use.SpentUSD
		}
	}
	if spent < 1 {
		t.Errorf("alice's budget: expected the left request's prompt and max_tokens (about $1.02) spent, got $%.4f", spent)
	}
	// Spent $1.02 of $1.5: the next is admitted, and its answer (about
	// $0.01) leaves about $0.47; the one after that holds its worst case
	// again.
	u.open()
	if w, _, _ := askAs(h, "/v1/chat/completions", body, alice); w.Code != http.StatusOK {
		t.Errorf("the next request: expected 200, got %d %s", w.Code, w.Body)
	}
}

// Counts of tokens waiting for their own limit are no demand on their
// deployments' Messages windows: a Messages request that waits behind
// them for its window's reset is not told at once that the window cannot
// serve it in time (the forecast's early 429) for the counts before it.
func TestWaitingCountsAreNoDemandOnMessagesWindows(t *testing.T) {
	clock := newBGClock()
	var messages atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/messages/count_tokens" {
			w.Header().Set("retry-after", "20")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests has exceeded your per-minute rate limit for token counting."}}`))
			return
		}
		// Messages: one a window of 30 s on the router's clock, the
		// first one spent it.
		messages.Add(1)
		w.Header().Set("anthropic-ratelimit-requests-limit", "1")
		w.Header().Set("anthropic-ratelimit-requests-remaining", "0")
		w.Header().Set("anthropic-ratelimit-requests-reset", clock.Now().Add(30*time.Second).UTC().Format(time.RFC3339))
		_, _ = w.Write([]byte(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":2}}`))
	}))
	t.Cleanup(srv.Close)
	h := handlerFromCaddyfile(t, `llm_router {
		provider a {
			type anthropic
			base_url `+srv.URL+`/v1
			api_key sk-ant-a
		}
		model solo {
			deployment a claude-x {
				rpm 2
			}
		}
	}`)
	defer h.Cleanup()
	h.router.Clock = clock
	ask := func(path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON(path, body), nil)
		return w
	}
	const msg = `{"model":"solo","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	const count = `{"model":"solo","messages":[{"role":"user","content":"Count these words."}]}`
	ask("/v1/messages/count_tokens", count) // its 429s cool the counts (answered with an estimate)
	if w := ask("/v1/messages", msg); w.Code != 200 {
		t.Fatalf("the first Messages request: %d %s", w.Code, w.Body)
	}
	h.router.Clock = heldClock{clock}
	g := h.groups["solo"]
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); ask("/v1/messages/count_tokens", count) }()
	}
	for i := 0; g.Queued() < 4; i++ {
		if i == 500 {
			t.Fatalf("the counts did not wait for their limit (queued %d)", g.Queued())
		}
		time.Sleep(10 * time.Millisecond)
	}
	msgDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { msgDone <- ask("/v1/messages", msg) }()
	select {
	case w := <-msgDone:
		t.Errorf("the Messages request was answered before its window's reset: %d %v %s", w.Code, w.Header(), w.Body)
		msgDone <- w
	case <-time.After(time.Second):
	}
	clock.Advance(31 * time.Second)
	if w := <-msgDone; w.Code != 200 {
		t.Errorf("the Messages request after its window's reset: expected 200, got %d %s", w.Code, w.Body)
	}
	advanceUntil(t, clock, 2*time.Minute, wg.Wait)
}
