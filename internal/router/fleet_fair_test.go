package router

import (
	"context"
	"slices"
	"strconv"
	"testing"
)

// Fleet mode with consumers: a waiting request joins the fleet's queue
// with its consumer and weight (the fleet orders them by fair share:
// fleet.Queue.JoinAs), and this instance's queue orders them by fair share
// too, as the fleet does (it dropped them in fleet mode: arrival's order
// on both).
func TestFleetQueueJoinsWithTheConsumer(t *testing.T) {
	r, g, _, c := limitedGroup(t)
	fq := &fakeFleetQueue{}
	g.Fleet = fq
	for range 10 { // this instance's window: spent, so that the requests wait
		r.ServeGroup(context.Background(), g, chatReq)
	}
	reqs := []*Request{userReq("b1", DefaultPriority), userReq("b2", DefaultPriority), userReq("b3", DefaultPriority), userReq("c1", DefaultPriority)}
	for i, req := range reqs {
		req.Consumer, req.Weight = "batch", 1
		if i == 3 {
			req.Consumer, req.Weight = "chat", 3
		}
	}
	simulate(t, c, len(reqs), func(i int) { r.ServeGroup(context.Background(), g, reqs[i]) })
	fq.mu.Lock()
	got := slices.Clone(fq.consumers)
	fq.mu.Unlock()
	if !slices.Contains(got, "chat:3") || !slices.Contains(got, "batch:1") {
		t.Errorf("expected the fleet's queue joined with the consumers and weights (chat:3, batch:1), got %v", got)
	}
}

// A request that leaves the fleet's queue unserved (its 429, its
// deadline) leaves it by LeaveUnserved, which gives its consumer's turn
// back fleet-wide as unspend does here; one served leaves by Leave. With
// 15 of other instances ahead (TestAPlaceIsCountedFleetWide), all 20 of a
// burst leave unserved; with none ahead, the 5 that wait for the next
// window are served and leave by Leave.
func TestFleetQueueLeavesUnservedGiveTheirTurnsBack(t *testing.T) {
	for _, c := range []struct {
		name           string
		others         int64
		burst          int
		served, unserv int
	}{{"behind others", 15, 20, 0, 20}, {"served", 0, 5, 5, 0}} {
		r, g, _, clock := limitedGroup(t)
		fq := &fakeFleetQueue{others: c.others}
		g.Fleet = fq
		for range 10 { // this instance's window: spent, so that the burst waits
			r.ServeGroup(context.Background(), g, chatReq)
		}
		codes := make([]int, c.burst)
		simulate(t, clock, c.burst, func(i int) {
			req := userReq(strconv.Itoa(i), DefaultPriority)
			req.Consumer, req.Weight = "chat", 1
			codes[i] = outcomeOf(r.ServeGroup(context.Background(), g, req), 0).status
		})
		fq.mu.Lock()
		left, unserved, joins := fq.left, fq.unserved, fq.joins
		fq.mu.Unlock()
		if ok := slices.Index(codes, 200) >= 0; ok != (c.served > 0) {
			t.Errorf("%s: codes %v", c.name, codes)
		}
		if joins != c.burst || unserved != c.unserv || left-unserved != c.served {
			t.Errorf("%s: expected %d joins, %d leaves unserved and %d served, got %d joins, %d unserved of %d leaves (codes %v)",
				c.name, c.burst, c.unserv, c.served, joins, unserved, left, codes)
		}
	}
}
