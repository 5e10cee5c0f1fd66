package router

import (
	"net/http"
	"testing"
	"time"
)

// With the defaults (deadline 60 s, no timeout set), a non-streaming
// answer that takes 45 s is a working provider's: it is let finish, on
// the first attempt, rather than cut and retried on a second deployment
// that then runs out of the deadline too.
func TestANonStreamingAttemptMayRunUntilTheDeadlineByDefault(t *testing.T) {
	c := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){timed(c, 45*time.Second, reply(200, okBody))}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){timed(c, 45*time.Second, reply(200, okBody))}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	for _, d := range []*Deployment{da, db} {
		d.Timeout = DefaultTimeout
	}
	r := newRouter(c)
	began := c.Now()
	res := serveOnClock(t, r, c, []*Deployment{da, db}, chatReq)
	if res.Err != nil || res.Deployment != da || res.Attempts != 1 || b.calls.Load() != 0 {
		t.Fatalf("expected a's answer on the one attempt, b never asked; got %v from %v after %d attempts, b asked %d",
			res.Err, res.Deployment, res.Attempts, b.calls.Load())
	}
	if took := c.Now().Sub(began); took < 45*time.Second || took > 46*time.Second {
		t.Errorf("expected the answer at 45 s, got %s", took)
	}
}

// An explicit timeout still bounds a non-streaming attempt: the provider's
// fault, failed over to the next deployment.
func TestAnExplicitTimeoutStillCutsANonStreamingAttempt(t *testing.T) {
	c := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){timed(c, 45*time.Second, reply(200, okBody))}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){timed(c, time.Second, reply(200, okBody))}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality = 1
	da.Timeout = 10 * time.Second
	r := newRouter(c)
	began := c.Now()
	res := serveOnClock(t, r, c, []*Deployment{da, db}, chatReq)
	if res.Err != nil || res.Deployment != db || res.Attempts != 2 {
		t.Fatalf("expected b's answer after a timed out, got %v from %v after %d attempts", res.Err, res.Deployment, res.Attempts)
	}
	if took := c.Now().Sub(began); took < 11*time.Second || took > 12*time.Second {
		t.Errorf("expected the answer at 10 s + 1 s, got %s", took)
	}
}
