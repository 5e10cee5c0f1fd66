package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// nameOf is d's name, "none" for nil.
func nameOf(d *Deployment) string {
	if d == nil {
		return "none"
	}
	return d.Name
}

// The group smart: tier 1 is east (429, Retry-After 30, past the
// 20 s deadline) and west (500 on every request); tier 2 claude is
// healthy; the fallback group cheap is healthy; max_attempts 4. No
// request goes to a deployment that failed it, or to one cooling past its
// deadline, while another is untried; none waits. (The second request
// went to west four times with backoff over 7.6 s and got 502, neither
// claude nor cheap tried.)
func TestFailoverNeverRetriesWhileAnotherIsUntried(t *testing.T) {
	setup := func(claudeFails bool) (*Router, *Group, *fakeClock, map[string]*script) {
		clock := newFakeClock()
		r := newRouter(clock)
		r.Deadline, r.MaxAttempts = 20*time.Second, 4
		s := map[string]*script{
			"east":   dScript(reply(429, rateLimited, "Retry-After", "30")),
			"west":   dScript(reply(500, `{"error":{"message":"boom","type":"server_error"}}`)),
			"claude": dScript(reply(200, okBody)),
			"cheap":  dScript(reply(200, okBody)),
		}
		if claudeFails {
			s["claude"] = dScript(reply(500, `{"error":{"message":"boom","type":"server_error"}}`))
		}
		east, west, claude := deployment("east", s["east"]), deployment("west", s["west"]), deployment("claude", s["claude"])
		claude.Tier = 2
		g := NewGroup("smart", []*Deployment{east, west, claude})
		g.Fallback = NewGroup("cheap", []*Deployment{deployment("cheap", s["cheap"])})
		return r, g, clock, s
	}
	check := func(t *testing.T, r *Router, g *Group, clock *fakeClock, s map[string]*script, want string) {
		t.Helper()
		for n := range 4 {
			before := map[string]int32{}
			for k, v := range s {
				before[k] = v.calls.Load()
			}
			start := clock.Now()
			res := r.ServeGroup(context.Background(), g, chatReq)
			if res.Err != nil || res.Status != 200 || res.Deployment == nil || res.Deployment.Name != want {
				t.Fatalf("request %d: expected %s to answer 200, got %v %d from %v", n+1, want, res.Err, res.Status, res.Deployment)
			}
			if took := clock.Now().Sub(start); took != 0 {
				t.Errorf("request %d: expected no wait, took %v (waits %v)", n+1, took, clock.Sleeps())
			}
			for k, v := range s {
				if d := v.calls.Load() - before[k]; d > 1 {
					t.Errorf("request %d: expected at most one attempt on %s, got %d", n+1, k, d)
				}
			}
			clock.Advance(time.Second) // west's backoff passes: it may be probed again
		}
	}
	t.Run("the next tier", func(t *testing.T) {
		r, g, clock, s := setup(false)
		check(t, r, g, clock, s, "claude")
		if n := s["east"].calls.Load(); n != 1 {
			t.Errorf("expected east asked once (its Retry-After passes the deadline), got %d", n)
		}
	})
	t.Run("the fallback group", func(t *testing.T) {
		r, g, clock, s := setup(true)
		check(t, r, g, clock, s, "cheap")
	})
}

// Six deployments of which five have revoked keys (401, 403) or a spent
// balance (402), max_attempts 4: the healthy sixth serves the first
// request. A certain refusal spends none of the attempts (it is tried
// once: its circuit opens); failures that may pass still do. (The first
// request got 502 and the sixth was never tried.)
func TestRefusedKeysSpendNoAttempts(t *testing.T) {
	revoked := []*script{
		dScript(reply(401, `{"error": {"message": "Incorrect API key provided: sk-FAKE****.", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}`)),
		dScript(reply(403, `{"error": {"message": "Project proj_FAKE does not have access to model gpt-4o", "type": "invalid_request_error", "param": null, "code": "model_not_found"}}`)),
		dScript(reply(402, `{"error": {"message": "Insufficient Balance", "type": "unknown_error", "param": null, "code": "invalid_request_error"}}`)),
		dScript(reply(401, `{"error": {"message": "Incorrect API key provided: sk-FAKE****.", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}`)),
		dScript(reply(403, `{"error": {"message": "Project proj_FAKE does not have access to model gpt-4o", "type": "invalid_request_error", "param": null, "code": "model_not_found"}}`)),
	}
	healthy := dScript(reply(200, okBody))
	var group []*Deployment
	for i, s := range revoked {
		group = append(group, deployment(string(rune('a'+i)), s))
	}
	group = append(group, deployment("f", healthy))
	r := newRouter(newFakeClock())
	r.MaxAttempts = 4
	res := r.Serve(context.Background(), group, chatReq)
	if res.Err != nil || res.Deployment != group[5] || res.Attempts != 6 {
		t.Fatalf("expected the sixth to answer after 6 attempts, got %v from %v after %d", res.Err, res.Deployment, res.Attempts)
	}
	for i, s := range revoked {
		if s.calls.Load() != 1 {
			t.Errorf("deployment %d: expected one attempt, got %d", i, s.calls.Load())
		}
	}
	// Their circuits are open: the next request goes to the sixth at once.
	if res := r.Serve(context.Background(), group, chatReq); res.Deployment != group[5] || res.Attempts != 1 {
		t.Errorf("expected the sixth at once, got %v after %d attempts", res.Deployment, res.Attempts)
	}

	// Failures that may pass spend max_attempts as before.
	var failing []*Deployment
	for i := range 6 {
		failing = append(failing, deployment(string(rune('a'+i)), dScript(reply(500, `{"error":{"message":"boom"}}`))))
	}
	res = newRouter(newFakeClock()).Serve(context.Background(), failing, chatReq)
	var e *Error
	if !errors.As(res.Err, &e) || e.Status != http.StatusBadGateway || res.Attempts != DefaultMaxAttempts {
		t.Errorf("expected a 502 after %d attempts, got %v after %d", DefaultMaxAttempts, res.Err, res.Attempts)
	}
}

// After a burst of 500s on the top-ranked deployment (8 attempts in flight
// at once, one outage), its probe at 1.9 s answers 200: it serves the next
// requests again, as it did before the burst, even when the burst's last
// attempts fail after the probe. (It served 0 of the next 4: the burst's
// failures held its reliability down after the probe, and its late ones
// opened the circuit again.)
func TestAnsweredProbeServesAgain(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	top, other := dScript(reply(200, okBody)), dScript(reply(200, okBody))
	a, b := deployment("a", top), deployment("b", other)
	a.Quality, b.Quality = 1, 0.5
	group := []*Deployment{a, b}
	for range 4 {
		if res := r.Serve(context.Background(), group, chatReq); res.Deployment != a {
			t.Fatalf("warm-up: expected a, got %v", res.Deployment)
		}
	}
	var burst []capacity.Attempt
	for range 8 {
		at, ok := a.State.AcquireFor(clock.Now(), capacity.Need{Tokens: 10})
		if !ok {
			t.Fatal("expected the burst's attempts to go out")
		}
		burst = append(burst, at)
	}
	fail := func(burst []capacity.Attempt) {
		for _, at := range burst {
			a.State.ObserveAttempt(at, clock.Now(), provider.NewObservation(provider.Server), r.Policy)
			a.State.ReleaseAttempt(at)
		}
	}
	clock.Advance(300 * time.Millisecond)
	fail(burst[:6])
	clock.Advance(1600 * time.Millisecond) // the probe at 1.9 s
	if f := a.State.Features(clock.Now(), 10, false); !f.Probe {
		t.Fatalf("expected a half-open, waiting for its probe: %+v", f)
	}
	for n := range 5 {
		if n == 1 {
			fail(burst[6:]) // the burst's last two, answered after the probe
		}
		res := r.Serve(context.Background(), group, chatReq)
		if res.Err != nil || res.Deployment != a {
			t.Errorf("request %d after the burst: expected a (the probe, then its place back), got %v from %s", n+1, res.Err, nameOf(res.Deployment))
		}
		clock.Advance(100 * time.Millisecond)
	}
	if other.calls.Load() != 0 {
		t.Errorf("expected b untouched, got %d calls", other.calls.Load())
	}
}

// tpm is a fake OpenAI account with a token window of limit tokens per
// minute: as OpenAI does, it counts a request at admission from the
// request itself (its characters / 4, plus max_tokens), and answers one
// larger than the whole limit with its 429 "Request too large", the window
// full and its reset 0s; it serves the others.
type tpm struct {
	limit int64
	calls atomic.Int32
	big   atomic.Int32 // of which too large
}

func (p *tpm) RoundTrip(req *http.Request) (*http.Response, error) {
	p.calls.Add(1)
	body, _ := io.ReadAll(req.Body)
	var v struct {
		MaxTokens int64 `json:"max_tokens"`
	}
	_ = json.Unmarshal(body, &v)
	need := int64(len(body))/4 + v.MaxTokens
	limit := strconv.FormatInt(p.limit, 10)
	if need > p.limit {
		p.big.Add(1)
		msg := fmt.Sprintf("Request too large for gpt-4o in organization org-FAKE on tokens per min (TPM): Limit %d, Requested %d. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.", p.limit, need)
		b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "tokens", "param": nil, "code": "rate_limit_exceeded"}})
		return reply(429, string(b), "x-ratelimit-limit-tokens", limit, "x-ratelimit-remaining-tokens", limit, "x-ratelimit-reset-tokens", "0s")(req)
	}
	return reply(200, okBody, "x-ratelimit-limit-tokens", limit, "x-ratelimit-remaining-tokens", strconv.FormatInt(p.limit-need, 10),
		"x-ratelimit-reset-tokens", "1s")(req)
}

// tpmGroup is a router on a fake clock and a group of one deployment, a,
// whose provider has a token window of limit.
func tpmGroup(limit int64) (*Router, *fakeClock, *tpm, []*Deployment) {
	clock := newFakeClock()
	pa := &tpm{limit: limit}
	a := deployment("a", nil)
	a.Transport = pa
	return newRouter(clock), clock, pa, []*Deployment{a}
}

// sized is a Chat request of about prompt + maxTokens tokens, its
// estimate as the chat client API makes it.
func sized(maxTokens int64) *Request {
	body := fmt.Sprintf(`{"model":"g","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
	return &Request{Request: wire([]byte(body), false), Tokens: int64(len(body))/4 + maxTokens, OutputTokens: maxTokens}
}

// A request larger than a token window's whole limit (OpenAI's 429
// "Request too large ... Limit 30000, Requested 36278", window full, reset
// 0s) goes where it fits and cools nobody; where it fits nowhere the
// client is told at once, with the limit, in one non-retryable 413. A
// window's stated limit says so before any attempt. (A was cooled for
// everyone, small requests moved to B; with A alone the router made 4
// attempts and answered 429 Retry-After 1, which an SDK retries forever.)
func TestRequestLargerThanAWindow(t *testing.T) {
	const big = 36000
	t.Run("it fits elsewhere", func(t *testing.T) {
		clock := newFakeClock()
		r := newRouter(clock)
		pa, pb := &tpm{limit: 30000}, &tpm{limit: 100000}
		a, b := deployment("a", nil), deployment("b", nil)
		a.Transport, b.Transport = pa, pb
		a.Quality, b.Quality = 1, 0.5
		group := []*Deployment{a, b}
		res := r.Serve(context.Background(), group, sized(big))
		if res.Err != nil || res.Deployment != b || res.Attempts != 2 || len(clock.Sleeps()) != 0 {
			t.Fatalf("expected b to take the big request at once, got %v from %s after %d attempts, waits %v", res.Err, nameOf(res.Deployment), res.Attempts, clock.Sleeps())
		}
		for n := range 3 {
			if res := r.Serve(context.Background(), group, sized(100)); res.Deployment != a {
				t.Errorf("small request %d: expected a (it is not cooling), got %v from %s", n+1, res.Err, nameOf(res.Deployment))
			}
		}
		// a's stated limit says the next big one cannot fit there: b at once.
		if res := r.Serve(context.Background(), group, sized(big)); res.Deployment != b || res.Attempts != 1 || pa.big.Load() != 1 {
			t.Errorf("expected the next big request on b alone, got %v from %s after %d attempts (a refused %d)", res.Err, nameOf(res.Deployment), res.Attempts, pa.big.Load())
		}
	})
	t.Run("a stated limit says so before any attempt", func(t *testing.T) {
		r, _, pa, group := tpmGroup(30000)
		if res := r.Serve(context.Background(), group, sized(100)); res.Err != nil {
			t.Fatalf("warm-up: %v", res.Err)
		}
		res := r.Serve(context.Background(), group, sized(big))
		var e *Error
		if !errors.As(res.Err, &e) || e.Status != http.StatusRequestEntityTooLarge || res.Attempts != 0 || pa.big.Load() != 0 {
			t.Errorf("expected a 413 at once, a not asked, got %v after %d attempts (a refused %d)", res.Err, res.Attempts, pa.big.Load())
		}
	})
	t.Run("it fits in the fallback group", func(t *testing.T) {
		clock := newFakeClock()
		r := newRouter(clock)
		pa, pb := &tpm{limit: 30000}, &tpm{limit: 100000}
		a, b := deployment("a", nil), deployment("b", nil)
		a.Transport, b.Transport = pa, pb
		g := NewGroup("smart", []*Deployment{a})
		g.Fallback = NewGroup("big", []*Deployment{b})
		for n := range 2 {
			if res := r.ServeGroup(context.Background(), g, sized(big)); res.Err != nil || res.Deployment != b || len(clock.Sleeps()) != 0 {
				t.Errorf("big request %d: expected the fallback's b at once, got %v from %s", n+1, res.Err, nameOf(res.Deployment))
			}
		}
		if pa.calls.Load() != 1 {
			t.Errorf("expected a asked once (then known too small), got %d", pa.calls.Load())
		}
	})
	t.Run("it fits nowhere", func(t *testing.T) {
		r, clock, pa, group := tpmGroup(30000)
		for n, want := range []int32{1, 1} { // the second is told from a's stated limit
			res := r.Serve(context.Background(), group, sized(big))
			var e *Error
			if !errors.As(res.Err, &e) || e.Status != http.StatusRequestEntityTooLarge || e.RetryAfter != 0 ||
				!strings.Contains(e.Message, "30000") || pa.calls.Load() != want || len(clock.Sleeps()) != 0 {
				t.Errorf("big request %d: expected one 413 at once naming the limit 30000, no Retry-After, %d call(s) in all; got %v (%+v) after %d calls, waits %v",
					n+1, want, res.Err, e, pa.calls.Load(), clock.Sleeps())
			}
		}
		if res := r.Serve(context.Background(), group, sized(100)); res.Err != nil || res.Deployment != group[0] {
			t.Errorf("expected a small request served by a, got %v", res.Err)
		}
	})
}

// A fallback group that cannot serve before the deadline (rate-limited
// past it) is no way out: the group's own failed deployment is retried
// after its backoff instead, and answers. (The request went to the
// cooling fallback and was answered 429.)
func TestNoFallbackThatCannotServe(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	blip := dScript(reply(500, `{"error":{"message":"boom"}}`), reply(200, okBody))
	a := deployment("a", blip)
	g := NewGroup("smart", []*Deployment{a})
	f := deployment("f", dScript(reply(200, okBody)))
	g.Fallback = NewGroup("cheap", []*Deployment{f})
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 10 * time.Minute
	f.State.Observe(clock.Now(), rl, r.Policy)
	res := r.ServeGroup(context.Background(), g, chatReq)
	if res.Err != nil || res.Deployment != a || res.Attempts != 2 || blip.calls.Load() != 2 {
		t.Errorf("expected a to answer its retry, got %v from %s after %d attempts", res.Err, nameOf(res.Deployment), res.Attempts)
	}
	if s := clock.Sleeps(); len(s) != 1 || s[0] != r.Policy.Backoff(1) {
		t.Errorf("expected one wait of the backoff, got %v", s)
	}
}

// failOnce fails its call number at (from 1) with a 500 and passes the
// others on.
type failOnce struct {
	next   http.RoundTripper
	at     int32
	calls  atomic.Int32
	failed atomic.Bool
}

func (f *failOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.calls.Add(1) == f.at {
		f.failed.Store(true)
		return reply(500, `{"error":{"message":"boom"}}`)(req)
	}
	return f.next.RoundTrip(req)
}

// A request that failed on one deployment and waits in the queue is not
// told 429 because the deployments it has not tried cannot serve its place
// in time: when they cannot, the one it failed on is usable again. Two
// deployments of 10 per 10 s, deadline 25 s (60 before the deadline), a
// burst of 55; b fails one request once. (That request was told 429,
// "cannot serve this request before its deadline", its place counted
// against a alone.)
func TestAFailedRequestInTheQueueStillCountsOnItsFailedDeployment(t *testing.T) {
	c := newManualClock()
	pa, pb := &windowed{c: c, limit: 10, span: 10 * time.Second}, &windowed{c: c, limit: 10, span: 10 * time.Second}
	a, b := deployment("a", nil), deployment("b", nil)
	flaky := &failOnce{next: pb, at: 12} // the first of b's second window in the burst
	a.Transport, b.Transport = pa, flaky
	r := New()
	r.Clock, r.Rand = c, func() float64 { return 0 }
	r.Deadline, r.MaxAttempts = 25*time.Second, 8
	g := NewGroup("limited", []*Deployment{a, b})
	for range 2 { // teach both their windows
		if res := r.ServeGroup(context.Background(), g, chatReq); res.Err != nil {
			t.Fatalf("warm-up: %v", res.Err)
		}
	}
	c.advanceTo(c.Now().Add(10 * time.Second))
	out := make([]served, 55)
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq("u", DefaultPriority)), 0)
	})
	for i, o := range out {
		if o.status != 200 {
			t.Errorf("request %d: expected 200, got %+v", i, o)
		}
	}
	if !flaky.failed.Load() {
		t.Error("expected b to fail one request")
	}
}

// A token limit smaller than a request refuses it only where it is known
// to bound a request (OpenAI's x-ratelimit-limit-tokens, or a too_large
// answer): a window may count less than prompt plus max_tokens
// (Anthropic's most restrictive token window may be its output tokens), so
// a limit alone proves nothing; here a per-minute window under another
// header name, which the OpenAI adapter does not take to bound one.
func TestATokenLimitNotKnownToBoundARequestRefusesNothing(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	counts := dScript(reply(200, okBody, "x-ratelimit-limit-tokens-minute", "8000", "x-ratelimit-remaining-tokens-minute", "8000", "x-ratelimit-reset-tokens-minute", "1s"))
	a := deployment("a", counts)
	group := []*Deployment{a}
	if res := r.Serve(context.Background(), group, sized(100)); res.Err != nil {
		t.Fatalf("warm-up: %v", res.Err)
	}
	if res := r.Serve(context.Background(), group, sized(11000)); res.Err != nil || res.Deployment != a || counts.calls.Load() != 2 {
		t.Errorf("expected a to be asked and answer, got %v after %d calls", res.Err, counts.calls.Load())
	}
}

// A tier-1 deployment rate-limited until 150 ms before the deadline is no
// tier to wait for when tier 2 needs 300 ms to answer: the wait would
// leave no time for its answer or a failover after it. Tier 2 at once.
// (The request waited 19.85 s for east, met its 429 again and was told
// 504: the simulation's failover-wall, seeds 2 and 13.)
func TestNoWaitForATierBackTooLateToFailOver(t *testing.T) {
	clock := newFakeClock()
	r := newRouter(clock)
	r.Deadline = 20 * time.Second
	limited := dScript(reply(429, rateLimited, "Retry-After", "30"))
	east, claude := deployment("east", limited), deployment("claude", dOK())
	claude.Tier = 2
	claude.State.RecordLatency(300*time.Millisecond, 300*time.Millisecond)
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 19850 * time.Millisecond
	east.State.Observe(clock.Now(), rl, r.Policy)
	res := r.Serve(context.Background(), []*Deployment{east, claude}, chatReq)
	if res.Err != nil || res.Deployment != claude || len(clock.Sleeps()) != 0 || limited.calls.Load() != 0 {
		t.Errorf("expected claude at once, got %v from %s after waits %v (east asked %d times)", res.Err, nameOf(res.Deployment), clock.Sleeps(), limited.calls.Load())
	}
	// Back with time to spare (10 s before the deadline): the tiers' rule, a wait.
	east.State.Reset(clock.Now())
	rl.RetryAfter = 10 * time.Second
	east.State.Observe(clock.Now(), rl, r.Policy)
	limited.replies = []func(*http.Request) (*http.Response, error){reply(200, okBody)}
	if res := r.Serve(context.Background(), []*Deployment{east, claude}, chatReq); res.Deployment != east {
		t.Errorf("expected a wait for east, got %v from %s", res.Err, nameOf(res.Deployment))
	}
}
