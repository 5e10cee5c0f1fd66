package router

import (
	"context"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A burst of 35 on 10 per 10 s with the queue bounded at 5: this window
// serves 10, the queue holds at most 5 for the next, and every other
// request is answered 429 at once, told that the queue is full (not that a
// provider is rate-limited), with Retry-After until the window is back. No
// attempt meets a provider's 429.
func TestAFullQueueAnswers429AtOnce(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	g.MaxQueued = 5
	start := c.Now()
	out := make([]served, 35)
	errs := make([]*Error, len(out))
	simulate(t, c, len(out), func(i int) {
		res := r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority))
		out[i] = outcomeOf(res, c.Now().Sub(start))
		errs[i], _ = res.Err.(*Error)
	})
	ok, full := 0, 0
	for i, o := range out {
		switch o.status {
		case 200:
			ok++
		case 429:
			full++
			e := errs[i]
			if o.at != 0 || !strings.Contains(e.Message, "queue") || !strings.Contains(e.Message, "full") || strings.Contains(e.Message, "rate-limited") {
				t.Errorf("request %d: expected a 429 at once saying the queue is full, got %v after %v", i, e.Message, o.at)
			}
			if o.retry != 10*time.Second {
				t.Errorf("request %d: expected Retry-After 10 s (the next window), got %v", i, o.retry)
			}
		default:
			t.Errorf("request %d: unexpected %+v", i, o)
		}
	}
	if ok < 10 || ok > 15 || ok+full != len(out) || p.got429 != 0 {
		t.Errorf("expected 10 to 15 served, the others told the queue is full, no upstream 429; got %d served, %d full, %d upstream 429s", ok, full, p.got429)
	}
	if n, _ := g.Waits(); n > 5 {
		t.Errorf("expected at most 5 requests to wait, got %d", n)
	}
}

// Without max_queued, the bound is DefaultMaxQueued: 10 requests per
// second of the deadline per deployment, at least 100. A deployment that
// answered 429 with Retry-After 5 s and states no window lets the queue
// grow (nothing known bounds what it serves): with a 10 s deadline, 100
// wait and are served when it is back, 20 more are answered 429 at once.
func TestTheQueueBoundDefaultsToTheDeadline(t *testing.T) {
	c := newManualClock()
	s := &script{replies: []func(*http.Request) (*http.Response, error){reply(429, rateLimited, "Retry-After", "5"), reply(200, okBody)}}
	r, g := manualGroup(c, s, 10*time.Second)
	r.MaxAttempts = 1
	if res := r.ServeGroup(context.Background(), g, chatReq); outcomeOf(res, 0).status != 429 {
		t.Fatalf("warm-up: expected the provider's 429, got %+v", outcomeOf(res, 0))
	}
	r.MaxAttempts = 8
	if got := DefaultMaxQueued(r.Deadline, 1); got != 100 {
		t.Fatalf("DefaultMaxQueued(10s, 1): expected 100, got %d", got)
	}
	if got := DefaultMaxQueued(60*time.Second, 3); got != 1800 {
		t.Fatalf("DefaultMaxQueued(60s, 3): expected 1800, got %d", got)
	}
	start := c.Now()
	out := make([]served, 120)
	simulate(t, c, len(out), func(i int) {
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority)), c.Now().Sub(start))
	})
	ok, full := 0, 0
	for i, o := range out {
		switch {
		case o.status == 200 && o.at == 5*time.Second:
			ok++
		case o.status == 429 && o.at == 0:
			full++
		default:
			t.Errorf("request %d: expected 200 at 5 s or 429 at once, got %+v", i, o)
		}
	}
	if ok != 100 || full != 20 {
		t.Errorf("expected 100 served when the deployment is back and 20 told the queue is full, got %d and %d", ok, full)
	}
}

// A full queue's Retry-After is the wait until its first deployment is
// back from a provider's limit or a failure; a deployment only busy (the
// router's own slow start: Why OK) promises nothing, so none is given
// (with one, a new user's client was told "1" by a queue that had no
// room for seconds).
func TestAFullQueueOfBusyDeploymentsSaysNoRetryAfter(t *testing.T) {
	now := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	g := NewGroup("q", nil)
	busy := scored{f: capacity.Features{At: now.Add(time.Second), Why: provider.OK}}
	if e := queueFullError(g, []scored{busy}, 2, now); e.RetryAfter != 0 {
		t.Errorf("busy (slow start): expected no Retry-After, got %v", e.RetryAfter)
	}
	limited := scored{f: capacity.Features{At: now.Add(7 * time.Second), Why: provider.RateLimited}}
	if e := queueFullError(g, []scored{limited}, 2, now); e.RetryAfter != 7*time.Second {
		t.Errorf("rate-limited: expected Retry-After 7 s, got %v", e.RetryAfter)
	}
}

// The default bound never refuses a place the known windows serve in
// time: a burst of 700 on 200 per 10 s, deadline 25 s, is served as the
// ideal scheduler would (200 now, 200 at 10 s, 200 at 20 s) although 400
// wait, above DefaultMaxQueued(25 s, 1) = 250; the last 100 are told at
// once that their place cannot be served before the deadline (not that
// the queue is full). On the old bound 250 were told the queue is full
// and the third window served 50 (issue 30's 2,000-request burst served
// 400 of 600 so).
func TestTheDefaultBoundKeepsWhatTheWindowsServe(t *testing.T) {
	r, g, p, c := limitedGroupOf(t, 200)
	start := c.Now()
	out := make([]served, 700)
	errs := make([]*Error, len(out))
	simulate(t, c, len(out), func(i int) {
		res := r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority))
		out[i] = outcomeOf(res, c.Now().Sub(start))
		errs[i], _ = res.Err.(*Error)
	})
	byWindow := map[time.Duration]int{}
	told, full, late, other := 0, 0, 0, 0
	for i, o := range out {
		switch {
		case o.status == 200:
			byWindow[o.at/(10*time.Second)*(10*time.Second)]++
		case o.status == 429 && strings.Contains(errs[i].Message, "full"):
			full++
		case o.status == 429 && o.at == 0 && o.retry >= 25*time.Second:
			told++
		case o.status == 429:
			late++
		default:
			other++
		}
	}
	want := map[time.Duration]int{0: 200, 10 * time.Second: 200, 20 * time.Second: 200}
	if !maps.Equal(byWindow, want) || told != 100 || p.got429 != 0 {
		t.Errorf("expected 200 served in each of the three windows and 100 told at once that their place cannot be served (Retry-After at the window after the deadline), no upstream 429; "+
			"got %v served, %d told so, %d told the queue is full, %d 429s late or without Retry-After, %d other, %d upstream 429s", byWindow, told, full, late, other, p.got429)
	}
}
