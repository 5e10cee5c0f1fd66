package router

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// timed is a fake provider's reply that comes latency after the attempt
// was sent, on the fake clock, as a provider's answer does; an attempt
// cancelled before then gets its context's error.
func timed(c *fakeClock, latency time.Duration, next func(*http.Request) (*http.Response, error)) func(*http.Request) (*http.Response, error) {
	return func(req *http.Request) (*http.Response, error) {
		due := make(chan struct{})
		t := c.AfterFunc(latency, func() { close(due) })
		defer t.Stop()
		select {
		case <-due:
			return next(req)
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
}

// serveOnClock serves one request while advancing the fake clock in
// steps of 50 ms, until it is answered.
func serveOnClock(t *testing.T, r *Router, c *fakeClock, group []*Deployment, req *Request) *Result {
	t.Helper()
	done := make(chan *Result, 1)
	go func() { done <- r.Serve(context.Background(), group, req) }()
	for end := time.Now().Add(10 * time.Second); ; {
		select {
		case res := <-done:
			return res
		default:
		}
		if time.Now().After(end) {
			t.Fatal("the request was not answered")
		}
		time.Sleep(time.Millisecond)
		c.Advance(50 * time.Millisecond)
	}
}

// A deployment that loses its hedges is slower than its peer: the attempt
// cancelled because the other answered first still teaches the ranking it
// took at least that long, so that the fast deployment is chosen first and
// the requests after the first are no longer hedged (one upstream call
// per answer, counted at the fakes). Streams alike, by time to first
// content.
func TestALostHedgeTeachesTheRankingItsDeploymentIsSlow(t *testing.T) {
	for _, stream := range []bool{false, true} {
		c := newFakeClock()
		answer, req := reply(200, okBody), chatReq
		if stream {
			answer, req = sse(textChunk("x", "hi"), finalChunk("x"), "data: [DONE]"), streamReq(helloReq)
		}
		slow := &script{replies: []func(*http.Request) (*http.Response, error){timed(c, 8*time.Second, answer)}}
		fast := &script{replies: []func(*http.Request) (*http.Response, error){timed(c, 100*time.Millisecond, answer)}}
		ds, df := deployment("slow", slow), deployment("fast", fast)
		r, _ := hedgeRouter(c)
		const n = 10
		hedged := 0
		for k := 0; k < n; k++ {
			before := slow.calls.Load() + fast.calls.Load()
			res := serveOnClock(t, r, c, []*Deployment{ds, df}, req)
			if res.Stream != nil {
				if _, err := relay(t, res.Stream); err != nil {
					t.Fatalf("stream %v, request %d: %v", stream, k, err)
				}
			}
			calls := slow.calls.Load() + fast.calls.Load() - before
			if res.Err != nil || res.Deployment != df || calls > 2 {
				t.Fatalf("stream %v, request %d: expected fast's answer in at most 2 calls, got %v from %v in %d", stream, k, res.Err, res.Deployment, calls)
			}
			if res.Hedge != "" {
				hedged++
			}
		}
		if total := slow.calls.Load() + fast.calls.Load(); hedged > 1 || total > n+1 {
			t.Errorf("stream %v: expected only the first of %d requests hedged, got %d hedged, %d upstream calls (slow %d, fast %d)",
				stream, n, hedged, total, slow.calls.Load(), fast.calls.Load())
		}
	}
}
