package router

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// sealed is a request whose body carries state only some deployments can
// read (a marker standing for an encrypted reasoning item).
const sealed = `{"model":"fast","messages":[{"role":"user","content":"hi SEALED"}]}`

// recorded is a script of replies whose requests' bodies b keeps.
func recorded(b *bodies, replies ...func(*http.Request) (*http.Response, error)) *script {
	s := &script{}
	for _, r := range replies {
		s.replies = append(s.replies, b.keep(r))
	}
	return s
}

// all is what b kept, as strings.
func (b *bodies) all() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, body := range b.got {
		out = append(out, string(body))
	}
	return out
}

// boundTo is a Bound that reader alone reads (nil: none is known to),
// stripping the marker for any other; refusals are OpenAI's
// invalid_encrypted_content.
func boundTo(reader *Deployment) *Bound {
	b := &Bound{
		Strip: func(body []byte, d *Deployment, all bool) ([]byte, bool) {
			if (all || d != reader) && bytes.Contains(body, []byte(" SEALED")) {
				return bytes.ReplaceAll(body, []byte(" SEALED"), nil), true
			}
			return body, false
		},
		Refused: func(obs provider.Observation) bool { return obs.Code == "invalid_encrypted_content" },
	}
	if reader != nil {
		b.Reads = func(d *Deployment) bool { return d == reader }
	}
	return b
}

const unreadable = `{"error":{"message":"The encrypted content gAAA...DQ== could not be verified.","type":"invalid_request_error","param":null,"code":"invalid_encrypted_content"}}`

func sealedReq(reader *Deployment) *Request {
	return &Request{Request: wire([]byte(sealed), false), Tokens: 10, Bound: boundTo(reader)}
}

// The deployment that reads a request's bound state takes it over the
// ranking; after its 429 another serves it at once, sent the request
// without what it cannot read; while the reader cools down briefly
// (before the deadline) the next request waits for it rather than going
// elsewhere; cooling past the deadline, another serves it at once,
// stripped.
func TestBoundStateGoesToItsReader(t *testing.T) {
	clock := newFakeClock()
	ok := reply(200, okBody)
	var seenA, seenB bodies
	a := deployment("a", recorded(&seenA, ok))
	b := deployment("b", recorded(&seenB, ok, ok, ok, ok, ok,
		reply(429, rateLimited, "Retry-After", "10"), ok, reply(429, rateLimited, "Retry-After", "120"), ok))
	a.Quality, b.Quality = 0.9, 0.1 // a ranks first
	group := []*Deployment{a, b}
	r := newRouter(clock)
	for range 5 {
		if res := r.Serve(context.Background(), group, sealedReq(b)); res.Deployment != b || res.Err != nil {
			t.Fatalf("expected the reader b, got %v %v", res.Deployment, res.Err)
		}
	}
	if n := len(seenA.all()); n != 0 {
		t.Errorf("a was tried %d times", n)
	}
	if got := seenB.all(); !strings.Contains(got[0], "SEALED") {
		t.Errorf("b was sent %s", got[0])
	}
	// b's 429 (Retry-After 10): a at once, stripped.
	if res := r.Serve(context.Background(), group, sealedReq(b)); res.Deployment != a || res.Attempts != 2 {
		t.Fatalf("expected b's 429, then a: %v after %d attempts", res.Deployment, res.Attempts)
	}
	if got := seenA.all(); len(got) != 1 || strings.Contains(got[0], "SEALED") || !strings.Contains(got[0], `"hi"`) {
		t.Errorf("a was sent %q", got)
	}
	// b cools for 10 s (the deadline is 60 s): the next request waits for it.
	done := make(chan *Result, 1)
	began := clock.Now()
	go func() { done <- r.Serve(context.Background(), group, sealedReq(b)) }()
	res := advanceUntil(t, clock, done)
	if res.Deployment != b || len(seenA.all()) != 1 {
		t.Errorf("expected b after its cooldown, got %v (a tried %d times)", res.Deployment, len(seenA.all()))
	}
	if waited := clock.Now().Sub(began); waited < 9*time.Second || waited > 12*time.Second {
		t.Errorf("expected a wait of about 10 s for b, got %v", waited)
	}
	// b's 429 for 120 s, past the deadline: a, and a at once after it.
	for i, attempts := range []int{2, 1} {
		if res := r.Serve(context.Background(), group, sealedReq(b)); res.Deployment != a || res.Attempts != attempts {
			t.Fatalf("request %d: expected a after %d attempts, got %v after %d", i, attempts, res.Deployment, res.Attempts)
		}
	}
	if got := seenA.all(); len(got) != 3 || strings.Contains(got[1]+got[2], "SEALED") {
		t.Errorf("a was sent %q", got)
	}
}

// A reader that answers 429 is failed over at once, as any: the other
// deployment is sent the request stripped.
func TestBoundStateStrippedAfterItsReaderRefuses(t *testing.T) {
	clock := newFakeClock()
	var seenA, seenB bodies
	a := deployment("a", recorded(&seenA, reply(200, okBody)))
	b := deployment("b", recorded(&seenB, reply(429, rateLimited, "Retry-After", "30")))
	res := newRouter(clock).Serve(context.Background(), []*Deployment{a, b}, sealedReq(b))
	if res.Deployment != a || res.Attempts != 2 || res.Err != nil {
		t.Fatalf("expected b's 429, then a: %v after %d attempts, %v", res.Deployment, res.Attempts, res.Err)
	}
	if got := seenB.all(); len(got) != 1 || !strings.Contains(got[0], "SEALED") {
		t.Errorf("b was sent %q", got)
	}
	if got := seenA.all(); len(got) != 1 || strings.Contains(got[0], "SEALED") {
		t.Errorf("a was sent %q", got)
	}
}

// A provider that refuses the bound state it cannot read (an item the
// router never saw minted) is not passed on: the request goes once more,
// elsewhere first, with all of it stripped; a second refusal is the
// client's answer.
func TestBoundStateRefusedIsRetriedOnceStripped(t *testing.T) {
	clock := newFakeClock()
	var seenA, seenB, seen, seenC bodies
	a := deployment("a", recorded(&seenA, reply(400, unreadable)))
	b := deployment("b", recorded(&seenB, reply(200, okBody)))
	a.Quality, b.Quality = 0.9, 0.1
	r := newRouter(clock)
	res := r.Serve(context.Background(), []*Deployment{a, b}, sealedReq(nil))
	if res.Deployment != b || res.Attempts != 2 || res.Status != 200 {
		t.Fatalf("expected a's refusal, then b: %v after %d attempts, status %d", res.Deployment, res.Attempts, res.Status)
	}
	if got := seenB.all(); len(got) != 1 || strings.Contains(got[0], "SEALED") {
		t.Errorf("b was sent %q", got)
	}
	// Alone: the same deployment, stripped.
	one := deployment("one", recorded(&seen, reply(400, unreadable), reply(200, okBody)))
	res = r.Serve(context.Background(), []*Deployment{one}, sealedReq(nil))
	if got := seen.all(); res.Status != 200 || len(got) != 2 || strings.Contains(got[1], "SEALED") {
		t.Errorf("alone: status %d, sent %q", res.Status, got)
	}
	// Refused again, stripped: passed on, no third attempt.
	c := deployment("c", recorded(&seenC, reply(400, unreadable)))
	res = r.Serve(context.Background(), []*Deployment{c}, sealedReq(nil))
	if got := seenC.all(); len(got) != 2 || strings.Contains(got[1], "SEALED") {
		t.Errorf("c was sent %q", got)
	}
	if res.Status != 400 || res.Attempts != 2 || res.Error == nil || res.Error.Code != "invalid_encrypted_content" {
		t.Errorf("expected the second refusal passed on after 2 attempts: %d after %d", res.Status, res.Attempts)
	}
}

// advanceUntil moves clock a second at a time until done yields.
func advanceUntil(t *testing.T, clock *fakeClock, done chan *Result) *Result {
	t.Helper()
	for range 200 {
		select {
		case res := <-done:
			return res
		case <-time.After(5 * time.Millisecond):
			clock.Advance(time.Second)
		}
	}
	t.Fatal("the request was not served")
	return nil
}
