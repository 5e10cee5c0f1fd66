package fleet

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// A consumer's concurrent holds across the fleet: two instances on one
// real redis-server, concurrent 3, ten requests spread over both and none
// done: exactly 3 in flight fleet-wide, the others 429 concurrent; once
// one is done, the instance that did not hold it admits one more (its
// place given back, then leased by the other).
func TestConsumerConcurrentHoldsAcrossTheFleet(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", Concurrent: 3})
	var held []*consumer.Ticket
	var on []int
	for i := range 10 {
		tk, ref := regs[i%2].Admit(time.Now(), "alice", "fast", 10)
		if ref != nil {
			if ref.Status != http.StatusTooManyRequests || ref.Limit != consumer.LimitConcurrent {
				t.Errorf("expected 429 concurrent, got %d %s (%s)", ref.Status, ref.Limit, ref.Message)
			}
			continue
		}
		held, on = append(held, tk), append(on, i%2)
	}
	if len(held) != 3 {
		t.Fatalf("expected exactly concurrent's 3 of 10 in flight across two instances, got %d", len(held))
	}
	held[0].Done(time.Now(), 0)
	other := regs[1-on[0]]
	eventually(t, 5*time.Second, "the other instance to admit into the place given back", func() bool {
		tk, ref := other.Admit(time.Now(), "alice", "fast", 10)
		if ref == nil {
			held[0] = tk
		}
		return ref == nil
	})
	for _, r := range regs {
		if _, ref := r.Admit(time.Now(), "alice", "fast", 10); ref == nil {
			t.Error("expected the fleet full again at 3 in flight, a fourth admitted")
		}
	}
}

// Eight instances, four goroutines each, admitting one consumer's requests
// as fast as they can under concurrent 5, each request in flight for 2 ms:
// never more than 5 in flight fleet-wide, and the places move between
// instances (the fleet admits a few hundred in the run, on several of them).
func TestConsumerConcurrentNeverExceededByEightInstances(t *testing.T) {
	regs, _ := fleetRegistriesOn(t, realRedisURL(t), 8, consumer.Plan{Name: "team", Concurrent: 5}, 2*time.Second)
	var inFlight, peak, admitted atomic.Int64
	var served [8]atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(3 * time.Second)
	for i, r := range regs {
		for range 4 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					tk, ref := r.Admit(time.Now(), "alice", "fast", 10)
					if ref != nil {
						time.Sleep(5 * time.Millisecond)
						continue
					}
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					admitted.Add(1)
					served[i].Add(1)
					time.Sleep(2 * time.Millisecond)
					inFlight.Add(-1)
					tk.Done(time.Now(), 0)
				}
			})
		}
	}
	wg.Wait()
	instances := 0
	for i := range served {
		if served[i].Load() > 0 {
			instances++
		}
	}
	t.Logf("%d admitted, peak %d in flight, on %d instances", admitted.Load(), peak.Load(), instances)
	if peak.Load() > 5 {
		t.Errorf("expected at most concurrent's 5 in flight fleet-wide, saw %d", peak.Load())
	}
	if admitted.Load() < 100 || instances < 2 {
		t.Errorf("expected the places to serve a few hundred requests on several instances, got %d on %d", admitted.Load(), instances)
	}
}

// A consumer's concurrent and budget cost no Redis call per request: two
// instances admitting its requests one after the other (800, 1.25 ms
// apart, each answer 0.001 USD) under concurrent 20 and a budget of 1000
// USD per hour lease their places and slices now and then (at most 0.1
// commands per request, polls and all).
func TestConsumerConcurrentAndBudgetKeepRedisOffTheRequestPath(t *testing.T) {
	regs, stores := fleetRegistriesOn(t, realRedisURL(t), 2, consumer.Plan{Name: "team", Concurrent: 20, BudgetUSD: 1000, BudgetPer: time.Hour}, 2*time.Second)
	hooks := []*countHook{{}, {}}
	for i, s := range stores {
		s.client.AddHook(hooks[i])
	}
	const n = 800
	admitted := 0
	for i := range n {
		if tk, ref := regs[i%2].Admit(time.Now(), "alice", "fast", 10); ref == nil {
			admitted++
			tk.Done(time.Now(), 0.001)
		}
		time.Sleep(1250 * time.Microsecond)
	}
	cmds := hooks[0].n.Load() + hooks[1].n.Load()
	t.Logf("%d Redis commands for %d requests (%.3f per request)", cmds, n, float64(cmds)/n)
	if admitted != n {
		t.Errorf("expected all %d admitted (one in flight at a time), got %d", n, admitted)
	}
	if per := float64(cmds) / n; per > 0.1 {
		t.Errorf("expected at most 0.1 Redis commands per request, got %.3f", per)
	}
}

// A consumer's budget holds across the fleet: two instances on budget
// 0.01 USD per hour, each answer costing 0.001: the fleet admits about
// 10 (never 20, each instance's own), and refuses the rest 429 budget
// with a Retry-After until the hour's window renews.
func TestConsumerBudgetHoldsAcrossTheFleet(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 0.01, BudgetPer: time.Hour})
	admitted := 0
	var last *consumer.Refusal
	for i := range 40 {
		tk, ref := regs[i%2].Admit(time.Now(), "alice", "fast", 10)
		if ref != nil {
			last = ref
			continue
		}
		admitted++
		tk.Done(time.Now(), 0.001)
	}
	if admitted < 9 || admitted > 11 {
		t.Fatalf("expected the fleet to admit about the budget's 10 answers of 0.001 USD (9 to 11), got %d", admitted)
	}
	if last == nil || last.Status != http.StatusTooManyRequests || last.Limit != consumer.LimitBudget {
		t.Fatalf("expected 429 budget, got %+v", last)
	}
	now := time.Now()
	renew := time.Unix(0, (now.UnixNano()/int64(time.Hour)+1)*int64(time.Hour))
	if d := renew.Sub(now) - last.RetryAfter; d < -time.Second || d > time.Second {
		t.Errorf("expected a Retry-After until the window renews (%s), got %s", renew.Sub(now), last.RetryAfter)
	}
}

// A Redis that stalls (a real redis-server paused with SIGSTOP: it takes
// connections and answers nothing) never lets the fleet admit more than a
// consumer's limit: past the store's timeout, an instance admits up to its
// share (outage.go), the places it holds counted in it. Two instances
// under rpm 20 (the census counting both) each admit 2 with Redis up (a
// grant each), then Redis is paused: 40 more requests on each admit at
// most 20 fleet-wide (40 and more on each instance's own minute), each
// decision within about the timeout.
func TestConsumerLimitsFromItsShareWhenRedisStalls(t *testing.T) {
	rp := startRedis(t, freePort(t, 0, 0))
	const timeout = 200 * time.Millisecond
	regs, stores := fleetRegistriesOn(t, rp.URL(), 2, consumer.Plan{RPM: 20, Concurrent: 20}, timeout)
	for _, s := range stores {
		eventually(t, 5*time.Second, "the census counts both instances", func() bool { return s.instances() == 2 })
	}
	admitted := 0
	admit := func(r *consumer.Registry) {
		start := time.Now()
		tk, ref := r.Admit(time.Now(), "alice", "fast", 1)
		if took := time.Since(start); took > 2*timeout+200*time.Millisecond {
			t.Errorf("a decision took %s (timeout %s)", took, timeout)
		}
		if ref == nil {
			admitted++
			tk.Done(time.Now(), 0)
		}
	}
	for _, r := range regs {
		admit(r)
		admit(r)
	}
	if admitted != 4 {
		t.Fatalf("expected 4 admitted with Redis up, got %d", admitted)
	}
	if err := rp.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rp.cmd.Process.Signal(syscall.SIGCONT) }()
	for range 40 {
		for _, r := range regs {
			admit(r)
		}
	}
	t.Logf("%d admitted in all, Redis paused after 4", admitted)
	if admitted > 20 {
		t.Errorf("expected at most the rpm's 20 admitted fleet-wide while Redis stalls, got %d", admitted)
	}
}

// What the router cannot have written in a consumer's places in flight
// is replaced, never trusted: a key of another type, entries that are no
// slice, a slice that ends a year ahead (an instance whose clock runs
// ahead, or another program). Each time the fleet still admits exactly the
// limit, 3, and no more.
func TestConsumerConcurrentReplacesMalformedEntries(t *testing.T) {
	url := realRedisURL(t)
	opt, _ := redis.ParseURL(url)
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		write func(key string) error
	}{
		{"another type", func(key string) error { return c.Set(ctx, key, "x", time.Minute).Err() }},
		{"no slice", func(key string) error { return c.HSet(ctx, key, "other", "garbage", "more", "-5:1:1").Err() }},
		{"a year ahead", func(key string) error {
			return c.HSet(ctx, key, "other", fmt.Sprintf("3:%d:0", time.Now().Add(365*24*time.Hour).UnixMilli())).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			regs, stores := fleetRegistriesOn(t, url, 2, consumer.Plan{Concurrent: 3}, 2*time.Second)
			key := stores[0].consumerLimits("alice", consumer.DefaultPlan).base + "concurrent"
			if err := tc.write(key); err != nil {
				t.Fatal(err)
			}
			admitted := 0
			for i := range 8 {
				if _, ref := regs[i%2].Admit(time.Now(), "alice", "fast", 1); ref == nil {
					admitted++
				}
			}
			if admitted != 3 {
				t.Errorf("expected exactly concurrent's 3 admitted, got %d", admitted)
			}
		})
	}
}
