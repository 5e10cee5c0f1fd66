package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// crash stops b's store as a process that dies would: its background
// work ends and its connections close, with nothing given back (Close's
// give-backs then fail).
func crash(b *binding) {
	s := b.s
	s.cancel()
	s.mu.Lock()
	ps := s.ps
	s.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	_ = s.client.Close()
	s.wg.Wait()
}

// spendAll spends b's attempts of bu until one is refused, and returns
// how many were served and the refusal's wait.
func spendAll(t *testing.T, b *binding, bu capacity.Budget) (int, time.Duration) {
	t.Helper()
	for served := 0; served < 1000; served++ {
		wait, _, err := b.Spend(bu)
		if err != nil {
			t.Fatal(err)
		}
		if wait != 0 {
			return served, wait
		}
	}
	t.Fatal("expected a refusal within 1000 attempts")
	return 0, 0
}

// leaseDead leases instance a a slice of 100 of a window of 400 (its
// demand: 500 attempts at once), spends 1, and lets its demand fall to 6
// a second: its lease loop gives back what exceeds 6 s of it and states
// the rest, 3 s of which it may spend before it states it again (its
// allowance; the rest parked). It returns what a holds.
func leaseDead(t *testing.T, a *binding, bu capacity.Budget) int64 {
	t.Helper()
	now := time.Now()
	for range 500 {
		a.lease.want(now, needs(bu), bu)
	}
	if wait, _, err := a.Spend(bu); err != nil || wait != 0 {
		t.Fatalf("a's attempt: expected it served, got wait %v (%v)", wait, err)
	}
	a.lease.mu.Lock()
	a.lease.w[0].demand = demand{}
	a.lease.w[0].demand.Add(time.Now(), 6)
	a.lease.mu.Unlock()
	eventually(t, 5*time.Second, "a's surplus given back", func() bool { return a.lease.all(time.Now())[0] <= 40 })
	// and the call that gave it back landed: a's statement in the budget
	// hash parks part of what it holds (a crash before it lands leaves the
	// earlier statement, whose allowance covered the whole slice).
	eventually(t, 5*time.Second, "a's statement of its slice parked", func() bool {
		v, err := a.s.client.HGet(context.Background(), a.budgetKey, "h:"+a.s.origin).Result()
		f := strings.Split(v, ":") // "<r>:<t>:<until>:<r parked>:<t parked>:<r reset>:<t reset>"
		if err != nil || len(f) != 7 {
			return false
		}
		held, _ := strconv.ParseInt(f[0], 10, 64)
		parked, _ := strconv.ParseInt(f[3], 10, 64)
		return held <= 40 && parked > 0
	})
	return a.lease.all(time.Now())[0]
}

// An instance that dies holding a slice (a crash: no Close) takes with it
// only what it may have spent of it: once its statement expires
// (leaseEntryTTL on Redis' clock), the slice it parked goes back to the
// window, and the other instance spends it. Before, the dead instance's
// slice was lost to the fleet until the window ended (b served 0 more
// after the entry time). The fleet never spends more than the window: a's
// 1, b's before and after, at most 400, short by a's allowance alone.
func TestADeadInstancesSliceGoesBack(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		bs := patientBindings(t, url, 2)
		a, b := bs[0], bs[1]
		bu := capacity.Budget{Requests: statedWindow(400, time.Minute), Tokens: capacity.BudgetWindow{Limit: -1}}
		held := leaseDead(t, a, bu)
		crash(a)
		before, wait := spendAll(t, b, bu)
		if held <= 0 || wait > leaseSliceRetry {
			t.Fatalf("expected the dead instance to hold a slice (%d) that b waits for (told %v, served %d)", held, wait, before)
		}
		time.Sleep(leaseEntryTTL + 200*time.Millisecond)
		after, _ := spendAll(t, b, bu)
		t.Logf("a held %d when it died; b served %d before its entry expired, %d after", held, before, after)
		if after <= 0 || int64(after) > held {
			t.Errorf("expected b to spend what the dead instance parked of its %d once its entry expired, served %d", held, after)
		}
		if total := 1 + before + after; total > 400 {
			t.Errorf("expected the fleet to spend at most the window's 400, spent %d", total)
		}
	})
}

// An instance cut off from Redis (alive: its calls fail) spends its slice
// within its allowance, and nothing of it once its last call that stated
// it is leaseEntryTTL old (its attempts come every 450 ms: it had
// allowance left then): the other instance then spends what it parked,
// and the fleet never spends more than the window (at the provider: every
// served attempt counted). Before, the cut-off instance went on spending
// its slice (its last attempt 6.8 s after the cut) and the other never got
// any of it back.
func TestACutOffInstanceForfeitsItsSliceBeforeItGoesBack(t *testing.T) {
	r := &redisProc{path: needRedisServer(t), port: freePort(t, 0, 0), dir: t.TempDir()}
	r.start(t)
	t.Cleanup(r.kill)
	p := newCutProxy(t, fmt.Sprintf("127.0.0.1:%d", r.port))
	prefix := keyPrefix(t)
	var bs []*binding
	for _, url := range []string{"redis://" + p.l.Addr().String() + "/0", r.URL()} {
		s, err := New(Options{URL: url, KeyPrefix: prefix, PollInterval: time.Hour, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		s.Bind(testIdentity, capacity.NewState())
		eventually(t, 5*time.Second, "the store up", func() bool { s.pollNow <- struct{}{}; return s.Up() })
		bs = append(bs, s.bindings[DeploymentID(testIdentity)])
	}
	a, b := bs[0], bs[1]
	bu := capacity.Budget{Requests: statedWindow(400, time.Minute), Tokens: capacity.BudgetWindow{Limit: -1}}
	held := leaseDead(t, a, bu)
	p.setCut(true)
	cut := time.Now()
	before, _ := spendAll(t, b, bu)
	served, last := 0, time.Time{}
	// a's requests come slower than its allowance would last: its last
	// call's statement, not its allowance, ends its spending.
	for end := cut.Add(leaseEntryTTL + time.Second); time.Now().Before(end); time.Sleep(450 * time.Millisecond) {
		if wait, _, _ := a.Spend(bu); wait == 0 {
			served, last = served+1, time.Now()
		}
	}
	after := 0
	eventually(t, 3*time.Second, "b served what a parked", func() bool {
		n, _ := spendAll(t, b, bu)
		after += n
		return after > 0
	})
	t.Logf("a held %d when cut off, and spent %d after (the last %v after the cut); b served %d, then %d once a's entry expired",
		held, served, last.Sub(cut), before, after)
	if !last.IsZero() && last.Sub(cut) >= leaseEntryTTL {
		t.Errorf("expected the cut-off instance to spend nothing of its slice %v after its last call, spent at %v", leaseEntryTTL, last.Sub(cut))
	}
	if total := 1 + served + before + after; total > 400 {
		t.Errorf("expected the fleet to spend at most the window's 400, spent %d (a %d after the cut, b %d and %d)", total, served, before, after)
	}
}

// A dead instance's slice of a bucket goes back the same way: what it
// parked is added to the bucket's count once its statement expires, not
// only refilled at the bucket's rate (here 400 an hour: 0.7 in the 6 s
// the entry lasts). The fleet never spends more than the bucket holds.
func TestADeadInstancesBucketSliceGoesBack(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		bs := patientBindings(t, url, 2)
		a, b := bs[0], bs[1]
		bu := capacity.Budget{Requests: bucketWindow(400, 400.0/3600), Tokens: capacity.BudgetWindow{Limit: -1}}
		held := leaseDead(t, a, bu)
		crash(a)
		before, _ := spendAll(t, b, bu)
		time.Sleep(leaseEntryTTL + 200*time.Millisecond)
		after, _ := spendAll(t, b, bu)
		t.Logf("a held %d of the bucket when it died; b served %d before its entry expired, %d after", held, before, after)
		if held <= 2 || after < 2 || int64(after) > held+1 {
			t.Errorf("expected b to spend what the dead instance parked of its %d once its entry expired (at most 1 of it refilled), served %d", held, after)
		}
		if total := 1 + before + after; total > 401 {
			t.Errorf("expected the fleet to spend at most the bucket's 400 (and 1 refilled), spent %d", total)
		}
	})
}
