package router

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// A deployment in slow start (never answered: 4 attempts in flight at
// most) that states its windows wakes the whole queue: a request waiting
// behind 4 streams goes as soon as the first of them states room, while
// all 4 are still open (no stream's end wakes it).
func TestLearnedWindowsWakeTheQueue(t *testing.T) {
	r := New()
	r.Clock, r.Rand = newManualClock(), func() float64 { return 0 }
	var held atomic.Int32
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	defer release()
	d := deployment("a", nil)
	d.Transport = roundTripFunc(func(req *http.Request) (*http.Response, error) {
		body, _ := io.ReadAll(req.Body)
		if !strings.Contains(string(body), `"user":"s"`) { // the fifth request
			return reply(200, okBody)(req)
		}
		held.Add(1)
		select {
		case <-gate:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
		pr, pw := io.Pipe()
		go func() {
			defer pw.Close()
			pw.Write([]byte(chunk + "\n\n"))
			<-req.Context().Done()
		}()
		return &http.Response{StatusCode: 200, Body: pr, Request: req, Header: http.Header{
			"Content-Type":                   {"text/event-stream"},
			"X-Ratelimit-Limit-Requests":     {"100"},
			"X-Ratelimit-Remaining-Requests": {"95"},
			"X-Ratelimit-Reset-Requests":     {"60s"},
		}}, nil
	})
	g := NewGroup("fast", []*Deployment{d})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := make(chan *Result, 4)
	for range 4 {
		go func() {
			streams <- r.ServeGroup(ctx, g, &Request{Request: wire([]byte(`{"model":"fast","user":"s","messages":[{"role":"user","content":"hi"}]}`), true), Tokens: 10})
		}()
	}
	eventually(t, "4 streams held in slow start", func() bool { return held.Load() == 4 })
	done := make(chan *Result, 1)
	go func() { done <- r.ServeGroup(ctx, g, chatReq) }()
	eventually(t, "the fifth request queued", func() bool { return g.Queued() == 1 })
	release() // the streams' headers state 95 requests left
	var open []*Result
	defer func() {
		for _, s := range open {
			if s.Stream != nil {
				s.Stream.Close()
			}
		}
	}()
	for range 4 {
		open = append(open, <-streams)
	}
	eventually(t, "the fifth request served while the 4 streams are open", func() bool { return len(done) == 1 })
	if res := <-done; res.Err != nil || res.Status != 200 {
		t.Errorf("expected the fifth served, got %d %v", res.Status, res.Err)
	}
}
