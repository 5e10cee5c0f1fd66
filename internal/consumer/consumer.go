// Package consumer knows who is asking and what they may still ask: the
// consumers of a router (named by a placeholder, or by their API key in a
// keys file, stored as SHA-256 hashes), the plans that give them limits
// (requests and tokens per minute, concurrent requests, a budget in USD
// per period, the model groups they may use) and a weight (their share of
// scarce capacity in the router's queue), and each consumer's use of its
// limits, on the caller's clock (every method takes its instant). It
// imports neither Caddy nor the router: the root package resolves the
// consumer and writes the refusals in the client's format.
package consumer

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/period"
)

// DefaultPlan is the name of the plan of a consumer that no `consumers`
// line names, when one is defined.
const DefaultPlan = "default"

// Plan is a set of limits and a weight. Each consumer on the plan has them
// for itself: two consumers on a plan of rpm 600 may each send 600
// requests a minute. In fleet mode (Registry.SetFleet) each limit holds
// across the fleet's instances, not per instance.
type Plan struct {
	// Name names the plan in configs, errors and the admin API.
	Name string
	// Weight is each of its consumers' share of the capacity of a model
	// group's deployments when several consumers wait for it at the same
	// priority (weighted fair queueing, router/queue.go). Default (0): 1.
	Weight float64
	// RPM and TPM bound a consumer's requests and tokens (the request's
	// estimate: prompt bytes / 4 plus max_tokens, counted when it is
	// admitted) over a sliding minute, in 1 s steps. 0: none.
	RPM, TPM int64
	// Concurrent bounds a consumer's requests in flight (admitted and not
	// yet answered to their end, a stream included). 0: none.
	Concurrent int
	// BudgetUSD per BudgetPer bounds what a consumer's answers cost, in
	// fixed windows of BudgetPer from the Unix epoch (per 24h renews at
	// 00:00 UTC), at the deployments' prices: a request is admitted while
	// the window's spend plus what the requests in flight hold (each its
	// worst case, AdmitHolding, until it is done) is below BudgetUSD (the
	// answer that crosses it is served whole). 0: none.
	BudgetUSD float64
	BudgetPer time.Duration
	// Groups are the model groups its consumers may use (by the group's
	// name, after aliases and patterns); empty: all.
	Groups []string
}

// weight returns the plan's weight, 1 by default.
func (p *Plan) weight() float64 {
	if p == nil || !(p.Weight > 0) {
		return 1
	}
	return p.Weight
}

// Validate checks a plan's values: not negative, a budget with its period
// (1 s at least), a weight of 0 or from 1/MaxWeight to MaxWeight (a
// smaller one's turns would overflow the queue's virtual time).
func (p *Plan) Validate() error {
	switch {
	case p.Weight != 0 && !(p.Weight >= 1.0/MaxWeight && p.Weight <= MaxWeight):
		return fmt.Errorf("plan %s: weight must be 0 (the default, 1) or from %v to %d, got %v", p.Name, 1.0/MaxWeight, MaxWeight, p.Weight)
	case p.RPM < 0 || p.TPM < 0 || p.Concurrent < 0:
		return fmt.Errorf("plan %s: rpm, tpm and concurrent must not be negative", p.Name)
	case p.BudgetUSD < 0 || math.IsNaN(p.BudgetUSD) || math.IsInf(p.BudgetUSD, 0):
		return fmt.Errorf("plan %s: budget must be a finite amount of USD, more than 0", p.Name)
	case p.BudgetUSD > 0 && p.BudgetPer < time.Second:
		return fmt.Errorf("plan %s: budget period must be at least 1s, got %s", p.Name, p.BudgetPer)
	}
	return nil
}

// MaxWeight bounds a plan's weight, and 1/MaxWeight from below: a share
// of 1000 to 1 is already all.
const MaxWeight = 1000

// Limit names the limit that refused a request, as the header
// X-LLM-Router-Limit's companion and the metrics' label say it.
type Limit string

// The limits.
const (
	LimitRPM        Limit = "rpm"
	LimitTPM        Limit = "tpm"
	LimitConcurrent Limit = "concurrent"
	LimitBudget     Limit = "budget"
	LimitGroups     Limit = "groups"
)

// Refusal is why a consumer's request is not admitted: Status 429 (a
// limit, with RetryAfter until it admits the request again) or 403 (a
// model group the plan does not list; RetryAfter 0).
type Refusal struct {
	Status     int
	Limit      Limit
	RetryAfter time.Duration
	Message    string
}

// Registry holds the plans, which consumer is on which, and each
// consumer's use of its plan's limits. It is safe for concurrent use.
type Registry struct {
	plans  map[string]*Plan
	on     map[string]string // consumer -> plan name
	counts *Counts
	fleet  Fleet // nil: this instance's counts alone
}

// Counts are consumers' use of their plans' limits (the minute's requests
// and tokens, those in flight, the budget window's spend), by consumer
// name: a Registry's own, or shared by the registries of successive
// configs (ShareCounts), so that a config reload keeps them. A consumer's
// next request is counted against the plan of the registry that admits
// it. Safe for concurrent use.
type Counts struct {
	mu  sync.Mutex
	use map[string]*usage // consumers with limits, by name
}

// NewCounts returns empty counts.
func NewCounts() *Counts { return &Counts{use: map[string]*usage{}} }

// ShareCounts makes r count its consumers' use in c (replacing its own),
// before r admits any request.
func (r *Registry) ShareCounts(c *Counts) { r.counts = c }

// Counts returns the counts r keeps its consumers' use in.
func (r *Registry) Counts() *Counts {
	if r == nil {
		return nil
	}
	return r.counts
}

// Fleet counts consumers' limits across a fleet of instances (fleet mode:
// internal/fleet's Store, on the same shared state as the deployments'
// declared limits and budgets). It must be safe for concurrent use.
type Fleet interface {
	// ReserveConsumer takes a place for one request of tokens in
	// consumer's fleet-wide sliding minute on plan (one minute per
	// consumer and plan's name) of rpm requests and tpm tokens (0: not
	// limited): a zero wait when it holds one, else how long until the
	// fleet's minute has room and which limit is full. While the fleet
	// cannot answer within its timeout, it decides on this instance's
	// share of the limits (the limit over the fleet's instances): an
	// error is that share spent, and the registry refuses the request.
	ReserveConsumer(consumer, plan string, rpm, tpm, tokens int64) (wait time.Duration, full Limit, err error)
	// TakeConcurrent takes one of consumer's limit places in flight on
	// plan, fleet-wide: release gives it back (once, when the request
	// ends). ok is false when the fleet has limit in flight, or when it
	// cannot answer and this instance has its share of limit in flight.
	TakeConcurrent(consumer, plan string, limit int) (release func(), ok bool)
	// Budget returns consumer's budget on plan, usd per per, spent by the
	// whole fleet.
	Budget(consumer, plan string, usd float64, per time.Duration) Budget
}

// Budget is a consumer's budget shared by a fleet (Fleet.Budget).
type Budget interface {
	// Hold holds usd (USD) at now, a request's worst case (0: what the
	// budget's requests cost of late), no more than what the fleet's
	// budget has left (the request that takes its last is served whole,
	// as on one instance) and no less than a millionth of a USD: settle
	// spends what the request cost (USD) at its end and gives the hold
	// back; settle is nil when the budget has nothing left, and until is
	// when its window renews, or sooner when what the fleet holds for
	// requests in flight would make room once they settle (retry then).
	Hold(now time.Time, usd float64) (settle func(now time.Time, usd float64), until time.Time)
	// Spend spends usd at now with no hold (an answer found done after
	// its request ended).
	Spend(now time.Time, usd float64)
}

// SetFleet makes the registry count rpm, tpm, concurrent and budget
// across the fleet f (nil: this instance alone). Call it before the registry admits requests.
func (r *Registry) SetFleet(f Fleet) {
	if r != nil {
		r.fleet = f
	}
}

// New returns the registry of plans and of members (consumer -> plan's
// name). An error names a member on an unknown plan, a consumer on two
// plans is the caller's to refuse (members is a map), a plan twice or an
// invalid one.
func New(plans []Plan, members map[string]string) (*Registry, error) {
	r := &Registry{plans: map[string]*Plan{}, on: map[string]string{}, counts: NewCounts()}
	for i := range plans {
		p := plans[i]
		if err := p.Validate(); err != nil {
			return nil, err
		}
		if _, dup := r.plans[p.Name]; dup {
			return nil, fmt.Errorf("plan %s defined twice", p.Name)
		}
		p.Groups = slices.Clone(p.Groups)
		r.plans[p.Name] = &p
	}
	for c, name := range members {
		if _, ok := r.plans[name]; !ok {
			return nil, fmt.Errorf("consumers %s: no plan %s", name, name)
		}
		r.on[c] = name
	}
	return r, nil
}

// PlanOf returns the plan of consumer: the one a `consumers` line puts it
// on, else DefaultPlan when defined, else nil (no limits, weight 1). The
// anonymous consumer ("") is on DefaultPlan too.
func (r *Registry) PlanOf(consumer string) *Plan {
	if r == nil {
		return nil
	}
	if name, ok := r.on[consumer]; ok {
		return r.plans[name]
	}
	return r.plans[DefaultPlan]
}

// noPlan is the plan of a named consumer on no plan, as its counts and
// Report have it: no name, no limits, weight 1.
var noPlan = &Plan{}

// planOrNone is consumer's plan (PlanOf), noPlan for a named consumer on
// none, nil for the anonymous one on none (it is not tracked).
func (r *Registry) planOrNone(consumer string) *Plan {
	if p := r.PlanOf(consumer); p != nil || consumer == "" {
		return p
	}
	return noPlan
}

// Weight returns consumer's weight in the queue (its plan's, 1 by
// default).
func (r *Registry) Weight(consumer string) float64 { return r.PlanOf(consumer).weight() }

// Members returns the consumers the config puts on a plan, sorted.
func (r *Registry) Members() []string {
	if r == nil {
		return nil
	}
	out := make([]string, 0, len(r.on))
	for c := range r.on {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Ticket is an admitted request's hold on its consumer's limits: Done
// gives back its concurrent slot and spends what its answer cost, once.
type Ticket struct {
	u       *usage
	start   time.Time                // its admission
	hold    float64                  // what it holds of the budget, USD
	release func()                   // its fleet-wide place in flight (nil: none)
	settle  func(time.Time, float64) // its fleet-wide budget's hold (nil: none)
	once    sync.Once
}

// Done ends the request at now: its answer cost usd (0 when unknown),
// which settles its hold on the budget. A nil Ticket (a consumer without
// limits) does nothing.
func (t *Ticket) Done(now time.Time, usd float64) {
	if t == nil || t.u == nil {
		return
	}
	t.once.Do(func() {
		t.u.done(now, t.start, t.hold, usd)
		if t.release != nil {
			t.release()
		}
		if t.settle != nil {
			t.settle(now, usd)
		}
	})
}

// Admit is AdmitHolding with nothing held of the budget.
func (r *Registry) Admit(now time.Time, consumer, group string, tokens int64) (*Ticket, *Refusal) {
	return r.AdmitHolding(now, consumer, group, tokens, 0)
}

// AdmitHolding decides a request of consumer for model group at now, of
// tokens (its estimate), whose answer may cost up to worstUSD (held of the
// plan's budget until Done settles it at the real cost): a ticket when
// its plan admits it (Done must follow), else the refusal. Groups are
// checked first (403), then the budget, rpm, tpm and concurrent (429),
// then, in fleet mode (SetFleet), concurrent, budget, rpm and tpm across
// the fleet. A refused request changes no count (but a fleet-wide rpm or
// tpm place, taken last). A consumer on a plan without limits, or on no
// plan, is admitted and counted all the same (for Report); the anonymous
// consumer on no plan gets a nil ticket and is not tracked.
func (r *Registry) AdmitHolding(now time.Time, consumer, group string, tokens int64, worstUSD float64) (*Ticket, *Refusal) {
	if ref := r.Allows(consumer, group); ref != nil {
		return nil, ref
	}
	p := r.planOrNone(consumer)
	if p == nil {
		return nil, nil
	}
	hold := 0.0
	if p.BudgetUSD > 0 && worstUSD > 0 {
		hold = worstUSD
	}
	c := r.counts
	c.mu.Lock()
	u := c.of(consumer, p, now)
	ref := u.admit(now, tokens, hold)
	c.mu.Unlock()
	t := &Ticket{u: u, start: now, hold: hold}
	if ref == nil {
		ref = r.admitFleet(now, p, t, consumer, tokens)
	}
	if ref != nil {
		ref.Message = fmt.Sprintf("consumer %s is over its %s (plan %s): %s", consumer, ref.Limit, p.Name, ref.Message)
		return nil, ref
	}
	return t, nil
}

// Allows checks that consumer's plan lets it use model group (its
// groups), counting nothing: nil, or the 403's refusal. Admit checks it
// first; a request that spends no limit (a count of tokens) is checked
// by it alone.
func (r *Registry) Allows(consumer, group string) *Refusal {
	p := r.PlanOf(consumer)
	if p == nil || len(p.Groups) == 0 || slices.Contains(p.Groups, group) {
		return nil
	}
	return &Refusal{Status: http.StatusForbidden, Limit: LimitGroups,
		Message: fmt.Sprintf("consumer %s may not use model %s (its plan %s allows: %s)", consumer, group, p.Name, joinGroups(p.Groups))}
}

// Spend charges usd (the cost of an answer found done after its request
// ended: a background response's) to consumer's budget window at now, as
// a Ticket's Done does. A consumer whose plan has no budget is not
// charged.
func (r *Registry) Spend(now time.Time, consumer string, usd float64) {
	p := r.PlanOf(consumer)
	if p == nil || p.BudgetUSD == 0 || !(usd > 0) {
		return
	}
	if r.fleet != nil {
		r.fleet.Budget(consumer, p.Name, p.BudgetUSD, p.BudgetPer).Spend(now, usd)
	}
	c := r.counts
	c.mu.Lock()
	defer c.mu.Unlock()
	c.of(consumer, p, now).spend(now, usd)
}

// of returns consumer's usage, on plan p, under c.mu: tracked from now on
// when it was not.
func (c *Counts) of(consumer string, p *Plan, now time.Time) *usage {
	u := c.use[consumer]
	if u == nil {
		c.sweep(now)
		u = &usage{plan: p, c: c}
		c.use[consumer] = u
	}
	u.plan = p
	return u
}

// admitFleet takes the fleet's places of a request of plan p that t's
// usage admitted locally at now (SetFleet): its place in flight, its
// budget's hold (its worst case, as held locally: Budget.Hold), its place in the
// minute, each kept in t; or it gives back what it took, undoes the
// usage's counts and returns the refusal.
func (r *Registry) admitFleet(now time.Time, p *Plan, t *Ticket, consumer string, tokens int64) *Refusal {
	if r.fleet == nil {
		return nil
	}
	ref := r.takeFleet(now, p, t, consumer, tokens)
	if ref == nil {
		return nil
	}
	if t.release != nil {
		t.release()
	}
	if t.settle != nil {
		t.settle(now, 0)
	}
	r.counts.mu.Lock()
	t.u.undo(now, tokens, t.hold)
	r.counts.mu.Unlock()
	return ref
}

// fleetRecheck is the Retry-After of a refusal for a fleet that did not
// answer in time.
const fleetRecheck = time.Second

// takeFleet takes t's fleet-wide places (admitFleet), or returns the
// refusal.
func (r *Registry) takeFleet(now time.Time, p *Plan, t *Ticket, consumer string, tokens int64) *Refusal {
	if p.Concurrent > 0 {
		if t.release, _ = r.fleet.TakeConcurrent(consumer, p.Name, p.Concurrent); t.release == nil {
			return &Refusal{Status: http.StatusTooManyRequests, Limit: LimitConcurrent, RetryAfter: fleetRecheck,
				Message: fmt.Sprintf("the fleet's instances have its concurrent %d in flight", p.Concurrent)}
		}
	}
	if p.BudgetUSD > 0 {
		var until time.Time
		// Its worst case, as held here (0 when unknown: its usual cost).
		if t.settle, until = r.fleet.Budget(consumer, p.Name, p.BudgetUSD, p.BudgetPer).Hold(now, t.hold); t.settle == nil {
			ref := &Refusal{Status: http.StatusTooManyRequests, Limit: LimitBudget, RetryAfter: max(until.Sub(now), time.Second),
				Message: fmt.Sprintf("the fleet's instances spent its %.4g USD per %s, or hold the rest for their requests in flight (each its worst case, held until it is answered; another instance's holds are known to this one from its next lease); it renews at %s", p.BudgetUSD, period.String(p.BudgetPer), until.UTC().Format(time.RFC3339))}
			if _, end := period.Window(now, p.BudgetPer); until.Before(end) {
				ref.Message = fmt.Sprintf("what is left of its %.4g USD per %s is held by the fleet's instances, in slices or for its requests in flight (each its worst case until it is answered at its cost), which come back soon", p.BudgetUSD, period.String(p.BudgetPer))
			}
			return ref
		}
	}
	if p.RPM == 0 && p.TPM == 0 {
		return nil
	}
	wait, full, err := r.fleet.ReserveConsumer(consumer, p.Name, p.RPM, p.TPM, tokens)
	if err != nil {
		full = LimitRPM
		if p.RPM == 0 {
			full = LimitTPM
		}
		return &Refusal{Status: http.StatusTooManyRequests, Limit: full, RetryAfter: fleetRecheck,
			Message: "the fleet's store did not answer in time, and this instance admitted its share of the minute"}
	}
	if wait <= 0 {
		return nil
	}
	msg := fmt.Sprintf("the fleet's instances admitted its rpm %d in the last minute", p.RPM)
	if full == LimitTPM {
		msg = fmt.Sprintf("the fleet's instances admitted its tpm %d in the last minute (this request %d)", p.TPM, tokens)
	}
	return &Refusal{Status: http.StatusTooManyRequests, Limit: full, RetryAfter: max(wait, time.Second), Message: msg}
}

func joinGroups(gs []string) string {
	if len(gs) > 10 {
		return fmt.Sprintf("%s and %d more", joinGroups(gs[:10]), len(gs)-10)
	}
	out := ""
	for i, g := range gs {
		if i > 0 {
			out += ", "
		}
		out += g
	}
	return out
}

// maxTracked is how many consumers' use the registry keeps before it
// forgets those with nothing in flight, nothing in their minute, and no
// spend in their budget's window (their next request starts afresh, as it
// would anyway).
const maxTracked = 10000

// sweep forgets idle consumers when c tracks too many, under c.mu.
func (c *Counts) sweep(now time.Time) {
	if len(c.use) < maxTracked {
		return
	}
	for who, u := range c.use {
		if u.idle(now) {
			delete(c.use, who)
		}
	}
}

// Usage is a consumer's use of its plan's limits at an instant, for the
// admin API and the status page.
type Usage struct {
	Consumer string `json:"consumer"`
	// Plan is the name of its plan, "" for none (no limits, weight 1).
	Plan   string  `json:"plan"`
	Weight float64 `json:"weight"`
	// Requests and Tokens are those of the last minute; InFlight those
	// admitted and not done; SpentUSD the budget window's spend, HeldUSD
	// what the requests in flight hold of it (their worst cases).
	Requests int64   `json:"requests_last_minute"`
	Tokens   int64   `json:"tokens_last_minute"`
	InFlight int     `json:"in_flight"`
	SpentUSD float64 `json:"spent_usd"`
	HeldUSD  float64 `json:"held_usd,omitempty"`
	// FleetWide says SpentUSD and HeldUSD are the fleet's (fleet mode,
	// read from Redis for the report), not this instance's alone; the
	// other figures are this instance's.
	FleetWide bool `json:"fleet_wide,omitempty"`
	// Limits are the plan's (0: none).
	RPM        int64   `json:"rpm,omitempty"`
	TPM        int64   `json:"tpm,omitempty"`
	Concurrent int     `json:"concurrent,omitempty"`
	BudgetUSD  float64 `json:"budget_usd,omitempty"`
	BudgetPer  string  `json:"budget_per,omitempty"`
}

// Report returns the use of every tracked consumer at now on its plan in
// this config (PlanOf: after a reload that moved it, its new plan, not
// the one its last admitted request had), sorted by name; a consumer on
// no plan is listed with Plan "" and no limits. In fleet mode, with a
// Fleet that is a FleetReporter, a budget's spend and holds are the
// fleet's (FleetWide), read from it once for all of them after the
// counts are taken; this instance's when it does not answer.
func (r *Registry) Report(now time.Time) []Usage {
	if r == nil {
		return nil
	}
	c := r.counts
	c.mu.Lock()
	out := make([]Usage, 0, len(c.use))
	var budgets []BudgetRef
	var at []int
	for who, u := range c.use {
		p := r.planOrNone(who)
		if p == nil {
			continue // anonymous, moved off the default plan
		}
		u.plan = p // as its next admission would (Counts.of)
		out = append(out, u.report(who, now))
		if p.BudgetUSD > 0 {
			budgets = append(budgets, BudgetRef{Consumer: who, Plan: p.Name, USD: p.BudgetUSD, Per: p.BudgetPer})
			at = append(at, len(out)-1)
		}
	}
	c.mu.Unlock()
	if fr, ok := r.fleet.(FleetReporter); ok && len(budgets) > 0 {
		if figs, err := fr.ReportBudgets(now, budgets); err == nil && len(figs) == len(budgets) {
			for k, i := range at {
				out[i].SpentUSD, out[i].HeldUSD, out[i].FleetWide = figs[k].SpentUSD, figs[k].HeldUSD, true
			}
		}
	}
	slices.SortFunc(out, func(a, b Usage) int {
		if a.Consumer < b.Consumer {
			return -1
		}
		return 1
	})
	return out
}

// FleetReporter is a Fleet that reports its consumers' budgets (the
// admin API's and the status page's figures, not the request path's).
type FleetReporter interface {
	// ReportBudgets returns, for each of budgets in order, what the
	// whole fleet spent of it in its window of now and what its requests
	// in flight hold (USD), in one call bounded by the fleet's timeout;
	// an error when the fleet does not answer.
	ReportBudgets(now time.Time, budgets []BudgetRef) ([]BudgetFigures, error)
}

// BudgetRef names a consumer's budget on a plan: USD per Per.
type BudgetRef struct {
	Consumer, Plan string
	USD            float64
	Per            time.Duration
}

// BudgetFigures are a budget's spend and holds across a fleet (USD).
type BudgetFigures struct {
	SpentUSD, HeldUSD float64
}
