package fleet

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// The instant and the budgets of the period tests: $10 per 24h, then per
// 12h, at 10:00 UTC.
var (
	periodAt   = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	periodDay  = capacity.SpendLimit{USD: 10, Period: 24 * time.Hour}
	periodHalf = capacity.SpendLimit{USD: 10, Period: 12 * time.Hour}
)

// periodKinds runs f for a consumer's budget and a deployment's (kind
// "consumer", "deployment"), on each backend.
func periodKinds(t *testing.T, f func(t *testing.T, kind, url string)) {
	for _, kind := range []string{"consumer", "deployment"} {
		t.Run(kind, func(t *testing.T) {
			backends(t, func(t *testing.T, url string, _ *miniredis.Miniredis) { f(t, kind, url) })
		})
	}
}

// twoPerDay starts two instances on url, each with kind's budget per
// 24h (periodBudget).
func twoPerDay(t *testing.T, kind, url string) (a, b *instance, sa, sb *capacity.Spending) {
	t.Helper()
	a, b = newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
	eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
	return a, b, periodBudget(kind, a, periodDay, nil), periodBudget(kind, b, periodDay, nil)
}

// periodBudget returns in's spending of the one budget of a period test
// under l (kind "consumer": a consumer's, Store.Budget, whose keys name
// the period; else a deployment's, under budget:<scope>), as a reload to
// l finds it (kept: the deployment's Spending before it; nil: a new one).
func periodBudget(kind string, in *instance, l capacity.SpendLimit, kept *capacity.Spending) *capacity.Spending {
	if kind == "consumer" {
		return in.store.Budget("alice", "team", l.USD, l.Period).(*consumerBudget).sp
	}
	if kept == nil {
		return capacity.NewSpending(l, in.store, "budget:group|paid")
	}
	kept.SetLimit(l)
	return kept
}

// A reload that changes a budget's period, 24h to 12h at 10:00 UTC, does
// not forgive what the fleet spent: $8.5 of $10 spent on instance a
// before its reload still counts after it ($2 refused), $1 spent by b
// while it had not reloaded yet counts once b reloads ($0.6 refused on b,
// and then on c, started with the new config: $9.5 spent), and the $0.5
// of a's slice it did not spend comes back (the last $0.5 held on a, none
// more); the new period's window renews at 12:00. A consumer's budget (Store.Budget: its keys name the period) and
// a deployment's (capacity.Spending under budget:<scope>) alike; the
// stored keys all expire.
func TestAFleetBudgetPeriodChangeKeepsTheSpend(t *testing.T) {
	at, day, half := periodAt, periodDay, periodHalf
	periodKinds(t, func(t *testing.T, kind, url string) {
		budget := func(in *instance, l capacity.SpendLimit, kept *capacity.Spending) *capacity.Spending {
			return periodBudget(kind, in, l, kept)
		}
		a, b, c := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() && c.store.Up() })
		sa, sb := budget(a, day, nil), budget(b, day, nil)
		h, ok, _ := sa.Hold(at, 9)
		if !ok {
			t.Fatal("a: $9 of $10: refused")
		}
		sa.Settle(at, h, 8.5) // $0.5 of a's slice unspent
		if _, ok, _ := sb.Hold(at.Add(30*time.Second), 2); ok {
			t.Fatal("b: $2 with $9 of $10 spent or held by a: held")
		}

		sa = budget(a, half, sa) // a reloads: per 12h
		if h, ok, _ := sa.Hold(at.Add(time.Minute), 2); ok {
			sa.Settle(at.Add(time.Minute), h, 0)
			t.Fatal("a after its reload: $2 held with $8.5 of $10 spent: the period change forgave the spend")
		}
		h, ok, _ = sb.Hold(at.Add(2*time.Minute), 1) // b not reloaded yet
		if !ok {
			t.Fatal("b before its reload: the $1 left of the old window: refused")
		}
		sb.Settle(at.Add(2*time.Minute), h, 1)

		sb = budget(b, half, sb) // b reloads
		sc := budget(c, half, nil)
		// b carries what it spent at its first look after its
		// reload, before c asks.
		for _, x := range []struct {
			name string
			s    *capacity.Spending
		}{{"b after its reload", sb}, {"c, started with per 12h", sc}} {
			name, s := x.name, x.s
			if h, ok, until := s.Hold(at.Add(3*time.Minute), 0.6); ok {
				s.Settle(at.Add(3*time.Minute), h, 0)
				t.Errorf("%s: $0.6 held with $9.5 of $10 spent", name)
			} else if want := at.Add(2 * time.Hour); !until.Equal(want) && !until.Before(at.Add(4*time.Minute)) {
				t.Errorf("%s: refused until %v, expected the new period's renewal at %v (or a retry shortly)", name, until, want)
			}
		}
		if r := sc.Report(at.Add(3 * time.Minute)); r == nil || r.SpentUSD < 9.5-1e-6 || r.SpentUSD > 9.5+1e-6 {
			t.Errorf("c: expected $9.5 spent in the new period's window, got %+v", r)
		}
		// What a leased of the old window and did not spend came
		// back: the last $0.5 is there.
		var last *capacity.Hold
		for try := 0; try < 5 && last == nil; try++ { // b's slice may still be on its way back
			if h, ok, _ := sa.Hold(at.Add(4*time.Minute+time.Duration(try)*2*time.Second), 0.5); ok {
				last = h
			}
		}
		if last == nil {
			t.Error("a: the last $0.5 of the budget refused: a's slice of the old window, unspent, counted as spent")
		} else {
			if h, ok, _ := sb.Hold(at.Add(5*time.Minute), 0.01); ok {
				sb.Settle(at.Add(5*time.Minute), h, 0)
				t.Error("b: $0.01 held past the budget")
			}
			sa.Settle(at.Add(5*time.Minute), last, 0.5)
		}
		if h, ok, _ := sc.Hold(at.Add(2*time.Hour), 5); !ok {
			t.Error("c: the new period's next window (12:00): $5 refused")
		} else {
			sc.Settle(at.Add(2*time.Hour), h, 5)
		}

		// Every key of the budgets expires.
		opt, _ := redis.ParseURL(url)
		cl := redis.NewClient(opt)
		defer cl.Close()
		ctx := context.Background()
		keys, err := cl.Keys(ctx, keyPrefix(t)+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, k := range keys {
			if !strings.Contains(k, "spend:") {
				continue
			}
			ttl, err := cl.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl <= 0 || ttl > 24*time.Hour+time.Minute {
				t.Errorf("key %s: TTL %v, expected one of at most a period and a minute", k, ttl)
			}
			n++
		}
		if n == 0 {
			t.Error("no keys stored")
		}
	})
}

// A restart that changes a budget's period, 24h to 12h at 10:00 UTC (a
// rolling restart: instances stop and start with the new config, none
// reloads), forgives nothing either: $8.5 of $10 spent on instance a
// before it stopped counts on a2, started in its place with per 12h ($2
// refused, $1.5 held); $0.5 that b, still on per 24h, spends after a2
// started counts on c, started after it ($0.01 refused past the budget);
// and a restart with the same period carries nothing twice. A
// consumer's budget and a deployment's alike. Before, a2 started an
// empty window: $2 held with $8.5 spent.
func TestARestartWithANewPeriodKeepsTheSpend(t *testing.T) {
	at, day, half := periodAt, periodDay, periodHalf
	periodKinds(t, func(t *testing.T, kind, url string) {
		budget := func(in *instance, l capacity.SpendLimit) *capacity.Spending { return periodBudget(kind, in, l, nil) }
		spend := func(name string, s *capacity.Spending, now time.Time, usd float64) {
			t.Helper()
			h, ok, _ := s.Hold(now, usd)
			if !ok {
				t.Fatalf("%s: $%g refused", name, usd)
			}
			s.Settle(now, h, usd)
		}
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		sa, sb := budget(a, day), budget(b, day)
		spend("a", sa, at, 8.5)
		sb.Report(at)   // b's budget in use before a restarts
		a.store.Close() // a stops: its slice's unspent part stays counted until its record expires
		a2 := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "a2's store up", a2.store.Up)
		sa2 := budget(a2, half)
		if h, ok, _ := sa2.Hold(at.Add(time.Minute), 2); ok {
			sa2.Settle(at.Add(time.Minute), h, 0)
			t.Fatalf("a2, restarted with per 12h: $2 held with $8.5 of $10 spent: the restart forgave the spend (%+v)", sa2.Report(at.Add(time.Minute)))
		}
		if r := sa2.Report(at.Add(time.Minute)); r == nil || r.SpentUSD < 8.5-1e-6 {
			t.Errorf("a2: expected at least $8.5 counted in the new period's window, got %+v", r)
		}
		spend("b, still per 24h", sb, at.Add(2*time.Minute), 0.5)
		sb.GiveBack(at.Add(2 * time.Minute)) // b's slice of the old window goes back (as it would once idle)
		c := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "c's store up", c.store.Up)
		sc := budget(c, half)
		if h, ok, _ := sc.Hold(at.Add(3*time.Minute), 1.01); ok {
			sc.Settle(at.Add(3*time.Minute), h, 0)
			t.Errorf("c, started after b spent: $1.01 held with $9 of $10 spent (%+v)", sc.Report(at.Add(3*time.Minute)))
		}
		r := sc.Report(at.Add(3 * time.Minute))
		if r == nil || r.SpentUSD < 9-1e-6 || r.SpentUSD > 9.5+1e-6 {
			t.Errorf("c: expected $9 counted in the new period's window (a's, b's; a's unspent slice at most $0.5 more), got %+v", r)
		}
		d := newInstance(t, url, time.Hour, 0, 0) // a restart with the same period
		eventually(t, 5*time.Second, "d's store up", d.store.Up)
		sd := budget(d, half)
		sd.Report(at.Add(4 * time.Minute))
		if h, ok, _ := sd.Hold(at.Add(4*time.Minute), 0.01); !ok {
			t.Errorf("d: $0.01 refused: a carry counted twice (%+v)", sd.Report(at.Add(4*time.Minute)))
		} else {
			sd.Settle(at.Add(4*time.Minute), h, 0)
		}
		if r2 := sd.Report(at.Add(4 * time.Minute)); r2 == nil || r == nil || r2.SpentUSD > r.SpentUSD+1e-6 {
			t.Errorf("d: expected no more than c counted (%+v), got %+v", r, r2)
		}
	})
}

// A reload there and back within both windows (24h, 12h, 24h) counts
// each spend once: $3 spent per 24h, $2 per 12h, then per 24h again:
// $5 spent, not $8 (the 12h window's total, which holds the $3 carried
// into it, carried back whole).
func TestAPeriodChangedThereAndBackCountsOnce(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	day := capacity.SpendLimit{USD: 10, Period: 24 * time.Hour}
	half := capacity.SpendLimit{USD: 10, Period: 12 * time.Hour}
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the store up", a.store.Up)
		s := a.store.Budget("alice", "team", day.USD, day.Period).(*consumerBudget).sp
		for _, step := range []struct {
			l   capacity.SpendLimit
			usd float64
			at  time.Time
		}{{day, 3, at}, {half, 2, at.Add(time.Minute)}, {day, 0, at.Add(2 * time.Minute)}} {
			s.SetLimit(step.l)
			h, ok, _ := s.Hold(step.at, max(step.usd, 0.01))
			if !ok {
				t.Fatalf("per %v: $%g refused (%+v)", step.l.Period, step.usd, s.Report(step.at))
			}
			s.Settle(step.at, h, step.usd)
			s.GiveBack(step.at) // the slice goes back: the total is what was spent
		}
		var r *capacity.SpendingReport
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			s.GiveBack(at.Add(3 * time.Minute)) // a slice renewed in the background meanwhile goes back too
			if r = s.Report(at.Add(3 * time.Minute)); r != nil && r.SpentUSD > 5-1e-6 && r.SpentUSD < 5+1e-6 {
				return
			}
		}
		t.Errorf("expected $5 counted, got %+v", r)
	})
}

// Values the router did not write in the keys a period's carry reads (the
// budget's periods of another type, then with entries of every wrong
// shape or a far expiry; the old window's total and writes of another
// type) neither fail a hold nor count as spend, and the periods' key
// expires.
func TestHostilePeriodValues(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the store up", a.store.Up)
		opt, _ := redis.ParseURL(url)
		c := redis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		base := "budget:group|paid"
		periods := a.store.spendKey(base + ":periods")
		old := a.store.spendKey(base + ":" + strconv.FormatInt(at.UnixNano()/int64(24*time.Hour), 10))
		far := strconv.FormatInt(time.Now().Add(5*365*24*time.Hour).UnixMilli(), 10)
		soon := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
		for _, err := range []error{
			c.Set(ctx, periods, "not a hash", 0).Err(),
			c.Set(ctx, old, "not a number", 0).Err(),
			c.Set(ctx, spentKey(old), "not a hash", 0).Err(),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		for round, l := range []capacity.SpendLimit{{USD: 10, Period: 12 * time.Hour}, {USD: 10, Period: 6 * time.Hour}} {
			if round == 1 { // then a hash of entries of every wrong shape
				if err := c.Del(ctx, periods).Err(); err != nil {
					t.Fatal(err)
				}
				if err := c.HSet(ctx, periods, "24h0m0s", "junk", "-5s", soon, "9999999h", soon, "1h0m0s", far, "x;y", soon, "24h0m0s", soon).Err(); err != nil {
					t.Fatal(err)
				}
			}
			s := capacity.NewSpending(l, a.store, base)
			h, ok, _ := s.Hold(at.Add(time.Minute), 1)
			if !ok {
				t.Fatalf("round %d: $1 of $10 refused past hostile values (%+v)", round, s.Report(at.Add(time.Minute)))
			}
			s.Settle(at.Add(time.Minute), h, 1)
			if r := s.Report(at.Add(time.Minute)); r == nil || r.SpentUSD > 1+1e-6 {
				t.Errorf("round %d: expected $1 spent (no hostile value counted), got %+v", round, r)
			}
			key := a.store.spendKey(base + ":" + strconv.FormatInt(at.UnixNano()/int64(l.Period), 10))
			eventually(t, 3*time.Second, "the spend written to the fleet", func() bool {
				s.GiveBack(at.Add(time.Minute))
				v, _ := c.Get(ctx, key).Float64()
				return v > 1-1e-6 && v < 1+1e-6
			})
		}
		if n := a.obs.count(a.obs.fallbacks); n != 0 {
			t.Errorf("expected no fallback to local state for hostile values, got %d", n)
		}
		if ttl := c.PTTL(ctx, periods).Val(); ttl <= 0 || ttl > 25*time.Hour {
			t.Errorf("expected the periods' key to expire within a period and a minute, PTTL %v", ttl)
		}
		for _, f := range []string{"-5s", "1h0m0s", "x;y"} { // "9999999h" is of the shape, and not carried (longer than any budget period)
			if c.HExists(ctx, periods, f).Val() {
				t.Errorf("expected the hostile entry %s dropped", f)
			}
		}
	})
}

// A window carried back into the one it was carried from counts what it
// spent less the slices of there it was given back at the reload, which
// may be less than 0: per 24h $3 spent with a slice of $3 unspent (the
// total $6), per 12h the $6 carried, the slice given back ($3) and $2
// spent ($5), per 24h again: $5, not $6 (the slice counted once as spent
// in the 24h window and once given back in the 12h one); and per 12h
// again: $5. Store.CarrySpend
// on its own, as the race of a renewal with the reload left it (1 run in
// 20 of TestAPeriodChangedThereAndBackCountsOnce under load).
func TestACarryBackTakesBackTheSlicesGivenThere(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the store up", a.store.Up)
		ctx := context.Background()
		day, half := "budget:x:24h", "budget:x:12h"
		op := func(seq int64) capacity.SpendOp { return capacity.SpendOp{Writer: "w", Seq: seq} }
		if _, err := a.store.AddSpend(ctx, day, 6, op(1), time.Hour); err != nil {
			t.Fatal(err)
		}
		if total, err := a.store.CarrySpend(ctx, day, half, time.Hour); err != nil || total != 6 {
			t.Fatalf("the carry into 12h: %v, %v", total, err)
		}
		for i, usd := range []float64{-3, 2} {
			if _, err := a.store.AddSpend(ctx, half, usd, op(int64(2+i)), time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		total, err := a.store.CarrySpend(ctx, half, day, time.Hour)
		if err != nil || total < 5-1e-9 || total > 5+1e-9 {
			t.Errorf("the carry back into 24h: expected $5, got %v, %v", total, err)
		}
		if again, err := a.store.CarrySpend(ctx, half, day, time.Hour); err != nil || again != total {
			t.Errorf("a second carry back: expected it to add nothing (%v), got %v, %v", total, again, err)
		}
		// And forth again (a third change, per 12h): the 12h window holds
		// the $5 already; what 24h holds carried from it (-$1) is not
		// carried back (it took $4 before, the -$1 left out).
		if forth, err := a.store.CarrySpend(ctx, day, half, time.Hour); err != nil || forth < 5-1e-9 || forth > 5+1e-9 {
			t.Errorf("the carry forth again into 12h: expected $5, got %v, %v", forth, err)
		}
	})
}

// A rolling restart to a new period counts what was spent, not the
// slices the instances held when the first of them restarted: a carried
// $3 and b's $0.5 per 24h, and b's unspent slice as spent (b was still
// running), until b stopped (its slice back in the 24h window) and
// started per 12h: its carry, a later read of the 24h window, takes the
// slice back. Before, the 12h window kept it as spent (helper-61's F2:
// $0.898 counted of $0.558 billed).
func TestARollingRestartCountsNoSliceAsSpent(t *testing.T) {
	at, half := periodAt, periodHalf
	periodKinds(t, func(t *testing.T, kind, url string) {
		a, b, sa, sb := twoPerDay(t, kind, url)
		for _, x := range []struct {
			s          *capacity.Spending
			hold, cost float64
		}{{sa, 3, 3}, {sb, 1, 0.5}} {
			h, ok, _ := x.s.Hold(at, x.hold)
			if !ok {
				t.Fatalf("$%g of $10 refused", x.hold)
			}
			x.s.Settle(at, h, x.cost)
		}
		if sb.Slice() <= 0 {
			t.Fatal("expected b to hold a slice of the 24h window")
		}
		a.store.Close() // a restarts per 12h; b still runs per 24h, holding its slice
		a2 := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "a2's store up", a2.store.Up)
		sa2 := periodBudget(kind, a2, half, nil)
		sa2.Sync(at.Add(time.Minute))
		b.store.Close() // then b: its slice goes back to the 24h window
		b2 := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "b2's store up", b2.store.Up)
		sb2 := periodBudget(kind, b2, half, nil)
		sb2.Sync(at.Add(2 * time.Minute))
		var r *capacity.SpendingReport
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			sb2.Sync(at.Add(2 * time.Minute))
			if r = sb2.Report(at.Add(2 * time.Minute)); r != nil && r.SpentUSD > 3.5-1e-6 && r.SpentUSD < 3.5+1e-6 {
				return
			}
		}
		t.Errorf("expected $3.5 counted per 12h once every instance restarted, got %+v", r)
	})
}

// While the instances run different periods of one budget (a rolling
// restart to per 12h: a restarted, b still per 24h), each window counts
// what the other spends within about a second (a, which sees both
// periods recorded, carries each window into the other), so the fleet
// holds the budget and what is spent from slices between two carries:
// requests of $0.05 alternating between a and b, 10 ms apart (the
// demand of 2.5 USD a second on a $10 budget: slices of a few dollars),
// with $3 spent before, spent $11-12 of $10. Before, each window
// enforced the budget on its own: $14.30 (helper-62: $1.368 admitted
// on $1).
func TestMixedPeriodsHoldTheBudgetTogether(t *testing.T) {
	at, half := periodAt, periodHalf
	periodKinds(t, func(t *testing.T, kind, url string) {
		a, _, sa, sb := twoPerDay(t, kind, url)
		for _, s := range []*capacity.Spending{sa, sb} {
			h, ok, _ := s.Hold(at, 1.5)
			if !ok {
				t.Fatal("$1.5 of $10 refused")
			}
			s.Settle(at, h, 1.5)
		}
		a.store.Close()
		a2 := newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "a2's store up", a2.store.Up)
		sa2 := periodBudget(kind, a2, half, nil)
		spent := 3.0
		for i := 0; i < 400 && spent < 20; i++ {
			s := []*capacity.Spending{sa2, sb}[i%2]
			now := at.Add(time.Minute + time.Duration(i)*100*time.Millisecond)
			if h, ok, _ := s.Hold(now, 0.05); ok {
				s.Settle(now, h, 0.05)
				spent += 0.05
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%s: $%.2f spent of $10 while a ran per 12h and b per 24h", kind, spent)
		if spent > 12.5+1e-9 {
			t.Errorf("expected the two windows to hold about $10 between them (and slices spent between carries), spent $%.2f", spent)
		}
	})
}
