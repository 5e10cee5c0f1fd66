package router

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A consumer's backlog that drains (batch sent a burst, then nothing) is
// not forecast to keep growing: another consumer's requests are told 429
// at once only when what waits cannot be served in time. On 10 per 10 s
// with a 25 s deadline, batch's burst of 14 at 0 (10 served, 4 wait) and
// chat's 12 a second later are 16 waiting for the windows at 10 s and 20
// s, which serve 20: an ideal scheduler serves every one in time, and so
// does the queue.
func TestADrainingBacklogIsNoDemandToCome(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	type arrival struct {
		consumer string
		at       time.Duration
	}
	var all []arrival
	for range 14 {
		all = append(all, arrival{"batch", 0})
	}
	for i := range 12 {
		all = append(all, arrival{"chat", time.Second + time.Duration(i)*10*time.Millisecond})
	}
	start := c.Now()
	out := make([]served, len(all))
	simulate(t, c, len(all), func(i int) {
		a := all[i]
		_ = c.Sleep(context.Background(), a.at)
		req := userReq(a.consumer, DefaultPriority)
		req.Consumer, req.Weight = a.consumer, 1
		res := r.ServeGroup(context.Background(), g, req)
		out[i] = outcomeOf(res, c.Now().Sub(start))
	})
	for i, o := range out {
		if o.status != 200 {
			t.Errorf("%s's request at %v: expected 200 within the deadline, got %d at %v (Retry-After %v)", all[i].consumer, all[i].at, o.status, o.at, o.retry)
		}
	}
	if p.served != len(all) || p.got429 != 0 {
		t.Errorf("expected the provider to serve all %d, got %d and %d 429s (%s)", len(all), p.served, p.got429, fmt.Sprint(p.order))
	}
}

// A request's place before it joins the queue (tiers and bound state's
// readers, Group.placeOf) counts every waiting request but those that
// wait for capacity it does not share: counts of tokens waiting for their
// own limit are no place of a Messages request's, and the reverse; those
// of its own kind are.
func TestPlaceOfLeavesOutWhatItDoesNotShare(t *testing.T) {
	g := NewGroup("g", nil)
	for i := range 5 {
		if !g.queue.join(&waiter{priority: DefaultPriority, counts: true, apart: true, tokens: 7}, 100) {
			t.Fatalf("count %d refused", i)
		}
	}
	g.queue.join(&waiter{priority: DefaultPriority, tokens: 10}, 100)
	msg := &Request{Tokens: 10}
	if ahead, tokens := g.placeOf(nil, msg); ahead != 1 || tokens != 10 {
		t.Errorf("a Messages request: expected 1 ahead (10 tokens), the counts left out, got %d (%d)", ahead, tokens)
	}
	count := &Request{Tokens: 7, CountTokens: true}
	if ahead, tokens := g.placeOf(nil, count); ahead != 5 || tokens != 35 {
		t.Errorf("a count: expected the 5 counts ahead (35 tokens), got %d (%d)", ahead, tokens)
	}
}
