package router

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// fakeFleet is a fleet's queue as Redis holds it, shared by instances
// (each a fleetView): its members ordered by priority, then arrival (ms),
// then instance and the instance's own order, as fleet.Queue's script
// orders them. Each instance's calls are group-committed as fleet.Queue's
// are (a call made while one is in flight goes in the next, with every
// call made meanwhile), and each batch is one round trip of rtt real time.
// joinTrips counts the round trips that carried joins, joins the joins.
type fakeFleet struct {
	mu        sync.Mutex
	members   []string
	joinTrips atomic.Int64
	joins     atomic.Int64
}

// fleetView is one instance's FleetQueue on a fakeFleet.
type fleetView struct {
	f      *fakeFleet
	origin int
	rtt    time.Duration
	calls  atomic.Int64 // joins and looks asked
	mu     sync.Mutex
	queue  []*fakeCall // calls for the next round trip
	busy   bool        // a round trip is in flight
	seq    int
}

// fakeCall is one call in a round trip: a join ('j'), a look ('a') or a
// leave ('l') of member, and its answer (-1: not there).
type fakeCall struct {
	kind   byte
	member string
	ahead  int64
	done   chan struct{}
}

// member names a request as the fake's order sorts it: priority (higher
// first), arrival ms, instance, the instance's own order, a number unique
// to the join.
func (v *fleetView) member(priority, maxPriority int, arrival time.Time, order uint64) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seq++
	return fmt.Sprintf("%02d-%020d-%d-%016x-%d", maxPriority-priority, arrival.UnixMilli(), v.origin, order, v.seq)
}

// do sends cs in the next round trip and waits for their answers.
func (v *fleetView) do(cs ...*fakeCall) {
	for _, c := range cs {
		c.done = make(chan struct{})
	}
	v.mu.Lock()
	v.queue = append(v.queue, cs...)
	lead := !v.busy
	v.busy = true
	v.mu.Unlock()
	if lead {
		go v.send()
	}
	for _, c := range cs {
		<-c.done
	}
}

// send makes round trips until no call is left.
func (v *fleetView) send() {
	for {
		v.mu.Lock()
		batch := v.queue
		v.queue = nil
		if len(batch) == 0 {
			v.busy = false
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		time.Sleep(v.rtt)
		v.f.apply(batch)
		for _, c := range batch {
			close(c.done)
		}
	}
}

// apply applies a round trip's calls in order, then answers each place.
func (f *fakeFleet) apply(batch []*fakeCall) {
	f.mu.Lock()
	defer f.mu.Unlock()
	joins := int64(0)
	for _, c := range batch {
		if c.kind == 'j' {
			joins++
		}
		i, found := slices.BinarySearch(f.members, c.member)
		switch {
		case c.kind == 'j' && !found:
			f.members = slices.Insert(f.members, i, c.member)
		case c.kind == 'l' && found:
			f.members = slices.Delete(f.members, i, i+1)
		}
	}
	if joins > 0 {
		f.joinTrips.Add(1)
		f.joins.Add(joins)
	}
	for _, c := range batch {
		i, found := slices.BinarySearch(f.members, c.member)
		c.ahead = int64(i)
		if !found {
			c.ahead = -1
		}
	}
}

func (v *fleetView) JoinAll(joins []FleetJoin) {
	v.calls.Add(int64(len(joins)))
	cs := make([]*fakeCall, len(joins))
	for i, j := range joins {
		cs[i] = &fakeCall{kind: 'j', member: v.member(j.Priority, j.MaxPriority, j.Arrival, j.Order)}
	}
	v.do(cs...)
	for i, c := range cs {
		joins[i].Member, joins[i].Ahead, joins[i].TokensAhead = c.member, c.ahead, 10*c.ahead
	}
}

func (v *fleetView) Ahead(member string, withTokens bool) (int64, int64, error) {
	v.calls.Add(1)
	c := &fakeCall{kind: 'a', member: member}
	v.do(c)
	if c.ahead < 0 {
		return 0, 0, fmt.Errorf("%s: not queued", member)
	}
	return c.ahead, 10 * c.ahead, nil
}

func (v *fleetView) Leave(member string) { v.do(&fakeCall{kind: 'l', member: member}) }

func (v *fleetView) LeaveUnserved(member string) { v.Leave(member) }

// Issue 30's burst on the fake clock, smaller: 1,400 requests at once, half
// on each of two instances that share one window of 200 per 10 s (one
// State, as the fleet's leases share it: never overspent) and the fleet's
// queue (each instance's calls batched, a round trip of 2 ms each);
// deadline 25 s. The ideal: 200 served now, 200 at 10 s, 200 at 20 s, and
// the other 800 told at once (on the fake clock: at 0). What made them late
// on real machines is the round trips they waited on: each instance joined
// the fleet's queue one request at a time (a lock held across each Join's
// round trip), so the last of a burst's joins landed hundreds of round
// trips after it arrived, and its 429 after that (0.5-1.7 s in the bench's
// fleet-burst scenario). Now the joins that come while one is in flight go
// together in the next round trip: fewer than one round trip per four
// joins (one per join before).
func TestAFleetBurstJoinsTogether(t *testing.T) {
	c := newManualClock()
	p := &windowed{c: c, limit: 200, span: 10 * time.Second}
	f := &fakeFleet{}
	var routers [2]*Router
	var groups [2]*Group
	var views [2]*fleetView
	for i := range routers {
		routers[i], groups[i] = manualGroup(c, p, 25*time.Second)
		views[i] = &fleetView{f: f, origin: i, rtt: 2 * time.Millisecond}
		groups[i].Fleet = views[i]
	}
	groups[1].Deployments[0].State = groups[0].Deployments[0].State // one window for the fleet
	if res := routers[0].ServeGroup(context.Background(), groups[0], chatReq); res.Err != nil {
		t.Fatalf("warm-up: %v", res.Err)
	}
	c.advanceTo(c.Now().Add(10*time.Second + 2*capacity.ResetMargin))
	p.served = 0
	start := c.Now()
	out := make([]served, 1400)
	simulate(t, c, len(out), func(i int) {
		res := routers[i%2].ServeGroup(context.Background(), groups[i%2], userReq(strconv.Itoa(i), DefaultPriority))
		out[i] = outcomeOf(res, c.Now().Sub(start))
	})
	byWindow := map[time.Duration]int{}
	told, late, other := 0, 0, 0
	for _, o := range out {
		switch {
		case o.status == 200:
			byWindow[o.at/(10*time.Second)*(10*time.Second)]++
		case o.status == 429 && o.at == 0 && o.retry >= 25*time.Second:
			told++
		case o.status == 429:
			late++
		default:
			other++
		}
	}
	want := map[time.Duration]int{0: 200, 10 * time.Second: 200, 20 * time.Second: 200}
	if !maps.Equal(byWindow, want) || told != 800 || p.got429 != 0 {
		t.Errorf("expected 200 served in each of the three windows, 800 told at once that their place cannot be served, no upstream 429; "+
			"got %v served, %d told so, %d 429s late or without Retry-After, %d other, %d upstream 429s", byWindow, told, late, other, p.got429)
	}
	joins, trips := f.joins.Load(), f.joinTrips.Load()
	t.Logf("%d joins of the fleet's queue in %d round trips; joins and looks asked: %d and %d", joins, trips, views[0].calls.Load(), views[1].calls.Load())
	if joins == 0 || 4*trips > joins {
		t.Errorf("expected the burst's joins together, fewer than one round trip per four; got %d joins in %d round trips", joins, trips)
	}
}

// A place another instance's requests push back (they arrived earlier, or
// ask a higher priority, and joined the fleet's queue after it) is told
// soon, not when the window comes: 20 wait here on 10 per 10 s (deadline
// 25 s: the windows at 10 and 20 s hold them all); at 1 s, 15 of another
// instance join ahead of them, and the 15 at the back are past their
// deadlines' windows. The head looks again every fleetLook and prunes
// those behind it from its own fleet-wide place: the 15 are told by
// 1.1 s. Before, the head slept until the window (and pruned on this
// instance's places alone), the others until they were woken: they were
// told from 10 s on, one at a time.
func TestAPlacePushedBackFleetWideIsToldSoon(t *testing.T) {
	r, g, p, c := limitedGroup(t)
	fq := &fakeFleetQueue{}
	g.Fleet = fq
	for range 10 {
		r.ServeGroup(context.Background(), g, chatReq) // the window spent: all 20 queue
	}
	p.served = 0
	out := make([]served, 20)
	start := c.Now()
	simulate(t, c, len(out)+1, func(i int) {
		if i == len(out) {
			_ = c.Sleep(context.Background(), time.Second)
			fq.mu.Lock()
			fq.others = 15
			fq.mu.Unlock()
			return
		}
		out[i] = outcomeOf(r.ServeGroup(context.Background(), g, userReq(strconv.Itoa(i), DefaultPriority)), c.Now().Sub(start))
	})
	soon := 0
	var when []time.Duration
	for _, o := range out {
		if o.status == 429 && o.at >= time.Second && o.at <= 1100*time.Millisecond {
			soon++
		}
		when = append(when, o.at)
	}
	if soon != 15 || p.got429 != 0 {
		t.Errorf("expected the 15 pushed past their deadlines' windows told by 1.1 s, got %d (answered at %v; upstream 429s %d)", soon, when, p.got429)
	}
}
