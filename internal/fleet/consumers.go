package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/consumer"
	"github.com/llmrouter/caddy-llm-router/internal/period"
)

// Consumers' limits across the fleet. A consumer's rpm and tpm are one
// sliding minute for the whole fleet, counted as a deployment's declared
// limits are (declared.go, declaredScript): in Redis under
// <prefix>{c:<hash of the consumer's and its plan's names>}:declared (and
// :declared_tokens: one minute per consumer and plan, so that two
// llm_router blocks sharing a store that put a consumer on plans of
// different names count it apart, as each counts it on its own), the instances granted places in it that they use
// within declaredUse, sized from each one's demand for that consumer. So a
// request costs no Redis call while the instance's grant holds its place
// (the next grant is asked for in the background), and the instances
// together never admit more than the rpm (or tpm) in any minute: a grant
// counts from when it is made until a minute after its use ends. While
// Redis does not answer within the store's timeout, an instance admits
// from the places it holds and then up to its share of the limit, on its
// own counts of the minute (outage.go: the limit over the instances the
// census counts, never the whole limit on each).

// maxConsumerBindings bounds the consumers whose grants a store keeps:
// beyond it, those holding no grant are forgotten (the next request of one
// asks Redis again, as after a minute idle).
const maxConsumerBindings = 10000

// consumerID names a consumer on a plan in keys: a hash of their names,
// so that no key shows them.
func consumerID(name, plan string) string {
	sum := sha256.Sum256([]byte("llm_router consumer\x00" + name + "\x00" + plan))
	return hex.EncodeToString(sum[:16])
}

// consumerRecheck bounds how long an instance answers a consumer's
// requests with the fleet's last refusal before it asks Redis again: a
// consumer over its limit costs a Redis call a second per instance, not one
// per request (places given back meanwhile are seen at the next one).
const consumerRecheck = time.Second

// consumerLimits is one consumer's fleet-wide minute on this instance.
type consumerLimits struct {
	b       *binding // its grants of places (declared.go), without a State
	base    string   // its keys' prefix: <prefix>{c:<id>}:
	mu      sync.Mutex
	flight  *flightSlice // its slice of places in flight (concurrent.go), made on first use
	until   time.Time    // the fleet's last refusal: its minute has room then
	recheck time.Time    // ask Redis again from then
	limit   consumer.Limit
	minute  localMinute // what this instance admitted in the minute (outage.go)
}

// refused returns the fleet's last refusal while it stands at now.
func (c *consumerLimits) refused(now time.Time) (time.Duration, consumer.Limit, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !now.Before(c.recheck) {
		return 0, "", false
	}
	return c.until.Sub(now), c.limit, true
}

// ReserveConsumer implements consumer.Fleet: a place for one request of
// tokens in the fleet's minute of consumer name on plan, of rpm requests
// and tpm tokens (0: not limited), from this instance's grants while they hold it
// (no Redis call), else from a new grant within the store's timeout. A
// wait is until the fleet's minute has room, by Redis' clock (a grant
// counts until a minute after its use can end, so up to declaredUse more
// than a minute after the last request admitted); a refusal stands for
// consumerRecheck on this instance. While the store is down or does not
// answer within its timeout, the instance decides on its share of the
// minute (outage.go): an error (errShareSpent) is that share spent, a
// refusal for the caller (consumer.Registry).
func (s *Store) ReserveConsumer(name, plan string, rpm, tpm, tokens int64) (time.Duration, consumer.Limit, error) {
	if rpm <= 0 && tpm <= 0 {
		return 0, "", nil
	}
	c := s.consumerLimits(name, plan)
	if wait, l, ok := c.refused(time.Now()); ok {
		return max(wait, time.Millisecond), l, nil
	}
	c.b.declaredLimits(rpm, tpm)
	wait, full, err := c.b.reserve(rpm, tpm, tokens)
	if err != nil {
		return 0, "", c.offline(time.Now(), rpm, tpm, tokens)
	}
	if wait <= 0 {
		c.admitted(time.Now(), tokens)
		return 0, "", nil
	}
	l := consumer.LimitRPM
	if full == limitTokens {
		l = consumer.LimitTPM
	}
	c.refuse(time.Now(), wait, l)
	return wait, l, nil
}

// refuse keeps a refusal at now for wait, and holds the background's
// renewals of the grants until the minute has room (a renewal would find
// it spent): the next request after consumerRecheck asks instead.
func (c *consumerLimits) refuse(now time.Time, wait time.Duration, l consumer.Limit) {
	c.mu.Lock()
	c.until, c.recheck, c.limit = now.Add(wait), now.Add(min(wait, consumerRecheck)), l
	c.mu.Unlock()
	p := &c.b.places
	p.mu.Lock()
	p.full = now.Add(wait)
	p.mu.Unlock()
}

// consumerLimits returns the fleet-wide minute of consumer name on plan,
// made on first use.
func (s *Store) consumerLimits(name, plan string) *consumerLimits {
	id := consumerID(name, plan)
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.consumers[id]; c != nil {
		return c
	}
	if s.consumers == nil {
		s.consumers = map[string]*consumerLimits{}
	}
	if len(s.consumers) >= maxConsumerBindings {
		for k, c := range s.consumers {
			if c.b.places.idle() && c.held().idle() {
				delete(s.consumers, k)
			}
		}
	}
	base := s.prefix + "{c:" + id + "}:"
	c := &consumerLimits{b: &binding{s: s, id: id, logKey: base + "declared", tokensKey: base + "declared_tokens", window: s.consumerWindow}, base: base}
	s.consumers[id] = c
	return c
}

// held returns c's slice of places in flight, nil when it has none.
func (c *consumerLimits) held() *flightSlice {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flight
}

// snapshotConsumers returns the bindings of the consumers' minutes.
func (s *Store) snapshotConsumers() []*binding {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*binding, 0, len(s.consumers))
	for _, c := range s.consumers {
		out = append(out, c.b)
	}
	return out
}

// idle reports whether p holds no grant and no call is in flight.
func (p *places) idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.grants) == 0 && p.flight.done == nil
}

// Interface guards
var _ consumer.Fleet = (*Store)(nil)

// Budget implements consumer.Fleet: consumer name's budget on plan, usd
// per per, on the fleet's leased USD budgets (capacity.Spending on this
// store, a SpendLeaser: spend.go) under <prefix>spend:<hash of the
// consumer, its plan, the period and the window>, so that the whole fleet
// spends it once. Holds and settles take from this instance's slice in
// memory; Redis is asked only for a new slice (as a deployment's budget).
// A reload that changes the amount keeps what was spent; one that
// changes the period carries what the fleet spent in the old period's
// window into the new period's (capacity.Spending.SetLimit).
func (s *Store) Budget(name, plan string, usd float64, per time.Duration) consumer.Budget {
	key := "consumer:" + consumerID(name, plan)
	limit := capacity.SpendLimit{USD: usd, Period: per}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.budgets[key]; b != nil {
		if b.sp.Limit() != limit {
			b.sp.SetLimit(limit)
		}
		return b
	}
	if s.budgets == nil || len(s.budgets) >= maxConsumerBindings {
		s.budgets = map[string]*consumerBudget{} // the forgotten give their slices back once idle (capacity's spendLeaseIdle)
	}
	b := &consumerBudget{sp: capacity.NewSpendingByPeriod(limit, s, key), // keys as before: consumer:<id>:<period>:<window>
		store: s, crossKey: s.prefix + "{c:" + consumerID(name, plan) + "}:crossed:"}
	s.budgets[key] = b
	return b
}

// consumerBudget is a consumer's fleet-wide budget (consumer.Budget).
type consumerBudget struct {
	sp   *capacity.Spending
	mu   sync.Mutex
	cost float64 // what its requests cost, weighted (USD): the hold of one of unknown cost
	// store and crossKey (<prefix>{c:<id>}:crossed:, then the period and
	// the window's index) claim the window's one crossing (claimCrossing).
	store    *Store
	crossKey string
}

// Hold bounds of a consumer's budget: the least a hold takes (USD: the
// first request of a consumer, whose cost is not known yet, still needs
// room), and a new cost's weight in the usual cost (an exponentially
// weighted mean over about the last 5 requests that cost).
const (
	minHold    = 1e-6
	costWeight = 0.2
)

// holdsRecheck is how soon a hold refused while the fleet's holds in
// flight would make room for it is worth trying again (Hold's until):
// they settle as their answers come, at no more than they hold.
const holdsRecheck = time.Second

// Hold holds usd at now from the fleet's budget: a request's worst case,
// no more than what the budget has left (the request that takes its last
// is admitted and served whole, as by a consumer's budget on one
// instance: consumer.Plan's BudgetUSD), or 0: the consumer's usual cost
// on this instance; at least minHold. settle spends what the request cost
// and gives the hold back; nil when the budget has nothing left, with the
// instant its window renews (or when other instances' slices may come
// back, or holdsRecheck from now when the holds in flight would make
// room once they settle). A worst case refused for more than the fleet had left (this
// instance's knowledge of it was old) is held again at what is left, once.
func (b *consumerBudget) Hold(now time.Time, usd float64) (settle func(time.Time, float64), until time.Time) {
	worst := usd > 0
	if !worst {
		b.mu.Lock()
		usd = b.cost
		b.mu.Unlock()
	}
	hold := b.capped(now, usd, worst)
	h, ok, until := b.sp.Hold(now, hold)
	if !ok && worst {
		if left := b.sp.Left(now); left >= minHold && left < usd {
			hold = left
			h, ok, until = b.sp.Hold(now, left)
		}
	}
	if ok && worst && hold < usd && !b.claimCrossing(now) {
		b.sp.Settle(now, h, 0) // another request took the window's crossing
		b.sp.GiveBack(now)     // the slice it cannot use goes back, for another instance's attempt
		ok, hold = false, usd
	}
	if !ok {
		if retry := now.Add(holdsRecheck); retry.Before(until) && b.sp.HoldsInFlightWouldHold(now, hold) {
			until = retry // not spent: held for requests in flight, which settle at their cost
		}
		return nil, until
	}
	if worst && hold < usd {
		return func(at time.Time, cost float64) {
			b.learn(cost)
			b.sp.Settle(at, h, cost)
			if cost <= hold {
				b.unclaimCrossing(now) // it did not cross: the window may still take one
			}
		}, until
	}
	return func(at time.Time, cost float64) {
		b.learn(cost)
		b.sp.Settle(at, h, cost)
	}, until
}

// A crossing is the request a budget admits with less left than its
// worst case (its hold capped at what is left, consumerBudget.Hold): its
// answer may cost more, and is served whole, as the last request of a
// consumer's budget is on one instance. Each instance would otherwise
// admit one, from the last of its own slice while others still held
// theirs (8 answers of 0.03 USD on a budget of 0.20 over two instances,
// one instance's 7: TestTheFleetAdmitsOneCrossingAnswerConcurrently), so
// the fleet admits one per window: a crossing claims the window's key
// (SET NX, expiring a minute after the window), and gives it back when
// its answer cost no more than it held. While Redis does not answer
// within the store's timeout, an instance decides alone (one crossing
// each, as before).

// claimCrossing claims the crossing of the budget's window at now for a
// request: false when another request holds it.
func (b *consumerBudget) claimCrossing(now time.Time) bool {
	s := b.store
	key, ttl := b.crossingKey(now)
	if !s.available() {
		return true // alone: what this instance knows decides
	}
	start := time.Now()
	ctx, cancel := s.requestCtx(s.ctx)
	defer cancel()
	n, err := claimCrossingScript.Run(ctx, s.client, []string{key}, max(ttl.Milliseconds(), 1)).Int()
	if err != nil {
		s.callFailed("spend", err, start)
		return true
	}
	s.answered()
	return n == 1
}

// claimCrossingScript claims a window's crossing: 1 when it set the key
// (expiring after ARGV[1] ms), 0 when another request holds it. A key
// that would outlive the window by more than a minute (no expiry, or a
// longer one: a stray or hostile value; an instance's own claim expires
// within ms of what another computes, whose clock may run a little
// apart) is replaced, so that nothing written there blocks the crossing
// past its window.
var claimCrossingScript = redis.NewScript(`
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 or ttl > tonumber(ARGV[1]) + 60000 then
  redis.call('DEL', KEYS[1])
end
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 1
end
return 0
`)

// unclaimCrossing gives the crossing of the window holding at back, in
// the background (a request that claimed it cost no more than it held).
func (b *consumerBudget) unclaimCrossing(at time.Time) {
	s := b.store
	key, _ := b.crossingKey(at)
	if !s.available() {
		return
	}
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.wg.Add(1) // under s.mu, as close sets closed before it waits
	}
	s.mu.Unlock()
	if closed {
		return
	}
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, s.bgTimeout)
		defer cancel()
		if err := s.client.Del(ctx, key).Err(); err != nil {
			s.callFailed("spend", err, time.Now())
		}
	}()
}

// crossingKey is the key of the crossing of the budget's window at now,
// and its expiry: a minute after the window ends.
func (b *consumerBudget) crossingKey(now time.Time) (string, time.Duration) {
	per := b.sp.Limit().Period
	i, end := period.Window(now, per)
	return b.crossKey + per.String() + ":" + strconv.FormatInt(i, 10), end.Sub(now) + time.Minute
}

// capped is the hold of usd at now: a worst case no more than what the
// budget has left while something is (Spending.Left), at least minHold.
func (b *consumerBudget) capped(now time.Time, usd float64, worst bool) float64 {
	if worst {
		if left := b.sp.Left(now); left >= minHold {
			usd = min(usd, left)
		}
	}
	return max(usd, minHold)
}

// learn folds a request's cost (USD) into the usual cost.
func (b *consumerBudget) learn(cost float64) {
	if !(cost > 0) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cost == 0 {
		b.cost = cost
		return
	}
	b.cost += (cost - b.cost) * costWeight
}

// Spend spends usd at now with no hold (an answer found done later).
func (b *consumerBudget) Spend(now time.Time, usd float64) { b.sp.Add(now, usd) }

// ReportBudgets implements consumer.FleetReporter: for each budget, what
// the fleet spent in the window of now and what its requests in flight
// hold (USD), from the budget's total and its slices' records
// (leaseSpendScript): the total counts the instances' slices, spent or
// not, so what their records say they hold unspent is taken off it, and
// what they say their holds in flight hold is the holds (a record is at
// most about a second stale once it holds more than its instance does:
// capacity's refreshRecord). One pipelined round trip of two reads per
// budget, bounded by the store's timeout; ErrUnavailable when the store
// is down.
func (s *Store) ReportBudgets(now time.Time, budgets []consumer.BudgetRef) ([]consumer.BudgetFigures, error) {
	if !s.available() {
		return nil, ErrUnavailable
	}
	ctx, cancel := s.requestCtx(s.ctx)
	defer cancel()
	pipe := s.client.Pipeline()
	totals, entries := make([]*redis.StringCmd, len(budgets)), make([]*redis.MapStringStringCmd, len(budgets))
	sps := make([]*capacity.Spending, len(budgets))
	for i, b := range budgets {
		sps[i] = s.Budget(b.Consumer, b.Plan, b.USD, b.Per).(*consumerBudget).sp
		sps[i].Sync(now) // a carry after a reload, a write still kept here: in the total read
		k := s.spendKey(sps[i].StoreKey(now))
		totals[i], entries[i] = pipe.Get(ctx, k), pipe.HGetAll(ctx, slicesKey(k))
	}
	start := time.Now()
	_, _ = pipe.Exec(ctx) // each command's error below
	for i := range budgets {
		for _, c := range []redis.Cmder{totals[i], entries[i]} {
			var reply redis.Error
			if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) && !errors.As(err, &reply) { // a key of another type is none, as the scripts take it
				s.callFailed("spend", err, start)
				return nil, err
			}
		}
	}
	s.answered()
	out := make([]consumer.BudgetFigures, len(budgets))
	nowMS := time.Now().UnixMilli() // the records' expiries are on Redis' clock; a skew of ms against their seconds
	for i := range budgets {
		total, err := totals[i].Float64()
		if err != nil || !(total >= 0) || math.IsInf(total, 0) {
			total = 0 // none, or no finite number: none, as the scripts take it
		}
		var unspent, held float64
		for field, v := range entries[i].Val() {
			a, e, ok := sliceEntry(v)
			if !ok || e <= nowMS {
				continue
			}
			if strings.HasSuffix(field, "#held") {
				held += a
			} else {
				unspent += a
			}
		}
		spent, holds := sps[i].Unwritten(now) // what this instance could not write yet
		out[i] = consumer.BudgetFigures{SpentUSD: capacity.RoundUSD(max(total-unspent-held, 0) + spent), HeldUSD: capacity.RoundUSD(min(held, max(total-unspent, 0)) + holds)}
	}
	return out, nil
}

// sliceEntry parses a slices' record, "<USD>:<expiry, Unix ms>", as
// leaseSpendScript writes it; ok is false for any other shape or a
// negative amount (the script drops those).
func sliceEntry(v string) (usd float64, expiry int64, ok bool) {
	a, e, found := strings.Cut(v, ":")
	if !found {
		return 0, 0, false
	}
	usd, err1 := strconv.ParseFloat(a, 64)
	expiry, err2 := strconv.ParseInt(e, 10, 64)
	if err1 != nil || err2 != nil || !(usd >= 0) || math.IsInf(usd, 0) {
		return 0, 0, false
	}
	return usd, expiry, true
}
