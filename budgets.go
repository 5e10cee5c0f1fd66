package llmrouter

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmrouter/caddy-llm-router/internal/budget"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Budget is a spending limit: at most USD per Per, counted at the
// deployments' prices (cost_input, cost_cached_input, cost_output) from
// the usage the providers state, in fixed windows of Per from the Unix
// epoch (per 24h renews at 00:00 UTC, per 1h on the hour). Each attempt
// holds its worst-case cost (prompt estimate at cost_input, max_tokens or
// router.DefaultBudgetOutputTokens at cost_output) against its
// deployment's budget and its group's before it is sent, and settles it
// at what its answer cost. A deployment's budget (in its deployment
// block) takes it out once spent, as a spent quota (class
// quota_exhausted), until the window renews, and skips it for a request
// it cannot hold; a model group's answers 429 with Retry-After until
// then, or wait for the renewal when it comes before their deadline. In
// fleet mode the whole fleet spends and holds one budget. The Caddyfile
// says `budget <USD> per <duration>`.
type Budget struct {
	// USD is the budget, in US dollars; more than 0.
	USD float64 `json:"usd"`
	// Per is the window's length; at least a second.
	Per caddy.Duration `json:"per"`
}

func (b *Budget) validate() error {
	if b == nil {
		return nil
	}
	return b.limit().Validate()
}

// limit is b as package budget reads it.
func (b *Budget) limit() budget.Limit {
	return budget.Limit{USD: b.USD, Per: time.Duration(b.Per)}
}

// limitOf is b's limit, nil when b is.
func limitOf(b *Budget) *budget.Limit {
	if b == nil {
		return nil
	}
	l := b.limit()
	return &l
}

// parseBudget reads `budget <USD> per <duration>` (budget.Parse).
func parseBudget(d *caddyfile.Dispenser) (*Budget, error) {
	l, err := budget.Parse(d.RemainingArgs(), caddy.ParseDuration)
	if err != nil {
		return nil, d.Errf("%v", err)
	}
	return &Budget{USD: l.USD, Per: caddy.Duration(l.Per)}, nil
}

// spendings keeps the budgets' spending across config reloads, by scope:
// a reload keeps what was spent in the current window, against the budget
// it states (a raised budget lets the deployment back at once, a lowered
// one may be spent already; a new period carries it into the new
// period's window, fleet-wide in fleet mode: capacity.Spending.SetLimit).
var spendings = caddy.NewUsagePool()

type pooledSpending struct{ *capacity.Spending }

func (pooledSpending) Destruct() error { return nil }

// spending returns the pooled spending of scope under l, shared through
// the fleet store when there is one (fleet mode); nil without a budget.
func (h *Handler) spending(scope string, l *budget.Limit) (*capacity.Spending, error) {
	if l == nil {
		return nil, nil
	}
	var store capacity.SpendStore
	if h.store != nil {
		store = h.store.Store
	}
	v, _, err := spendings.LoadOrNew(scope, func() (caddy.Destructor, error) {
		return pooledSpending{capacity.NewSpending(l.Spend(), store, budget.StoreKey(scope))}, nil
	})
	if err != nil {
		return nil, err
	}
	h.spendingKeys = append(h.spendingKeys, scope)
	s := v.(pooledSpending).Spending
	s.SetLimit(l.Spend())
	s.SetStore(store)
	return s, nil
}

// provisionBudgets gives each deployment and group with a budget its
// spending, after the fleet store (which shares it).
func (h *Handler) provisionBudgets() error {
	var listings []budget.Listing
	for _, name := range h.names {
		for _, dc := range h.Models[name].Deployments {
			listings = append(listings, budget.Listing{
				Identity: h.providers[dc.Provider].ProviderSettings().identity(h.types[dc.Provider], dc.Model),
				Name:     dc.Provider + "/" + dc.Model, Group: name, Limit: limitOf(dc.Budget)})
		}
	}
	budgets, err := budget.PerDeployment(listings)
	if err != nil {
		return err
	}
	for name, g := range h.groups {
		if g.Spending, err = h.spending(budget.GroupScope(name), limitOf(h.Models[name].Budget)); err != nil {
			return err
		}
		for _, d := range g.Deployments {
			id := h.meta[d].identity
			var l *budget.Limit
			if b, ok := budgets[id]; ok {
				l = &b
			}
			if d.Spending, err = h.spending(budget.DeploymentScope(id), l); err != nil {
				return err
			}
			if d.Spending == nil {
				// A reload that removed its budget: no longer spent.
				d.State.BudgetSpent(time.Now(), time.Time{}, "")
			}
		}
	}
	return nil
}

// cleanupBudgets gives the spendings back to the pool.
func (h *Handler) cleanupBudgets() {
	for _, k := range h.spendingKeys {
		_, _ = spendings.Delete(k)
	}
	h.spendingKeys = nil
}

// groupSpending is a live model group's budget.
type groupSpending struct {
	name     string
	spending *capacity.Spending
}

// liveGroupSpendings lists the live model groups that have a budget.
func liveGroupSpendings() []groupSpending {
	live.Lock()
	defer live.Unlock()
	var out []groupSpending
	for h := range live.handlers {
		for _, name := range h.names {
			if g := h.groups[name]; g.Spending != nil {
				out = append(out, groupSpending{name, g.Spending})
			}
		}
	}
	return out
}
