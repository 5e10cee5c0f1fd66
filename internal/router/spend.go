package router

import (
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Spend records what an answer of d, for group g (nil: none), used when
// the router learns it outside an attempt (a background response's usage,
// at the poll that finds it done): in d's usage and, at its cost, against
// d's budget and g's, as spend does, with nothing held.
func (r *Router) Spend(d *Deployment, g *Group, u provider.Usage) {
	r.spend(r.Clock.Now(), d, g, u, holds{})
}

// spend records what an answer of d, for group g, used: in d's usage and,
// at its cost, against d's budget and g's, settling what the attempt held
// of them (h); a deployment whose budget it spends is out until that
// renews.
func (r *Router) spend(now time.Time, d *Deployment, g *Group, u provider.Usage, h holds) {
	cost := d.Cost(u)
	d.State.RecordUsage(now, u, cost)
	if d.Spending != nil {
		d.Spending.Settle(now, h.d, cost)
		r.checkBudget(d, now)
	}
	if g != nil && g.Spending != nil {
		was, _ := g.Spending.Over(now)
		if over, until := g.Spending.Settle(now, h.g, cost); over && !was {
			r.Logger.Warn("model group budget spent: its requests are answered 429 until it renews",
				zap.String("group", g.Name), zap.String("budget", capacity.BudgetMessage(g.Spending.Limit(), until)))
		}
	}
}

// chargeLeft spends what a non-stream attempt the router left before
// its answer (its client gone, its deadline past, a hedge's loser) is
// charged, as a stream left so is (Stream.charge): its prompt and
// max_tokens (out.left). Its provider billed the prompt and may have
// generated on (PROVIDERS.md: Billing).
func (r *Router) chargeLeft(res *Result, out *outcome) {
	if out.stream == nil && out.left != (provider.Usage{}) {
		r.spend(r.Clock.Now(), out.d, out.group, out.left, out.holds)
		res.others = append(res.others, Leg{Deployment: out.d, Usage: out.left})
	}
}

// checkBudget tells d's State whether its budget is spent at now (it may
// have been raised by a reload, or spent by another instance of a fleet),
// and logs the moment it becomes spent. A deployment without a budget has
// nothing to check (the config that removed one cleared it at load).
func (r *Router) checkBudget(d *Deployment, now time.Time) {
	if d.Spending == nil {
		return
	}
	over, until := d.Spending.Over(now)
	if !over {
		d.State.BudgetSpent(now, time.Time{}, "")
		return
	}
	msg := capacity.BudgetMessage(d.Spending.Limit(), until)
	if d.State.BudgetSpent(now, until, msg) {
		r.Logger.Warn("deployment budget spent: it is skipped until it renews", zap.String("deployment", d.Name), zap.String("budget", msg))
	}
}
