package fleet

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// fleetRegistries returns n registries of plan, each on its own store of
// one fleet (Redis at url); every consumer is on the plan (its default).
func fleetRegistries(t *testing.T, url string, n int, plan consumer.Plan) []*consumer.Registry {
	t.Helper()
	regs, _ := fleetRegistriesOn(t, url, n, plan, 2*time.Second) // what the fleet admits, not a slow Redis (patientBindings)
	return regs
}

// fleetRegistriesOn is fleetRegistries on stores of the given timeout, and
// returns the stores too.
func fleetRegistriesOn(t *testing.T, url string, n int, plan consumer.Plan, timeout time.Duration) ([]*consumer.Registry, []*Store) {
	t.Helper()
	return fleetRegistriesObserved(t, url, plan, timeout, make([]Observer, n))
}

// fleetRegistriesObserved is fleetRegistriesOn with one store per
// observer (nil: none).
func fleetRegistriesObserved(t *testing.T, url string, plan consumer.Plan, timeout time.Duration, obs []Observer) ([]*consumer.Registry, []*Store) {
	t.Helper()
	regs, stores := make([]*consumer.Registry, len(obs)), make([]*Store, len(obs))
	for i := range regs {
		s, err := New(Options{URL: url, KeyPrefix: keyPrefix(t), PollInterval: time.Second, Timeout: timeout, Observer: obs[i]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		eventually(t, 5*time.Second, "the store up", s.Up)
		plan.Name = consumer.DefaultPlan
		r, err := consumer.New([]consumer.Plan{plan}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.SetFleet(s)
		regs[i], stores[i] = r, s
	}
	return regs, stores
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
	opt, _ := redis.ParseURL(url)
	c := redis.NewClient(opt)
	defer c.Close()
	keys, _ := c.Keys(context.Background(), keyPrefix(t)+"*").Result()
	shared := false
	for _, k := range keys {
		shared = shared || strings.Contains(k, "{c:")
		if strings.Contains(k, "alice") {
			t.Errorf("key %q shows the consumer's name", k)
		}
	}
	if !shared {
		t.Errorf("expected the consumer's minute in Redis, keys: %v", keys)
	}
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

// Eight instances at once, four goroutines each, admitting one consumer's
// requests as fast as they can under rpm 120: the fleet admits at most the
// minute's 120 (the grants never add up to more), and what a grant did not
// use goes back once its use ends, so that it admits all 120. (A real Redis
// on stores whose timeout a loaded machine does not reach: see
// patientBindings.)
func TestConsumerRPMNeverExceededByEightInstances(t *testing.T) {
	url := realRedisURL(t)
	regs, _ := fleetRegistriesOn(t, url, 8, consumer.Plan{Name: "team", RPM: 120}, 2*time.Second)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(declaredUse + 2*consumerRecheck)
	for _, r := range regs {
		for range 4 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					if tk, ref := r.Admit(time.Now(), "alice", "fast", 10); ref == nil {
						admitted.Add(1)
						tk.Done(time.Now(), 0)
					}
					time.Sleep(2 * time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got != 120 {
		t.Errorf("expected exactly the minute's 120 admitted by the fleet, got %d", got)
	}
}

// A consumer's tpm holds across the fleet too, and its refusal names it:
// tpm 1000, requests of 300 tokens on two instances: 3 admitted (900), the
// fourth refused with 429 tpm.
func TestConsumerTPMHoldsAcrossTheFleet(t *testing.T) {
	url := realRedisURL(t)
	regs := fleetRegistries(t, url, 2, consumer.Plan{Name: "team", TPM: 1000})
	admitted := 0
	for i := range 6 {
		tk, ref := regs[i%2].Admit(time.Now(), "alice", "fast", 300)
		if ref == nil {
			admitted++
			tk.Done(time.Now(), 0)
			continue
		}
		if ref.Status != http.StatusTooManyRequests || ref.Limit != consumer.LimitTPM || ref.RetryAfter < 50*time.Second {
			t.Errorf("expected 429 tpm until the minute has room, got %d %s %s (%s)", ref.Status, ref.Limit, ref.RetryAfter, ref.Message)
		}
	}
	if admitted != 3 {
		t.Errorf("expected 3 requests of 300 tokens admitted under tpm 1000 across two instances, got %d", admitted)
	}
}

// Redis stays off the request path: two instances admitting a consumer's
// requests at 400 a second each under rpm 100000 ask Redis for a grant now
// and then (at most 0.1 commands per request, polls and all), and a
// consumer over its limit costs about a Redis call a second per instance,
// not one per refused request.
func TestConsumerLimitsKeepRedisOffTheRequestPath(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		for _, tc := range []struct {
			name   string
			rpm    int64
			admit  int
			maxPer float64
		}{{"under the limit", 100_000, 800, 0.1}, {"over the limit", 5, 5, 0.05}} {
			who := tc.name // one consumer a case
			regs, stores := fleetRegistriesOn(t, url, 2, consumer.Plan{Name: "team", RPM: tc.rpm}, 200*time.Millisecond)
			hooks := []*countHook{{}, {}}
			for i, s := range stores {
				s.client.AddHook(hooks[i])
			}
			const n = 800
			admitted := 0
			for i := range n {
				if tk, ref := regs[i%2].Admit(time.Now(), who, "fast", 10); ref == nil {
					admitted++
					tk.Done(time.Now(), 0)
				}
				time.Sleep(1250 * time.Microsecond)
			}
			cmds := hooks[0].n.Load() + hooks[1].n.Load()
			t.Logf("%s: %d Redis commands for %d requests (%.3f per request), %d admitted", tc.name, cmds, n, float64(cmds)/n, admitted)
			if admitted != tc.admit {
				t.Errorf("%s: expected %d admitted, got %d", tc.name, tc.admit, admitted)
			}
			if per := float64(cmds) / n; per > tc.maxPer {
				t.Errorf("%s: expected at most %.2f Redis commands per request, got %.3f (%d for %d)", tc.name, tc.maxPer, per, cmds, n)
			}
		}
	})
}

// The Retry-After of a fleet refusal is the real wait: on a fleet whose
// consumers' minute is 2 s (a grant counts until 2 s after its use can
// end, declaredUse), rpm 4 on two instances: the fifth request is refused
// with a wait; half a second before it ends the fleet still refuses, and
// just after it the fleet admits again.
func TestConsumerRetryAfterIsTheFleetsWait(t *testing.T) {
	url := realRedisURL(t)
	regs, stores := fleetRegistriesOn(t, url, 2, consumer.Plan{Name: "team", RPM: 4}, 2*time.Second)
	for _, s := range stores {
		s.consumerWindow = 2 * time.Second
	}
	for i := range 4 {
		if _, ref := regs[i%2].Admit(time.Now(), "alice", "fast", 1); ref != nil {
			t.Fatalf("request %d refused: %s", i, ref.Message)
		}
	}
	_, ref := regs[0].Admit(time.Now(), "alice", "fast", 1)
	if ref == nil || ref.Limit != consumer.LimitRPM {
		t.Fatalf("expected the fifth request refused for rpm, got %+v", ref)
	}
	end := time.Now().Add(ref.RetryAfter)
	if ref.RetryAfter < time.Second || ref.RetryAfter > 2*time.Second+declaredUse {
		t.Fatalf("expected a wait of the minute (2 s) after the grants' use (up to %s), got %s", declaredUse, ref.RetryAfter)
	}
	time.Sleep(time.Until(end.Add(-500 * time.Millisecond)))
	if _, ref := regs[1].Admit(time.Now(), "alice", "fast", 1); ref == nil {
		t.Error("expected the fleet to refuse half a second before the Retry-After ends")
	}
	time.Sleep(time.Until(end.Add(100 * time.Millisecond)))
	for i, r := range regs {
		if _, ref := r.Admit(time.Now(), "alice", "fast", 1); ref != nil {
			t.Errorf("instance %d: expected the fleet to admit once the Retry-After ended, got %s (%s)", i, ref.RetryAfter, ref.Message)
		}
	}
}

// While Redis cannot answer, an instance admits a consumer's requests up
// to its share of the minute and no more (it never hangs): rpm 60, 10
// admitted with Redis up (the grant holds a few more), then Redis cut off
// with two instances in the census (this one and another): the places the
// instance's grant still holds and then its own counts admit 20 more (its
// share, 30, of the minute), the next requests
// refused 429 rpm with a Retry-After of a second (fleetRecheck: Redis may
// answer by then), each decision within the store's timeout or so.
func TestConsumerLimitsFromItsShareWhileRedisIsDown(t *testing.T) {
	url := realRedisURL(t)
	opt, _ := redis.ParseURL(url)
	p := newCutProxy(t, opt.Addr)
	const timeout = 200 * time.Millisecond
	regs, stores := fleetRegistriesOn(t, fmt.Sprintf("redis://%s/%d", p.l.Addr(), opt.DB), 1, consumer.Plan{RPM: 60}, timeout)
	eventually(t, 5*time.Second, "the census counts the instance", func() bool { return stores[0].instances() == 1 })
	admit := func() *consumer.Refusal {
		start := time.Now()
		tk, ref := regs[0].Admit(time.Now(), "alice", "fast", 1)
		if took := time.Since(start); took > 2*timeout+100*time.Millisecond {
			t.Errorf("a decision took %s (timeout %s)", took, timeout)
		}
		if ref == nil {
			tk.Done(time.Now(), 0)
		}
		return ref
	}
	for range 10 {
		if ref := admit(); ref != nil {
			t.Fatalf("refused with Redis up: %s", ref.Message)
		}
	}
	pl := &stores[0].consumerLimits("alice", consumer.DefaultPlan).b.places
	p.setCut(true)
	eventually(t, 2*time.Second, "no renewal in flight", func() bool {
		pl.mu.Lock()
		defer pl.mu.Unlock()
		return pl.flight.done == nil
	})
	pl.mu.Lock()
	free := int64(0)
	for _, g := range pl.grants {
		free += g.n - g.used
	}
	pl.mu.Unlock()
	t.Logf("%d places held when Redis is cut", free)
	stores[0].peers.Store(2) // the census as another instance's mark left it (no poll answers now)
	if free == 0 || free > 20 {
		t.Fatalf("expected the grant to hold a few places beyond the 10 used, holds %d", free)
	}
	admitted := int64(0)
	var last *consumer.Refusal
	for range 30 {
		if ref := admit(); ref == nil {
			admitted++
		} else {
			last = ref
		}
	}
	if admitted != 20 {
		t.Errorf("expected the minute's 20 left admitted with Redis down (%d of them the places held), and no more: %d", free, admitted)
	}
	if last == nil || last.Limit != consumer.LimitRPM || last.RetryAfter != time.Second {
		t.Errorf("expected the requests beyond the share refused 429 rpm, Retry-After 1s, got %+v", last)
	}
}

// A consumer's fleet-wide minute is per plan: two routers sharing a store
// (two llm_router blocks) that put alice on plans of different names count
// her apart, as each would on its own: rpm 2 on each, 2 admitted on each,
// the third refused on the first.
func TestConsumerMinuteIsPerPlan(t *testing.T) {
	url := realRedisURL(t)
	regs, stores := fleetRegistriesOn(t, url, 1, consumer.Plan{RPM: 2}, 2*time.Second)
	other, err := consumer.New([]consumer.Plan{{Name: "other", RPM: 2}}, map[string]string{"alice": "other"})
	if err != nil {
		t.Fatal(err)
	}
	other.SetFleet(stores[0])
	for i, r := range []*consumer.Registry{regs[0], regs[0], other, other} {
		if _, ref := r.Admit(time.Now(), "alice", "fast", 1); ref != nil {
			t.Errorf("request %d: expected it admitted (rpm 2 per plan), refused: %s", i, ref.Message)
		}
	}
	if _, ref := regs[0].Admit(time.Now(), "alice", "fast", 1); ref == nil {
		t.Error("expected the third request on the default plan refused")
	}
}
