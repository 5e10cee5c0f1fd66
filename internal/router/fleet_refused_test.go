package router

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// refusingFleet is a deployment's fleet whose declared window refuses the
// first refuse claims (Reserve: spent for wait, 200 ms when 0) and takes
// the others.
type refusingFleet struct {
	mu               sync.Mutex
	refuse, reserves int
	wait             time.Duration
}

func (f *refusingFleet) Publish(capacity.Shared) {}
func (f *refusingFleet) Reserve(rpm, tpm, tokens int64) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reserves++
	if f.refuse > 0 {
		f.refuse--
		if f.wait > 0 {
			return f.wait, nil
		}
		return 200 * time.Millisecond, nil
	}
	return 0, nil
}
func (f *refusingFleet) ClaimProbe() (bool, error) { return true, nil }
func (f *refusingFleet) ReleaseProbe()             {}
func (f *refusingFleet) Spend(capacity.Budget) (time.Duration, capacity.Budget, error) {
	none := capacity.BudgetWindow{Limit: provider.Unknown}
	return 0, capacity.Budget{Requests: none, Tokens: none}, nil
}

// A request that waited in the fleet's queue and whose claim is refused
// at the last step (take: the fleet's declared window spent meanwhile)
// left the fleet's queue served, its consumer's turn taken: it joins
// again giving that turn back (FleetJoin.GiveBack), so that it is charged
// one turn for the one request served, not one per refused claim. Three
// claims refused, then served: 4 joins, 3 of them giving back (none
// before: 4 turns charged), no Leave unserved; this instance's queue
// kept its fair tag (its consumer's next request starts one turn after
// it, not four).
func TestARefusedClaimIsNotChargedASecondTurn(t *testing.T) {
	r, g, _, c := limitedGroup(t)
	fq := &fakeFleetQueue{}
	g.Fleet = fq
	for range 10 { // this instance's window: spent, so that the request waits
		r.ServeGroup(context.Background(), g, chatReq)
	}
	f := &refusingFleet{refuse: 3}
	d := g.Deployments[0]
	d.State.Declare(1000, 0)
	d.State.SetFleet(f)
	req := userReq("chat", DefaultPriority)
	req.Consumer, req.Weight = "chat", 1
	var res *Result
	simulate(t, c, 1, func(int) { res = r.ServeGroup(context.Background(), g, req) })
	if res.Err != nil {
		t.Fatalf("expected the request served once its claim was taken, got %v", res.Err)
	}
	fq.mu.Lock()
	joins, giveBacks, left, unserved := fq.joins, fq.giveBacks, fq.left, fq.unserved
	fq.mu.Unlock()
	f.mu.Lock()
	reserves := f.reserves
	f.mu.Unlock()
	if reserves != 4 {
		t.Fatalf("expected 3 claims refused and the 4th taken, got %d claims", reserves)
	}
	if joins != 4 || giveBacks != 3 || unserved != 0 || left != 4 {
		t.Errorf("expected 4 joins of which 3 gave the turn back, 4 served leaves and none unserved (one turn charged), got %d joins, %d giving back, %d leaves, %d unserved",
			joins, giveBacks, left, unserved)
	}
	g.queue.mu.Lock()
	f0 := g.queue.finish[fairKey{DefaultPriority, "chat"}]
	g.queue.mu.Unlock()
	if f0 != 1 {
		t.Errorf("this instance's queue: chat's last finish %v, expected 1 (one turn)", f0)
	}
}

// A request whose claim is refused after its served leave from the
// fleet's queue, and that is then answered 429 before it joins again (the
// fleet's window spent for longer than its deadline leaves), gives its
// consumer's turn back all the same: a join giving back the served
// leave's, left unserved (2 joins, 1 giving back, 1 Leave unserved: no
// turn charged; 1 join, no give-back and no Leave unserved before: one
// turn charged for a request never served).
func TestARefusedClaimThatEndsUnservedGivesItsTurnBack(t *testing.T) {
	r, g, _, c := limitedGroup(t)
	fq := &fakeFleetQueue{}
	g.Fleet = fq
	for range 10 { // this instance's window: spent, so that the request waits
		r.ServeGroup(context.Background(), g, chatReq)
	}
	f := &refusingFleet{refuse: 1, wait: time.Minute}
	d := g.Deployments[0]
	d.State.Declare(1000, 0)
	d.State.SetFleet(f)
	req := userReq("chat", DefaultPriority)
	req.Consumer, req.Weight = "chat", 1
	var res *Result
	simulate(t, c, 1, func(int) { res = r.ServeGroup(context.Background(), g, req) })
	if o := outcomeOf(res, 0); o.status != 429 {
		t.Fatalf("expected a 429 once the fleet's window is spent past the deadline, got %+v (%v)", o, res.Err)
	}
	fq.mu.Lock()
	joins, giveBacks, unserved := fq.joins, fq.giveBacks, fq.unserved
	fq.mu.Unlock()
	if joins-giveBacks-unserved != 0 || giveBacks != 1 || unserved != 1 {
		t.Errorf("expected no turn charged (2 joins, 1 giving back, 1 Leave unserved), got %d joins, %d giving back, %d unserved", joins, giveBacks, unserved)
	}
}
