package fleet

import (
	"math"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// An instance reports a consumer's budget as the fleet spent and holds it
// (GET /llm_router/consumers, the status page): on budget 1 USD per 24
// hours over two instances, 0.05 spent on the first and 0.07 on the
// second, with 0.03 held in flight on the second, each instance reports
// 0.12 spent and 0.03 held, fleet-wide (each reported its own spend
// before: 0.05 and 0.07), though each instance's slice holds more of the
// budget's total unspent. Its requests in the last minute stay its own.
func TestAnInstanceReportsTheFleetsBudget(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 1, BudgetPer: 24 * time.Hour})
	spend := func(r *consumer.Registry, worst, cost float64) {
		tk, ref := r.AdmitHolding(time.Now(), "alice", "fast", 10, worst)
		if ref != nil {
			t.Fatalf("expected a request admitted, got %s", ref.Message)
		}
		tk.Done(time.Now(), cost)
	}
	spend(regs[0], 0.10, 0.05)
	spend(regs[1], 0.10, 0.07)
	inFlight, ref := regs[1].AdmitHolding(time.Now(), "alice", "fast", 10, 0.03)
	if ref != nil {
		t.Fatalf("expected the request in flight admitted, got %s", ref.Message)
	}
	defer inFlight.Done(time.Now(), 0)
	var last consumer.Usage
	eventually(t, 3*time.Second, "the fleet's spend and holds reported by both instances", func() bool {
		for _, r := range regs {
			rep := r.Report(time.Now())
			if len(rep) != 1 {
				t.Fatalf("expected alice reported, got %+v", rep)
			}
			last = rep[0]
			if !last.FleetWide || math.Abs(last.SpentUSD-0.12) > 1e-6 || math.Abs(last.HeldUSD-0.03) > 1e-6 {
				time.Sleep(50 * time.Millisecond)
				return false
			}
		}
		return true
	})
	if last.Requests != 2 {
		t.Errorf("expected the second instance's own 2 requests of the last minute, got %+v", last)
	}
	t.Logf("reported: %+v", last)
}

// While Redis does not answer, an instance reports its own spend of the
// budget (not fleet-wide), at once: the report is not the request path's,
// but it is bounded by the store's timeout all the same.
func TestAnInstanceReportsItsOwnBudgetWhileRedisIsDown(t *testing.T) {
	rp := startRedis(t, freePort(t, 0, 0))
	regs := fleetRegistries(t, rp.URL(), 1, consumer.Plan{Name: "team", BudgetUSD: 1, BudgetPer: 24 * time.Hour})
	tk, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.10)
	if ref != nil {
		t.Fatalf("expected a request admitted, got %s", ref.Message)
	}
	tk.Done(time.Now(), 0.05)
	rp.kill()
	start := time.Now()
	rep := regs[0].Report(time.Now())
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the report took %v with Redis down", took)
	}
	if len(rep) != 1 || rep[0].FleetWide || math.Abs(rep[0].SpentUSD-0.05) > 1e-6 {
		t.Errorf("expected this instance's 0.05 USD spent, not fleet-wide, got %+v", rep)
	}
}
