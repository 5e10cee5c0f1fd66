package fleet

import (
	"context"
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
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

// An instance that stops gracefully (Close: a restart, a scale-down)
// gives back what its budgets' slices hold, so the fleet may spend them:
// on budget 1 USD per 24 hours, a request holding its worst case of 0.10
// on the first instance, answered at 0.05, leaves that instance a slice
// of the rest; once it stops, the second instance holds 0.95 (the whole
// budget but the spend). Before, the slice stayed counted as spent until
// the window ended (0.40 counted spent, 0.95 refused), its record
// expired or not.
// A deployment's budget (capacity.Spending on the store) alike.
func TestAStoppedInstanceGivesItsBudgetSlicesBack(t *testing.T) {
	url := realRedisURL(t)
	regs, stores := fleetRegistriesOn(t, url, 2, consumer.Plan{Name: "team", BudgetUSD: 1, BudgetPer: 24 * time.Hour}, 2*time.Second)
	tk, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.10)
	if ref != nil {
		t.Fatalf("expected a request admitted, got %s", ref.Message)
	}
	tk.Done(time.Now(), 0.05)

	dep := capacity.NewSpending(capacity.SpendLimit{USD: 1, Period: 24 * time.Hour}, stores[0], "budget:group|paid")
	h, ok, _ := dep.Hold(time.Now(), 0.10)
	if !ok {
		t.Fatal("deployment: $0.10 of $1 refused")
	}
	dep.Settle(time.Now(), h, 0.05)
	if s := stores[0].budgets["consumer:"+consumerID("alice", consumer.DefaultPlan)].sp.Slice(); s <= 0.05 {
		t.Fatalf("expected the first instance to hold a slice of the consumer's budget, got %g", s)
	}
	if dep.Slice() <= 0.05 {
		t.Fatalf("expected the first instance to hold a slice of the deployment's budget, got %g", dep.Slice())
	}
	stores[0].Close()
	for name, other := range map[string]*capacity.Spending{ // a hold of the worst case whole (a consumer's request would be admitted as the crossing)
		"consumer":   stores[1].Budget("alice", consumer.DefaultPlan, 1, 24*time.Hour).(*consumerBudget).sp,
		"deployment": capacity.NewSpending(capacity.SpendLimit{USD: 1, Period: 24 * time.Hour}, stores[1], "budget:group|paid"),
	} {
		if h, ok, _ := other.Hold(time.Now(), 0.95); !ok {
			t.Errorf("%s: expected $0.95 held on the other instance once the first stopped (%+v)", name, other.Report(time.Now()))
		} else {
			other.Settle(time.Now(), h, 0.95)
		}
	}
}

// A budget's total that is no finite number ("nan", "inf", "-inf", a
// hash), written by no router, is read as none: the fleet's instances
// hold no more than the budget between them (each held its own $1 on a
// "nan" before: $2 of $1), the report stays JSON (NaN failed it with
// 500), and Redis is not taken for down.
func TestANonFiniteBudgetTotalIsNone(t *testing.T) {
	url := realRedisURL(t)
	for _, bad := range []string{"nan", "inf", "-inf", "hash"} {
		t.Run(bad, func(t *testing.T) {
			regs, stores := fleetRegistriesOn(t, url, 2, consumer.Plan{Name: "team", BudgetUSD: 1, BudgetPer: 24 * time.Hour}, 2*time.Second)
			opt, _ := redis.ParseURL(url)
			c := redis.NewClient(opt)
			defer c.Close()
			ctx := context.Background()
			per := 24 * time.Hour
			key := stores[0].spendKey("consumer:" + consumerID("alice", consumer.DefaultPlan) + ":" + per.String() + ":" + strconv.FormatInt(time.Now().UnixNano()/int64(per), 10))
			var err error
			if bad == "hash" {
				err = c.HSet(ctx, key, "x", "1").Err()
			} else {
				err = c.Set(ctx, key, bad, 0).Err()
			}
			if err != nil {
				t.Fatal(err)
			}
			held := 0.0
			for i := range 40 {
				sp := stores[i%2].Budget("alice", consumer.DefaultPlan, 1, per).(*consumerBudget).sp
				if h, ok, _ := sp.Hold(time.Now(), 0.05); ok {
					sp.Settle(time.Now(), h, 0.05)
					held += 0.05
				}
			}
			if held > 1+1e-9 || held < 0.9 {
				t.Errorf("expected the fleet to hold about $1 of $1 between its instances, held $%.2f", held)
			}
			for i, r := range regs {
				rep := r.Report(time.Now())
				if _, err := json.Marshal(rep); err != nil {
					t.Errorf("instance %d: the report is no JSON: %v", i, err)
				}
			}
			for i, s := range stores {
				if !s.Up() {
					t.Errorf("instance %d: Redis taken for down", i)
				}
			}
		})
	}
}

// A slice given back leaves no record of it behind: the report, the
// budget's total less the records of the slices unspent, counts what was
// spent at once after a give-back (it showed 0.40 less, and 0, for a
// second or two, until the instance leased again: helper-61's F3).
func TestTheReportCountsASliceGivenBack(t *testing.T) {
	regs, stores := fleetRegistriesOn(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 1, BudgetPer: 24 * time.Hour}, 2*time.Second)
	tk, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.10)
	if ref != nil {
		t.Fatalf("expected a request admitted, got %s", ref.Message)
	}
	time.Sleep(50 * time.Millisecond) // its renewal lands
	tk.Done(time.Now(), 0.05)
	sp := stores[0].Budget("alice", consumer.DefaultPlan, 1, 24*time.Hour).(*consumerBudget).sp
	if sp.Slice() <= 0 {
		t.Fatal("expected a slice left to give back")
	}
	sp.GiveBack(time.Now())
	for i, r := range regs {
		if rep := r.Report(time.Now()); len(rep) == 0 && i == 1 {
			continue // the second instance tracks no one
		} else if len(rep) != 1 || !rep[0].FleetWide || math.Abs(rep[0].SpentUSD-0.05) > 1e-6 {
			t.Errorf("instance %d: expected 0.05 spent fleet-wide at once after the give-back, got %+v", i, rep)
		}
	}
}

// Right after a reload that changes the budget's period, before the
// consumer's next request, the report counts the old period's spend
// carried into the new window (it showed 0 until a request carried it).
func TestTheReportCarriesAPeriodChange(t *testing.T) {
	regs, stores := fleetRegistriesOn(t, realRedisURL(t), 1, consumer.Plan{Name: "team", BudgetUSD: 1, BudgetPer: 24 * time.Hour}, 2*time.Second)
	tk, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.30)
	if ref != nil {
		t.Fatalf("expected a request admitted, got %s", ref.Message)
	}
	tk.Done(time.Now(), 0.30)
	stores[0].Budget("alice", consumer.DefaultPlan, 1, 12*time.Hour) // the reload's new period
	p, err := consumer.New([]consumer.Plan{{Name: consumer.DefaultPlan, BudgetUSD: 1, BudgetPer: 12 * time.Hour}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.ShareCounts(regs[0].Counts())
	p.SetFleet(stores[0])
	if rep := p.Report(time.Now()); len(rep) != 1 || !rep[0].FleetWide || rep[0].SpentUSD < 0.30-1e-6 {
		t.Errorf("expected the 0.30 spent per 24h counted per 12h at once, got %+v", rep)
	}
}
