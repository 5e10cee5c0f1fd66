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

// A deployment that hangs until the request's deadline (no timeout set,
// the default) failed it as a timeout would have, and is at least that
// slow (a censored latency sample): the next requests go to its healthy
// peer instead of into the same hang (every request was a 504 while the
// hanging deployment ranked first, and it showed as healthy).
func TestAnAttemptCutByTheDeadlineTeachesItsLatency(t *testing.T) {
	for _, stream := range []bool{false, true} {
		c := newFakeClock()
		a := &script{replies: []func(*http.Request) (*http.Response, error){hang}}
		b := &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
		if stream {
			sse := "data: {\"id\":\"s\",\"object\":\"chat.completion.chunk\",\"model\":\"up\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
			b.replies = []func(*http.Request) (*http.Response, error){reply(200, sse, "Content-Type", "text/event-stream")}
		}
		da, db := deployment("a", a), deployment("b", b)
		da.Timeout, db.Timeout, da.TTFTTimeout, db.TTFTTimeout = 0, 0, 0, 0
		da.Quality = 1 // the operator's favourite
		db.State.RecordLatency(2*time.Second, 2*time.Second)
		r := newRouter(c)
		r.Deadline = 10 * time.Second
		req := chatReq
		if stream {
			req = streamReq(helloReq)
		}
		if res := serveOnClock(t, r, c, []*Deployment{da, db}, req); res.Err == nil || res.Attempts != 1 {
			t.Fatalf("stream %v: expected the first request cut by its deadline on a, got %v after %d attempts", stream, res.Err, res.Attempts)
		}
		for i := range 3 {
			res := serveOnClock(t, r, c, []*Deployment{da, db}, req)
			if res.Err != nil || res.Deployment != db || a.calls.Load() != 1 {
				t.Errorf("stream %v, request %d: expected b, a asked once; got %v from %v, a asked %d", stream, i+2, res.Err, res.Deployment, a.calls.Load())
			}
			if res.Stream != nil {
				res.Stream.Close()
			}
		}
	}
}

// An attempt the deadline cut after a short run (the request's time went
// to an earlier attempt) is no hang of its deployment's: it does not count
// against it.
func TestALateAttemptCutByTheDeadlineIsNoFailure(t *testing.T) {
	c := newFakeClock()
	a := &script{replies: []func(*http.Request) (*http.Response, error){timed(c, 8*time.Second, reply(500, `{"error":{"message":"boom","type":"server_error"}}`))}}
	b := &script{replies: []func(*http.Request) (*http.Response, error){hang}}
	da, db := deployment("a", a), deployment("b", b)
	da.Quality, da.Timeout, db.Timeout = 1, 0, 0
	r := newRouter(c)
	r.Deadline = 10 * time.Second
	if res := serveOnClock(t, r, c, []*Deployment{da, db}, chatReq); res.Err == nil || res.Attempts != 2 {
		t.Fatalf("expected a's 500, then b cut by the deadline, got %v after %d attempts", res.Err, res.Attempts)
	}
	if s := db.State.Snapshot(c.Now()); s.ConsecutiveFailures != 0 {
		t.Errorf("b ran 2 s of a 10 s deadline: expected no failure, got %d (%q)", s.ConsecutiveFailures, s.LastMessage)
	}
}
