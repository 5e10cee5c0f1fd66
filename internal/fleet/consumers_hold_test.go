package fleet

import (
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// A consumer's budget holds each request's worst case fleet-wide, no more
// than the budget has left, as one instance's does: on budget 1 USD per
// hour over two instances, a request whose worst case (1.5 USD) is more
// than the whole budget is admitted (it holds the whole 1 USD; served
// whole), the next one, on the other instance, is refused 429 budget
// while it is in flight (admitted before: the fleet held a millionth of
// a USD), and once the first is answered at 0.01 USD the budget admits
// again (from the first instance's slice, which holds what the answer
// did not spend until it goes back idle).
func TestConsumerBudgetHoldsTheWorstCaseAcrossTheFleet(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 1, BudgetPer: time.Hour})
	first, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 1.5)
	if ref != nil {
		t.Fatalf("expected the first request admitted into an unspent budget, got %s", ref.Message)
	}
	if _, ref := regs[1].AdmitHolding(time.Now(), "alice", "fast", 10, 1.5); ref == nil || ref.Limit != consumer.LimitBudget {
		t.Errorf("expected the second refused for the budget while the first holds it, got %+v", ref)
	}
	first.Done(time.Now(), 0.01)
	if tk, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.5); ref != nil {
		t.Errorf("expected the budget to admit again once the first settled, got %s", ref.Message)
	} else {
		tk.Done(time.Now(), 0.01)
	}
}

// A refusal for holds in flight tells the wait for holds, not for the
// window: on budget 0.20 USD per 24 hours over two instances, a request
// holding its worst case of 0.17 USD in flight on one instance leaves
// 0.03, which the next request (worst case 0.05, on the other instance)
// holds; a third is refused on either instance (the budget is not spent:
// the holds settle at their answers' cost), with a
// Retry-After of seconds (the refusal once said the window's end, up to
// 24 hours) and a message that names the holds. Once the fleet has spent
// the budget the refusal is until the window renews (for a request
// larger than what the instances' slices last recorded: a slice spent
// since counts as one that may come back until its instance leases again
// or its entry expires, spendSliceEntry).
func TestAConsumerRefusedForHoldsIsToldTheirWait(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 0.20, BudgetPer: 24 * time.Hour})
	first, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.17)
	if ref != nil {
		t.Fatalf("expected the first request admitted into an unspent budget, got %s", ref.Message)
	}
	second, ref := regs[1].AdmitHolding(time.Now(), "alice", "fast", 10, 0.05)
	if ref != nil {
		t.Fatalf("expected the second request admitted (it holds the 0.03 left), got %s", ref.Message)
	}
	for i, r := range regs {
		_, ref := r.AdmitHolding(time.Now(), "alice", "fast", 10, 0.05)
		if ref == nil || ref.Limit != consumer.LimitBudget {
			t.Fatalf("instance %d: expected a refusal for the budget while all of it is held, got %+v", i, ref)
		}
		t.Logf("instance %d: Retry-After %v: %s", i, ref.RetryAfter, ref.Message)
		if ref.RetryAfter <= 0 || ref.RetryAfter > 5*time.Second || !strings.Contains(ref.Message, "come back") {
			t.Errorf("instance %d: expected a Retry-After of seconds for holds in flight, and a message naming them; got %v: %s", i, ref.RetryAfter, ref.Message)
		}
	}
	first.Done(time.Now(), 0.17) // their answers cost their holds: the whole budget
	second.Done(time.Now(), 0.03)
	for i, r := range regs {
		_, ref := r.AdmitHolding(time.Now(), "alice", "fast", 10, 0.05)
		if ref == nil || ref.Limit != consumer.LimitBudget {
			t.Fatalf("instance %d: expected a refusal for a spent budget, got %+v", i, ref)
		}
		end := time.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)
		if got := time.Now().Add(ref.RetryAfter); got.Before(end.Add(-5*time.Second)) || strings.Contains(ref.Message, "come back") {
			t.Errorf("instance %d: expected a spent budget refused until the window renews (%s), got Retry-After %v: %s", i, end, ref.RetryAfter, ref.Message)
		}
	}
}
