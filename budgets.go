package llmrouter

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

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
	switch {
	case !(b.USD > 0) || !finite(b.USD):
		return fmt.Errorf("budget must be more than 0 USD, got %v", b.USD)
	case time.Duration(b.Per) < time.Second:
		return fmt.Errorf("budget period must be at least 1s, got %s", time.Duration(b.Per))
	}
	return nil
}

func (b *Budget) limit() capacity.SpendLimit {
	return capacity.SpendLimit{USD: b.USD, Period: time.Duration(b.Per)}
}

// parseBudget reads `budget <USD> per <duration>` ("$5" is 5); the
// model group's or the deployment's validate bounds it.
func parseBudget(d *caddyfile.Dispenser) (*Budget, error) {
	args := d.RemainingArgs()
	if len(args) != 3 || args[1] != "per" {
		return nil, d.Err("budget takes <USD> per <duration>, such as: budget 50 per 24h")
	}
	usd, err := strconv.ParseFloat(strings.TrimPrefix(args[0], "$"), 64)
	if err != nil {
		return nil, d.Errf("budget: %q is not an amount of USD", args[0])
	}
	per, err := caddy.ParseDuration(args[2])
	if err != nil {
		return nil, d.Errf("budget: bad duration %q: %v", args[2], err)
	}
	return &Budget{USD: usd, Per: caddy.Duration(per)}, nil // validate bounds it
}

// spendings keeps the budgets' spending across config reloads, by scope:
// a reload keeps what was spent in the current window, against the budget
// it states (a raised budget lets the deployment back at once, a lowered
// one may be spent already; a new period starts a new window).
var spendings = caddy.NewUsagePool()

type pooledSpending struct{ *capacity.Spending }

func (pooledSpending) Destruct() error { return nil }

// spending returns the pooled spending of scope under b, shared through
// the fleet store when there is one (fleet mode); nil without a budget.
func (h *Handler) spending(scope string, b *Budget) (*capacity.Spending, error) {
	if b == nil {
		return nil, nil
	}
	key := scope
	var store capacity.SpendStore
	if h.store != nil {
		store = h.store.Store
	}
	v, _, err := spendings.LoadOrNew(key, func() (caddy.Destructor, error) {
		return pooledSpending{capacity.NewSpending(b.limit(), store, "budget:"+scope)}, nil
	})
	if err != nil {
		return nil, err
	}
	h.spendingKeys = append(h.spendingKeys, key)
	s := v.(pooledSpending).Spending
	s.SetLimit(b.limit())
	s.SetStore(store)
	return s, nil
}

// provisionBudgets gives each deployment and group with a budget its
// spending, after the fleet store (which shares it).
func (h *Handler) provisionBudgets() error {
	// One deployment (account and model), one budget: it may be listed in
	// several groups, without a budget or with the same one.
	budgets := map[string]*Budget{}
	where := map[string]string{}
	for _, name := range h.names {
		for _, dc := range h.Models[name].Deployments {
			id := h.providers[dc.Provider].ProviderSettings().identity(h.types[dc.Provider], dc.Model)
			if b := dc.Budget; b != nil {
				if prev, ok := budgets[id]; ok && *prev != *b {
					return fmt.Errorf("deployment %s/%s has two budgets (in model %s and model %s): give it one", dc.Provider, dc.Model, where[id], name)
				}
				budgets[id], where[id] = b, name
			}
		}
	}
	for name, g := range h.groups {
		mg := h.Models[name]
		var err error
		if g.Spending, err = h.spending("group|"+name, mg.Budget); err != nil {
			return err
		}
		for _, d := range g.Deployments {
			if d.Spending, err = h.spending("deployment|"+h.meta[d].identity, budgets[h.meta[d].identity]); err != nil {
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
