package router

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// A stream's idle_timeout is one timer for its leg, not a timer reset and
// stopped around each event (a tenth of a relayed event's CPU, issue 32):
// relaying 100 content chunks sets or resets timers no more often than
// relaying 1 does.
func TestIdleTimerIsNotResetPerEvent(t *testing.T) {
	sets := func(n int) int {
		c := &recClockE{fakeClock: newFakeClock()}
		d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){func(req *http.Request) (*http.Response, error) {
			steps := make([]func() ([]byte, error), 0, n+1)
			for range n {
				steps = append(steps, func() ([]byte, error) { return evE(chunk), nil })
			}
			steps = append(steps, func() ([]byte, error) { return append(evE(final), evE("data: [DONE]")...), nil })
			return streamOfE(&readsE{steps: steps}, req)
		}}})
		d.IdleTimeout = 30 * time.Second
		r := newRouter(c.fakeClock)
		r.Clock = c
		r.Resume = ResumeOff
		res := r.Serve(context.Background(), []*Deployment{d}, &Request{Request: wire(chatReq.Body, true)})
		if res.Stream == nil {
			t.Fatalf("expected a stream, got %v", res.Err)
		}
		if got, err := relay(t, res.Stream); err != nil || len(got) != n+2 {
			t.Fatalf("expected %d events, got %d: %v", n+2, len(got), err)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.waits)
	}
	if one, hundred := sets(1), sets(100); hundred > one {
		t.Errorf("timers set or reset: %d for 1 chunk, %d for 100", one, hundred)
	}
}

// idle_timeout counts the provider's silence only: content restarts it,
// a keep-alive does not (the wait after one is what was left), and the
// time the client takes to read an event never counts. The attempt is
// cancelled exactly when a wait has used what was left, not a
// millisecond before. (TestIdleTimeLeftAfterKeepAlives checked this by
// the durations the idle timer was reset to, one reset per wait.)
func TestIdleTimeoutCountsTheProvidersSilenceOnly(t *testing.T) {
	c := newFakeClock()
	var early, cut error
	d := deployment("a", &script{replies: []func(*http.Request) (*http.Response, error){func(req *http.Request) (*http.Response, error) {
		content := func(wait time.Duration) func() ([]byte, error) {
			return func() ([]byte, error) { c.Advance(wait); c.Settle(); return evE(chunk), nil }
		}
		return streamOfE(&readsE{steps: []func() ([]byte, error){
			content(0), content(29 * time.Second), content(29 * time.Second),
			func() ([]byte, error) { c.Advance(10 * time.Second); c.Settle(); return evE(": keep-alive"), nil },
			func() ([]byte, error) {
				c.Advance(20*time.Second - time.Millisecond)
				c.Settle()
				early = context.Cause(req.Context())
				c.Advance(time.Millisecond)
				c.Settle()
				cut = context.Cause(req.Context())
				return nil, req.Context().Err()
			},
		}}, req)
	}}})
	d.IdleTimeout, d.TTFTTimeout, d.Timeout = 30*time.Second, time.Hour, time.Hour
	r := newRouter(c)
	r.Deadline = 2 * time.Hour
	r.Resume = ResumeOff
	res := r.Serve(context.Background(), []*Deployment{d}, &Request{Request: wire(chatReq.Body, true)})
	if res.Stream == nil {
		t.Fatalf("expected a stream, got %v", res.Err)
	}
	events := 0
	err := res.Stream.Relay(func(provider.Event, bool) error {
		events++
		c.Advance(time.Hour) // a slow client: not the provider's silence
		c.Settle()
		return nil
	})
	var se *StreamError
	if !errors.As(err, &se) || !strings.Contains(se.Message, "went silent") {
		t.Errorf("expected the stream to end silent, got %v", err)
	}
	if events != 3 {
		t.Errorf("expected the 3 chunks relayed before the silence, got %d", events)
	}
	if early != nil {
		t.Errorf("cancelled a millisecond before idle_timeout was spent: %v", early)
	}
	if !errors.Is(cut, errIdleTimeout) {
		t.Errorf("expected the attempt cancelled by idle_timeout once spent, got %v", cut)
	}
}
