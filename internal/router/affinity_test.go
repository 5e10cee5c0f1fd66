package router

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// A request's preferred deployment (affinity) is taken over the ranking
// while it is usable; once it cools down, the ranking decides again. A
// pinned request goes to its deployment only, waiting for it rather than
// failing over.
func TestPreferAndPin(t *testing.T) {
	ok := func() *script {
		return &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody)}}
	}
	clock := newFakeClock()
	a, b := deployment("a", ok()), deployment("b", ok())
	a.Quality, b.Quality = 0.9, 0.1
	group := []*Deployment{a, b}
	r := newRouter(clock)
	req := func(prefer, pin *Deployment) *Request {
		return &Request{Request: chatReq.Request, Tokens: 10, Prefer: prefer, Pinned: pin}
	}
	if res := r.Serve(context.Background(), group, req(nil, nil)); res.Deployment != a {
		t.Fatalf("expected the ranking's a, got %v", res.Deployment)
	}
	if res := r.Serve(context.Background(), group, req(b, nil)); res.Deployment != b {
		t.Errorf("expected the preferred b, got %v", res.Deployment)
	}
	// b rate-limited for 30 s: the preferred deployment is not usable.
	b.Transport = &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "30"), reply(200, okBody)}}
	if res := r.Serve(context.Background(), group, req(b, nil)); res.Deployment != a || res.Attempts != 2 {
		t.Errorf("expected a after b's 429, got %v after %d attempts", res.Deployment, res.Attempts)
	}
	if res := r.Serve(context.Background(), group, req(b, nil)); res.Deployment != a || res.Attempts != 1 {
		t.Errorf("expected a at once while b cools, got %v after %d attempts", res.Deployment, res.Attempts)
	}
	// Pinned to b: it waits out b's 30 s (the deadline is 60 s) and is
	// served by b; a is never tried.
	calls := a.Transport.(*script).calls.Load()
	done := make(chan *Result)
	go func() { done <- r.Serve(context.Background(), group, req(nil, b)) }()
	for range 100 {
		clock.Advance(time.Second)
		select {
		case res := <-done:
			if res.Deployment != b || res.Err != nil {
				t.Errorf("expected the pinned b after its cooldown, got %v %v", res.Deployment, res.Err)
			}
			if a.Transport.(*script).calls.Load() != calls {
				t.Error("expected a never tried for a pinned request")
			}
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
	t.Fatal("the pinned request was not served")
}

// A prompt cache's preference (PreferMargin, CacheMargin) holds while the
// preferred deployment's score is within the margin of the best one's,
// and yields to the ranking beyond it; a conversation's (no margin) holds
// whenever the deployment is usable.
func TestCachePreferenceHoldsWithinItsMargin(t *testing.T) {
	ok := func() *script {
		return &script{replies: []func(*http.Request) (*http.Response, error){reply(200, okBody), reply(200, okBody)}}
	}
	for _, c := range []struct {
		name             string
		qualityB, margin float64
		want             string
	}{
		{"equal, within the margin", 0.9, CacheMargin, "b"},
		{"far worse, past the margin", 0.0, CacheMargin, "a"},
		{"far worse, no margin", 0.0, 0, "b"},
	} {
		a, b := deployment("a", ok()), deployment("b", ok())
		a.Quality, b.Quality = 0.9, c.qualityB
		req := &Request{Request: chatReq.Request, Tokens: 10, Prefer: b, PreferMargin: c.margin}
		r := newRouter(newFakeClock())
		r.Weights = Weights{Quality: 1}
		if res := r.Serve(context.Background(), []*Deployment{a, b}, req); res.Deployment == nil || res.Deployment.Name != c.want {
			t.Errorf("%s: expected %s, got %v", c.name, c.want, res.Deployment)
		}
	}
}
