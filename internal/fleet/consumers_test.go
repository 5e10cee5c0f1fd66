package fleet

import (
	"net/http"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// fleetRegistries returns n registries of plan, each on its own store of
// one fleet (Redis at url), with alice on the plan.
func fleetRegistries(t *testing.T, url string, n int, plan consumer.Plan) []*consumer.Registry {
	t.Helper()
	regs := make([]*consumer.Registry, n)
	for i := range regs {
		in := newInstance(t, url, time.Second, 0, 0)
		r, err := consumer.New([]consumer.Plan{plan}, map[string]string{"alice": plan.Name})
		if err != nil {
			t.Fatal(err)
		}
		r.SetFleet(in.store)
		regs[i] = r
	}
	return regs
}

// A consumer's rpm holds across the fleet: two instances on one real
// redis-server, rpm 10, 20 requests spread over both admit exactly 10 in
// the minute; the others are refused with 429 rpm and a Retry-After until
// the fleet's minute has room (the minute since the first admission, plus
// at most a grant's use, declaredUse).
func TestConsumerRPMHoldsAcrossTheFleet(t *testing.T) {
	url := realRedisURL(t)
	regs := fleetRegistries(t, url, 2, consumer.Plan{Name: "team", RPM: 10})
	start := time.Now()
	admitted := 0
	var refused []*consumer.Refusal
	for i := range 20 {
		tk, ref := regs[i%2].Admit(time.Now(), "alice", "fast", 100)
		if ref != nil {
			refused = append(refused, ref)
			continue
		}
		admitted++
		tk.Done(time.Now(), 0)
	}
	elapsed := time.Since(start)
	if admitted != 10 {
		t.Fatalf("expected exactly the rpm's 10 of 20 admitted across two instances, got %d", admitted)
	}
	for _, ref := range refused {
		if ref.Status != http.StatusTooManyRequests || ref.Limit != consumer.LimitRPM {
			t.Errorf("expected 429 rpm, got %d %s (%s)", ref.Status, ref.Limit, ref.Message)
		}
		if lo, hi := time.Minute-elapsed-time.Second, time.Minute+declaredUse+time.Second; ref.RetryAfter < lo || ref.RetryAfter > hi {
			t.Errorf("expected a Retry-After until the fleet's minute has room (%s to %s), got %s", lo, hi, ref.RetryAfter)
		}
	}
}
