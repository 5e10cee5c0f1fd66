package fleet

import (
	"syscall"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// A Redis outage does not take a limited consumer down: while a real
// redis-server is paused (SIGSTOP) for 10 s, each of two instances under
// rpm 20 admits its share of the minute, 10 (the limit over the 2
// instances the fleet's census counts), the 2 it admitted with Redis up
// and the places it holds counted in it: about 10 each, never more than
// 20 together, and still admitting after 3 s (on fleet31's places-only
// rule: none past the grants' 3 s). Each admission on local counts counts
// in llm_router_store_fallbacks_total{op="consumer"}, none in
// {op="reserve"} (a deployment's declared window). When Redis answers
// again, what each admitted on its own is reported to the fleet's minute:
// 40 more requests in the same minute admit no more than the 20 leave.
func TestConsumerRPMSharedWhileRedisIsDown(t *testing.T) {
	rp := startRedis(t, freePort(t, 0, 0))
	const timeout = 200 * time.Millisecond
	obs := []*counter{newCounter(), newCounter()}
	regs, stores := fleetRegistriesObserved(t, rp.URL(), consumer.Plan{RPM: 20}, timeout, []Observer{obs[0], obs[1]})
	for _, s := range stores {
		eventually(t, 5*time.Second, "the census counts both instances", func() bool { return s.instances() == 2 })
	}
	each := make([]int, 2)
	admit := func(i int) bool {
		tk, ref := regs[i].Admit(time.Now(), "alice", "fast", 1)
		if ref != nil {
			return false
		}
		each[i]++
		tk.Done(time.Now(), 0)
		return true
	}
	for i := range regs {
		admit(i)
		admit(i)
	}
	if each[0] != 2 || each[1] != 2 {
		t.Fatalf("expected 2 admitted on each with Redis up, got %v", each)
	}
	if err := rp.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	late := 0
	for time.Since(stopped) < 10*time.Second {
		for i := range regs {
			if admit(i) && time.Since(stopped) > 3*time.Second {
				late++
			}
		}
		time.Sleep(800 * time.Millisecond)
	}
	if err := rp.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("admitted %v (Redis paused 10 s after 2 on each), %d of them after 3 s", each, late)
	for i, n := range each {
		if n < 8 || n > 12 {
			t.Errorf("instance %d: expected about its share of 10 admitted (8 to 12), got %d", i, n)
		}
	}
	if each[0]+each[1] > 20 {
		t.Errorf("expected at most the rpm's 20 admitted fleet-wide, got %d", each[0]+each[1])
	}
	if late == 0 {
		t.Errorf("expected admissions after 3 s of the outage, got none")
	}
	for i, c := range obs {
		if c.fallbacks["reserve"] != 0 || c.fallbacks["consumer"] == 0 {
			t.Errorf("instance %d: expected fallbacks counted as op consumer only, got %v", i, c.fallbacks)
		}
	}
	before := each[0] + each[1]
	for _, s := range stores {
		eventually(t, 5*time.Second, "the store up again", s.Up)
	}
	time.Sleep(500 * time.Millisecond) // the lease loop's report (every leaseTick)
	if testing.Verbose() {
		zs, _ := stores[0].client.ZRangeWithScores(t.Context(), stores[0].prefix+"{c:"+consumerID("alice", consumer.DefaultPlan)+"}:declared", 0, -1).Result()
		t.Logf("the fleet's minute: %v", zs)
	}
	for range 20 {
		for i := range regs {
			admit(i)
		}
	}
	after := each[0] + each[1] - before
	t.Logf("%d more admitted once Redis answers again", after)
	if before+after > 20 {
		t.Errorf("expected the fleet's minute to count the outage's %d admissions: %d more admitted (limit 20)", before, after)
	}
}

// While Redis is down (killed), each of two instances under concurrent 4
// admits its share, 2 in flight at once (the limit over the 2 instances
// the census counts), once the slices they held ended (6 s): not 0 (on
// fleet31's rule: no slice, no place), and not more than 4 together. When
// Redis is back, the places they have in flight are in the fleet's count:
// a third instance finds none free.
func TestConsumerConcurrentSharedWhileRedisIsDown(t *testing.T) {
	rp := startRedis(t, freePort(t, 0, 0))
	const timeout = 200 * time.Millisecond
	regs, stores := fleetRegistriesOn(t, rp.URL(), 2, consumer.Plan{Concurrent: 4}, timeout)
	for _, s := range stores {
		eventually(t, 5*time.Second, "the census counts both instances", func() bool { return s.instances() == 2 })
	}
	for _, r := range regs {
		tk, ref := r.Admit(time.Now(), "alice", "fast", 1)
		if ref != nil {
			t.Fatalf("refused with Redis up: %s", ref.Message)
		}
		tk.Done(time.Now(), 0)
	}
	rp.kill()
	time.Sleep(concurrentTTL + 500*time.Millisecond)
	var held []*consumer.Ticket
	each := make([]int, 2)
	for range 4 {
		for i, r := range regs {
			if tk, ref := r.Admit(time.Now(), "alice", "fast", 1); ref == nil {
				each[i]++
				held = append(held, tk)
			} else if ref.Limit != consumer.LimitConcurrent {
				t.Errorf("expected refusals beyond the share as concurrent, got %+v", ref)
			}
		}
	}
	t.Logf("in flight at once with Redis down: %v", each)
	if each[0] != 2 || each[1] != 2 {
		t.Errorf("expected each instance to admit its share, 2 in flight, got %v", each)
	}
	rp.start(t)
	for _, s := range stores {
		eventually(t, 10*time.Second, "the store up again", s.Up)
	}
	third, _ := fleetRegistriesOn(t, rp.URL(), 1, consumer.Plan{Concurrent: 4}, timeout)
	_ = third
	time.Sleep(concurrentRenew + 500*time.Millisecond) // the slices renewed with what is in flight
	for _, tk := range held {
		defer tk.Done(time.Now(), 0)
	}
	if tk, ref := third[0].Admit(time.Now(), "alice", "fast", 1); ref == nil {
		tk.Done(time.Now(), 0)
		t.Errorf("expected the fleet's count to hold the 4 in flight since the outage: a third instance admitted one")
	}
}
