package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

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
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	day := capacity.SpendLimit{USD: 10, Period: 24 * time.Hour}
	half := capacity.SpendLimit{USD: 10, Period: 12 * time.Hour}
	for _, kind := range []string{"consumer", "deployment"} {
		t.Run(kind, func(t *testing.T) {
			backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
				// budget returns in's spending of the one budget under l,
				// as a reload to l finds it.
				budget := func(in *instance, l capacity.SpendLimit, kept *capacity.Spending) *capacity.Spending {
					if kind == "consumer" {
						return in.store.Budget("alice", "team", l.USD, l.Period).(*consumerBudget).sp
					}
					if kept == nil {
						return capacity.NewSpending(l, in.store, "budget:group|paid")
					}
					kept.SetLimit(l)
					return kept
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
		})
	}
}
