package fleet

import (
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
