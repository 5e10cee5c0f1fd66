package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/estimate"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// cachingAnthropic is an Anthropic account as PROVIDERS.md describes it:
// an input-tokens bucket (limit per minute, refilled continuously) that
// counts uncached input only, cache writes included and cache reads not,
// stated in anthropic-ratelimit-input-tokens-* with an RFC 3339 reset in
// whole seconds (when the bucket is full again); and a prompt cache of
// its own, holding the system prompt a request marked with cache_control.
// It counts a request's input as its body's bytes / 4.
type cachingAnthropic struct {
	c       *manualClock
	limit   float64
	mu      sync.Mutex
	left    float64
	at      time.Time
	cached  map[string]bool
	served  int
	got429  int
	latency time.Duration
}

func (p *cachingAnthropic) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	var b struct {
		System []json.RawMessage `json:"system"`
	}
	_ = json.Unmarshal(body, &b)
	prefix := ""
	for _, s := range b.System {
		if strings.Contains(string(s), `"cache_control"`) {
			prefix = string(s)
		}
	}
	input := int64(len(body) / 4)
	resp, ok := p.admit(req, input, prefix)
	if ok {
		_ = p.c.Sleep(req.Context(), p.latency)
	}
	return resp, nil
}

// admit decides a request of input tokens, of which the prefix's may be
// read from the cache, when it arrives.
func (p *cachingAnthropic) admit(req *http.Request, input int64, prefix string) (*http.Response, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.c.Now()
	rate := p.limit / 60
	if p.at.IsZero() {
		p.left = p.limit
	} else {
		p.left = math.Min(p.limit, p.left+rate*now.Sub(p.at).Seconds())
	}
	p.at = now
	read, write := int64(0), int64(0)
	if prefix != "" {
		if p.cached[prefix] {
			read = int64(len(prefix) / 4)
		} else {
			write = int64(len(prefix) / 4)
		}
	}
	counted := input - read // uncached input: cache writes count, reads do not
	h := http.Header{"Content-Type": {"application/json"}}
	ok := float64(counted) <= p.left
	if ok {
		p.left -= float64(counted)
		p.served++
		if prefix != "" {
			p.cached[prefix] = true
		}
	} else {
		p.got429++
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil((float64(counted)-p.left)/rate))))
	}
	full := now.Add(time.Duration((p.limit - p.left) / rate * float64(time.Second))).Truncate(time.Second).Add(time.Second)
	h.Set("anthropic-ratelimit-input-tokens-limit", strconv.Itoa(int(p.limit)))
	h.Set("anthropic-ratelimit-input-tokens-remaining", strconv.Itoa(int(p.left)))
	h.Set("anthropic-ratelimit-input-tokens-reset", full.UTC().Format(time.RFC3339))
	if !ok {
		return &http.Response{StatusCode: 429, Header: h, Request: req, Body: io.NopCloser(strings.NewReader(
			`{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization of input tokens per minute."}}`))}, false
	}
	answer := fmt.Sprintf(`{"id":"msg_1","type":"message","role":"assistant","model":"claude-up","content":[{"type":"text","text":"Noted."}],`+
		`"stop_reason":"end_turn","usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":3}}`,
		input-read-write, write, read)
	return &http.Response{StatusCode: 200, Header: h, Request: req, Body: io.NopCloser(strings.NewReader(answer))}, true
}

// cachedMessages is a Messages request of a system prompt of 32,000 bytes
// (8,000 tokens) marked with cache_control and a question of its own of
// about 2,100 tokens, max_tokens 100: about 10,100 prompt tokens.
func cachedMessages(i int) *Request {
	system := strings.Repeat("The contract's clauses apply. ", 32000/30)
	system += strings.Repeat(".", 32000-len(system))
	body := fmt.Sprintf(`{"model":"claude","max_tokens":100,"system":[{"type":"text","text":%q,"cache_control":{"type":"ephemeral"}}],`+
		`"messages":[{"role":"user","content":"Question %d: %s"}]}`, system, i, strings.Repeat("what of it? ", 8300/12))
	prompt := estimate.Prompt([]byte(body))
	return &Request{Request: &provider.Request{Format: provider.Messages, Body: []byte(body), Choices: 1},
		PromptTokens: prompt, OutputTokens: 100, Tokens: prompt + 100}
}

// cachedBurst sends 12 cachedMessages at once on a cachingAnthropic
// account of the given input-tokens limit, after two warm-ups 5 s apart
// (the first wrote the cache; their statements show the bucket refills)
// and a minute that refilled the bucket, each with the deadline;
// it returns their outcomes (times from the burst's start), the uncached
// tokens of each and the account.
func cachedBurst(t *testing.T, limit float64, deadline time.Duration) ([]served, int64, *cachingAnthropic) {
	t.Helper()
	c := newManualClock()
	p := &cachingAnthropic{c: c, limit: limit, cached: map[string]bool{}, latency: 100 * time.Millisecond}
	r, g := manualGroup(c, p, deadline)
	g.Deployments[0].Provider = &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://a.invalid/v1", APIKey: "sk-ant-a"}}
	for range 2 { // two statements 5 s apart show the bucket refills
		simulate(t, c, 1, func(int) {
			if res := r.ServeGroup(context.Background(), g, cachedMessages(-1)); res.Err != nil {
				t.Errorf("warm-up: %v", res.Err)
			}
		})
		c.advanceTo(c.Now().Add(5 * time.Second))
	}
	c.advanceTo(c.Now().Add(61 * time.Second)) // the bucket is full again
	p.served = 0
	start := c.Now()
	out := make([]served, 12)
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, cachedMessages(i)), c.Now().Sub(start))
	})
	return out, int64(len(cachedMessages(0).Body)/4) - 8000, p
}

// The figures (kind 2): 12 requests of about 10,100 prompt tokens,
// 8,000 of them read from the prompt cache, on an Anthropic input-tokens
// window of 34,000 a minute: 12 x 2,100 uncached fit, so all 12 are served
// at once (the router served 8); on 20,000, 9 fit (it served 1), and the
// others, which the bucket cannot refill for before their deadline of 2 s,
// are told so. No upstream 429 either way: the router charges the window
// the uncached input, predicted from what the deployment last reported of
// the request's cache_control prefix.
func TestInputWindowIsChargedUncachedInput(t *testing.T) {
	for _, limit := range []float64{34000, 20000} {
		t.Run(strconv.Itoa(int(limit)), func(t *testing.T) {
			out, uncached, p := cachedBurst(t, limit, 2*time.Second)
			fits := min(12, int(int64(limit)/uncached))
			ok := 0
			for i, o := range out {
				switch {
				case o.status == 200 && o.at <= 200*time.Millisecond:
					ok++
				case o.status == 429:
				default:
					t.Errorf("request %d: unexpected %+v", i, o)
				}
			}
			if ok != fits || p.got429 != 0 {
				t.Errorf("expected %d of 12 served at once (%d uncached tokens each) and no upstream 429, got %d served and %d 429s",
					fits, uncached, ok, p.got429)
			}
		})
	}
}

// Those that wait are forecast as the window counts them too: on 20,000
// input tokens a minute (333 a second), with a deadline of 12 s, 9 go at
// once, the 10th when the bucket has refilled for it (3.4 s), the 11th
// 6.3 s later; only the 12th (16 s) is told at once that it cannot be
// served before its deadline (the queue counted each waiting request's
// whole prompt, and told all 3 at once).
func TestWaitingCachedRequestsAreForecastAsCharged(t *testing.T) {
	out, _, p := cachedBurst(t, 20000, 12*time.Second)
	ok, later, atOnce := 0, 0, 0
	for i, o := range out {
		switch {
		case o.status == 200 && o.at > time.Second:
			later++
			fallthrough
		case o.status == 200:
			ok++
		case o.status == 429 && o.at <= 50*time.Millisecond:
			atOnce++
		default:
			t.Errorf("request %d: unexpected %+v", i, o)
		}
	}
	if ok != 11 || later != 2 || atOnce != 1 || p.got429 != 0 {
		t.Errorf("expected 11 served (2 after a wait), 1 told at once and no upstream 429, got %d (%d), %d and %d", ok, later, atOnce, p.got429)
	}
}

// A streamed answer teaches the prediction as a whole one does: its
// message_start's cache writes are what the next request of the prefix
// reads, so that with 5,000 input tokens left of the window a request of
// 10,100 prompt tokens, 8,000 of them cached, may go.
func TestAStreamsCacheUsageIsRemembered(t *testing.T) {
	start := brkEv("message_start", `{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"claude-up","content":[],`+
		`"stop_reason":null,"usage":{"input_tokens":2113,"cache_creation_input_tokens":8000,"cache_read_input_tokens":0,"output_tokens":1}}}`)
	stream := sse(start, brkBlockStart(0, "text"), brkDelta(0, "Noted."), brkEv("content_block_stop", `{"type":"content_block_stop","index":0}`),
		brkEv("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}`),
		brkEv("message_stop", `{"type":"message_stop"}`))
	windowed := func(req *http.Request) (*http.Response, error) {
		resp, err := stream(req)
		resp.Header.Set("anthropic-ratelimit-input-tokens-limit", "20000")
		resp.Header.Set("anthropic-ratelimit-input-tokens-remaining", "5000")
		resp.Header.Set("anthropic-ratelimit-input-tokens-reset", "2025-08-21T12:40:45Z")
		return resp, err
	}
	clock := newFakeClock()
	d := deployment("a", scriptOf(windowed))
	d.Provider = &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://a.invalid/v1", APIKey: "sk-ant-a"}}
	req := cachedMessages(0)
	req.Stream = true
	res := newRouter(clock).Serve(context.Background(), []*Deployment{d}, req)
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %d %v", res.Status, res.Err)
	}
	if _, err := relay(t, res.Stream); err != nil {
		t.Fatal(err)
	}
	next := cachedMessages(1)
	need := capacity.Need{Tokens: next.Tokens, Output: next.OutputTokens, Prefixes: next.CachePrefixes()}
	if at, why := d.State.AvailableFor(clock.Now(), need); at.After(clock.Now()) {
		t.Errorf("expected the next request of the prefix to fit the 5,000 left, it waits %v (%s)", at.Sub(clock.Now()), why)
	}
}

// A hedge that wins teaches the prediction as any answer does: its
// answer's cache writes are what the next request of the prefix reads at
// its deployment (the hedge's attempt carried no prefixes, so a winning
// hedge's prompt cache was never recorded).
func TestAWinningHedgesCacheUsageIsRemembered(t *testing.T) {
	answer := `{"id":"msg_1","type":"message","role":"assistant","model":"claude-up","content":[{"type":"text","text":"Noted."}],` +
		`"stop_reason":"end_turn","usage":{"input_tokens":2113,"cache_creation_input_tokens":8000,"cache_read_input_tokens":0,"output_tokens":3}}`
	windowed := func(req *http.Request) (*http.Response, error) {
		resp, err := reply(200, answer)(req)
		resp.Header.Set("anthropic-ratelimit-input-tokens-limit", "20000")
		resp.Header.Set("anthropic-ratelimit-input-tokens-remaining", "5000")
		resp.Header.Set("anthropic-ratelimit-input-tokens-reset", "2025-08-21T12:40:45Z")
		return resp, err
	}
	c := newFakeClock()
	slow := newGate(windowed)
	a := &script{replies: []func(*http.Request) (*http.Response, error){slow.reply}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){windowed}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	for _, d := range []*Deployment{da, db} {
		d.Provider = &adapters.Anthropic{Endpoint: provider.Endpoint{BaseURL: "http://" + d.Name + ".invalid/v1", APIKey: "sk-ant-" + d.Name}}
	}
	r, _ := hedgeRouter(c)
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, cachedMessages(0)) }()
	eventually(t, "a's attempt", func() bool { return a.calls.Load() == 1 })
	c.Advance(2 * time.Second)
	res := <-done
	if res.Err != nil || res.Deployment != db || res.Hedge != HedgeWon {
		t.Fatalf("expected the hedge on b to win, got %v %v %q", res.Err, res.Deployment, res.Hedge)
	}
	next := cachedMessages(1)
	need := capacity.Need{Tokens: next.Tokens, Output: next.OutputTokens, Prefixes: next.CachePrefixes()}
	if at, why := db.State.AvailableFor(c.Now(), need); at.After(c.Now()) {
		t.Errorf("expected the next request of the prefix to fit b's 5,000 left, it waits %v (%s)", at.Sub(c.Now()), why)
	}
}
