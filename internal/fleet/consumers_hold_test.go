package fleet

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/consumer"
)

// A consumer's budget holds each request's worst case fleet-wide, no more
// than the budget has left, as one instance's does: on budget 1 USD per
// hour over two instances, a request whose worst case (1.5 USD) is more
// than the whole budget is admitted (it holds the whole 1 USD; served
// whole), the next one, on the other instance, is refused 429 budget
// while it is in flight (admitted before: the fleet held a millionth of
// a USD), and once the first is answered at 0.01 USD the budget admits
// again (from the first instance's slice, which holds what the answer
// did not spend until it goes back idle).
func TestConsumerBudgetHoldsTheWorstCaseAcrossTheFleet(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 1, BudgetPer: time.Hour})
	first, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 1.5)
	if ref != nil {
		t.Fatalf("expected the first request admitted into an unspent budget, got %s", ref.Message)
	}
	if _, ref := regs[1].AdmitHolding(time.Now(), "alice", "fast", 10, 1.5); ref == nil || ref.Limit != consumer.LimitBudget {
		t.Errorf("expected the second refused for the budget while the first holds it, got %+v", ref)
	}
	first.Done(time.Now(), 0.01)
	if tk, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.5); ref != nil {
		t.Errorf("expected the budget to admit again once the first settled, got %s", ref.Message)
	} else {
		tk.Done(time.Now(), 0.01)
	}
}

// holdTheBudget admits alice's two requests on a budget of 0.20 USD over
// two instances: the first holding its worst case of 0.17 on the first
// instance, the second its worst case (0.03 or more) on the second,
// which holds the 0.03 left.
func holdTheBudget(t *testing.T, regs []*consumer.Registry, second float64) (*consumer.Ticket, *consumer.Ticket) {
	t.Helper()
	a, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.17)
	if ref != nil {
		t.Fatalf("expected the first request admitted into an unspent budget, got %s", ref.Message)
	}
	b, ref := regs[1].AdmitHolding(time.Now(), "alice", "fast", 10, second)
	if ref != nil {
		t.Fatalf("expected the second request admitted (it holds the 0.03 left), got %s", ref.Message)
	}
	return a, b
}

// A refusal for holds in flight tells the wait for holds, not for the
// window: on budget 0.20 USD per 24 hours over two instances, a request
// holding its worst case of 0.17 USD in flight on one instance leaves
// 0.03, which the next request (worst case 0.05, on the other instance)
// holds; a third is refused on either instance (the budget is not spent:
// the holds settle at their answers' cost), with a
// Retry-After of seconds (the refusal once said the window's end, up to
// 24 hours) and a message that names the holds. Once the fleet has spent
// the budget the refusal is until the window renews (for a request
// larger than what the instances' slices last recorded; a smaller one
// once they record anew: TestASpentBudgetIsToldItsWindowSoon).
func TestAConsumerRefusedForHoldsIsToldTheirWait(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 0.20, BudgetPer: 24 * time.Hour})
	first, second := holdTheBudget(t, regs, 0.05)
	for i, r := range regs {
		_, ref := r.AdmitHolding(time.Now(), "alice", "fast", 10, 0.05)
		if ref == nil || ref.Limit != consumer.LimitBudget {
			t.Fatalf("instance %d: expected a refusal for the budget while all of it is held, got %+v", i, ref)
		}
		t.Logf("instance %d: Retry-After %v: %s", i, ref.RetryAfter, ref.Message)
		if ref.RetryAfter <= 0 || ref.RetryAfter > 5*time.Second || !strings.Contains(ref.Message, "come back") {
			t.Errorf("instance %d: expected a Retry-After of seconds for holds in flight, and a message naming them; got %v: %s", i, ref.RetryAfter, ref.Message)
		}
	}
	first.Done(time.Now(), 0.17) // their answers cost their holds: the whole budget
	second.Done(time.Now(), 0.03)
	for i, r := range regs {
		_, ref := r.AdmitHolding(time.Now(), "alice", "fast", 10, 0.05)
		if ref == nil || ref.Limit != consumer.LimitBudget {
			t.Fatalf("instance %d: expected a refusal for a spent budget, got %+v", i, ref)
		}
		end := time.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)
		if got := time.Now().Add(ref.RetryAfter); got.Before(end.Add(-5*time.Second)) || strings.Contains(ref.Message, "come back") {
			t.Errorf("instance %d: expected a spent budget refused until the window renews (%s), got Retry-After %v: %s", i, end, ref.RetryAfter, ref.Message)
		}
	}
}

// The fleet admits one crossing answer, as one instance does: on budget
// 0.20 USD per 24 hours over two instances, requests of worst case (and
// cost) 0.03 USD, alternating between the instances and each answered
// before the next, are admitted while the fleet's budget has room, and
// the one that takes its last (0.02 left) is served whole: 7 answers,
// 0.21 USD, on one instance or two (the fleet's one crossing is not
// refused as taken).
func TestTheFleetAdmitsOneCrossingAnswer(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 0.20, BudgetPer: 24 * time.Hour})
	admitted := 0
	for i := range 40 {
		tk, ref := regs[i%2].AdmitHolding(time.Now(), "alice", "fast", 10, 0.03)
		if ref != nil {
			if ref.Limit != consumer.LimitBudget {
				t.Fatalf("request %d: expected a refusal for the budget, got %+v", i, ref)
			}
			continue
		}
		admitted++
		tk.Done(time.Now(), 0.03)
	}
	if admitted != 7 {
		t.Errorf("expected 7 answers of 0.03 USD admitted on a budget of 0.20 (the 7th takes its last), got %d (%.2f USD)", admitted, float64(admitted)*0.03)
	}
}

// The same with requests in flight on both instances (8 clients, 10 ms
// answers, for a second): an instance that admits the last of its own
// slice while another still holds its own takes no second crossing
// (each took one in 2 of 5 runs: 8 answers, 0.24 USD).
func TestTheFleetAdmitsOneCrossingAnswerConcurrently(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 0.20, BudgetPer: 24 * time.Hour})
	var admitted atomic.Int32
	var wg sync.WaitGroup
	until := time.Now().Add(time.Second)
	for g := range 8 {
		wg.Go(func() {
			for time.Now().Before(until) {
				tk, ref := regs[g%2].AdmitHolding(time.Now(), "alice", "fast", 10, 0.03)
				if ref != nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				admitted.Add(1)
				time.Sleep(10 * time.Millisecond)
				tk.Done(time.Now(), 0.03)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 7 {
		t.Errorf("expected 7 answers of 0.03 USD admitted on a budget of 0.20 (the 7th takes its last), got %d (%.2f USD)", n, float64(n)*0.03)
	}
}

// Values the router did not write, in the keys a consumer's budget reads
// (its slices' hash, with entries of holds in flight of every wrong shape
// or a far expiry, and a crossing key without expiry), neither block the
// window's crossing nor count as holds that may come back: on budget 0.20
// USD per 24 hours, a request of worst case 0.30 is admitted (it takes
// the whole budget, the crossing), and once its answer cost 0.30 the next
// is told the window's end; the hostile entries are gone.
func TestHostileCrossingAndHeldValues(t *testing.T) {
	url := realRedisURL(t)
	regs, stores := fleetRegistriesOn(t, url, 1, consumer.Plan{Name: "team", BudgetUSD: 0.20, BudgetPer: 24 * time.Hour}, 2*time.Second)
	opt, _ := redis.ParseURL(url)
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := context.Background()
	now := time.Now()
	per := 24 * time.Hour
	i := now.UnixNano() / int64(per)
	id := consumerID("alice", consumer.DefaultPlan)
	slices := slicesKey(stores[0].spendKey("consumer:" + id + ":" + per.String() + ":" + strconv.FormatInt(i, 10)))
	far := strconv.FormatInt(time.Now().Add(24*time.Hour).UnixMilli(), 10)
	if err := c.HSet(ctx, slices, "x#held", "junk", "y#held", "-5:"+far, "z#held", "0.5:"+far, "w#held", "NaN:1").Err(); err != nil {
		t.Fatal(err)
	}
	cross := stores[0].prefix + "{c:" + id + "}:crossed:" + per.String() + ":" + strconv.FormatInt(i, 10)
	if err := c.Set(ctx, cross, "hostile", 0).Err(); err != nil {
		t.Fatal(err)
	}
	tk, ref := regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.30)
	if ref != nil {
		t.Fatalf("expected the crossing admitted past a crossing key without expiry, got %s", ref.Message)
	}
	tk.Done(time.Now(), 0.30)
	_, ref = regs[0].AdmitHolding(time.Now(), "alice", "fast", 10, 0.01)
	if ref == nil || ref.RetryAfter < time.Minute {
		t.Errorf("expected a spent budget told the window's end (no hostile entry counted as a hold), got %+v", ref)
	}
	for _, f := range []string{"x#held", "y#held", "z#held", "w#held"} {
		if c.HExists(ctx, slices, f).Val() {
			t.Errorf("expected the hostile entry %s dropped", f)
		}
	}
	if ttl := c.PTTL(ctx, cross).Val(); ttl <= 0 || ttl > 25*time.Hour {
		t.Errorf("expected the crossing key to expire with its window, PTTL %v", ttl)
	}
}

// A spent budget is told its window's end soon after the answers that
// spent it, whatever the request: on budget 0.20 USD per 24 hours over
// two instances, answers of 0.17 and 0.03 USD (each its worst case)
// spend it; a request of 0.01 USD, less than what the instances' records
// of their slices and holds said when they leased, is told the window's
// end on both within spendSliceRetry and a call (each instance records
// its slice and holds anew once they hold less than its record said).
// Before, a record stayed until its instance leased again or its entry
// expired: "retry in 1 s" for 13 s.
func TestASpentBudgetIsToldItsWindowSoon(t *testing.T) {
	regs := fleetRegistries(t, realRedisURL(t), 2, consumer.Plan{Name: "team", BudgetUSD: 0.20, BudgetPer: 24 * time.Hour})
	first, second := holdTheBudget(t, regs, 0.03)
	time.Sleep(100 * time.Millisecond) // the answers take a moment: each instance records its holds in flight meanwhile
	first.Done(time.Now(), 0.17)
	second.Done(time.Now(), 0.03)
	spent := time.Now()
	end := time.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)
	for i, r := range regs {
		var last *consumer.Refusal
		eventually(t, 3*time.Second, "a spent budget told the window's end", func() bool {
			_, last = r.AdmitHolding(time.Now(), "alice", "fast", 10, 0.01)
			if last == nil || last.Limit != consumer.LimitBudget {
				t.Fatalf("instance %d: expected a refusal for a spent budget, got %+v", i, last)
			}
			if time.Now().Add(last.RetryAfter).Before(end.Add(-5 * time.Second)) {
				time.Sleep(50 * time.Millisecond)
				return false
			}
			return true
		})
		t.Logf("instance %d: told Retry-After %v, %v after the budget was spent: %s", i, last.RetryAfter.Round(time.Second), time.Since(spent).Round(time.Millisecond), last.Message)
	}
}
