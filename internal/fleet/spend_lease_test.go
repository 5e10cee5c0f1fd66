package fleet

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// commandCount counts the commands a go-redis client sends (a pipeline's
// each), as Redis' INFO commandstats would.
type commandCount struct{ n atomic.Int64 }

func (c *commandCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *commandCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(int64(len(cmds))); return next(ctx, cmds) }
}

// spendCommands counts the spend commands of in's store from now on.
func spendCommands(in *instance) *commandCount {
	c := &commandCount{}
	in.store.client.AddHook(c)
	return c
}

// Two instances sharing a budget of $1 per hour, 400 attempts between them
// that each hold $0.001 and spend $0.0008: a budget is leased by slices
// and held locally, so the attempts cost at most 0.1 Redis commands each
// (they cost 1 or 2 each, a hold and a settle, per attempt in Redis).
func TestFleetBudgetLeasedNotPerAttempt(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		limit := capacity.SpendLimit{USD: 1, Period: time.Hour}
		spend := []*capacity.Spending{capacity.NewSpending(limit, a.store, "budget:group|lease"), capacity.NewSpending(limit, b.store, "budget:group|lease")}
		ca, cb := spendCommands(a), spendCommands(b)
		now := time.Now()
		for i := range 400 {
			now = now.Add(5 * time.Millisecond) // 200 attempts per second
			s := spend[i%2]
			h, ok, _ := s.Hold(now, 0.001)
			if !ok {
				t.Fatalf("attempt %d: expected its hold to fit a budget of $1", i)
			}
			s.Settle(now, h, 0.0008)
		}
		n := ca.n.Load() + cb.n.Load()
		t.Logf("%d Redis commands for 400 attempts (%.3f each)", n, float64(n)/400)
		if float64(n)/400 > 0.1 {
			t.Errorf("expected at most 0.1 Redis commands per attempt, got %d for 400 (%.2f each)", n, float64(n)/400)
		}
	})
}

// Two instances holding and spending $0.001 each turn from a budget of
// $0.05 until both are refused until the budget renews: the fleet spends
// the whole budget (what one instance leased and does not spend goes
// back; a refusal while the other's slice holds it is one to try again
// shortly, which the test does) and never more.
func TestFleetBudgetLeasesNeverOverspend(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		limit := capacity.SpendLimit{USD: 0.05, Period: time.Hour}
		spend := []*capacity.Spending{capacity.NewSpending(limit, a.store, "budget:group|drain"), capacity.NewSpending(limit, b.store, "budget:group|drain")}
		now := time.Now()
		spent, refused := 0.0, 0
		end := time.Unix(0, (now.UnixNano()/int64(time.Hour)+1)*int64(time.Hour))
		for i := 0; refused < 2 && i < 1000; i++ {
			now = now.Add(10 * time.Millisecond)
			s := spend[i%2]
			h, ok, until := s.Hold(now, 0.001)
			if !ok && until.Before(end) {
				// The other instance's slice holds it: it is spent (the other
				// instance's turns) or comes back soon.
				now = until
				continue
			}
			if !ok {
				refused++
				continue
			}
			refused = 0
			s.Settle(now, h, 0.001)
			spent += 0.001
		}
		if spent > 0.05+1e-9 || spent < 0.05-0.001-1e-9 {
			t.Errorf("expected the fleet to spend the whole $0.05 budget (within one attempt) and never more, spent $%.4f", spent)
		}
	})
}

// One instance holds half of a budget of $0.01 ($0.005) and its slice
// runs low, which renews it in the background; the renewal leaves room for
// an attempt as large on another instance, whose $0.005 then fits (the
// renewal took half of what was left, $0.0025, and the other instance's
// hold was refused with $0.0025 of the budget unspent).
func TestFleetBudgetRenewalLeavesAnAttempt(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		limit := capacity.SpendLimit{USD: 0.01, Period: time.Hour}
		sa := capacity.NewSpending(limit, a.store, "budget:group|renew")
		sb := capacity.NewSpending(limit, b.store, "budget:group|renew")
		now := time.Now()
		ha, ok, _ := sa.Hold(now, 0.005)
		if !ok {
			t.Fatal("expected the first hold to fit")
		}
		time.Sleep(200 * time.Millisecond) // the renewal lands
		hb, ok, _ := sb.Hold(now, 0.005)
		if !ok {
			t.Fatal("expected the other instance's hold of $0.005 to fit the $0.005 left")
		}
		sa.Settle(now, ha, 0.005)
		sb.Settle(now, hb, 0.005)
		if over, _ := sb.Over(now.Add(2 * time.Second)); !over {
			t.Error("expected the budget spent once both settled")
		}
	})
}
