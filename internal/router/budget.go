package router

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/period"
	"github.com/llmrouter/caddy-llm-router/provider"
	"go.uber.org/zap"
)

// DefaultBudgetOutputTokens is the output a request that sets no
// max_tokens (max_completion_tokens, max_output_tokens) is held for against
// a budget: what a long answer of a current model runs to. Its answer
// settles the hold at what it really cost.
const DefaultBudgetOutputTokens = 4096

// worstCost is the most req is expected to cost on d, in USD, and what an
// attempt holds of the budgets it is under: its prompt estimate at
// CostInput plus its max_tokens (DefaultBudgetOutputTokens when unset) at
// CostOutput, per 1M tokens; no more output than d's context window
// leaves after the prompt, when it is known (a max_tokens of 2^31 is not
// what the model can write).
func worstCost(d *Deployment, req *Request) float64 {
	out := req.OutputTokens
	if out <= 0 {
		out = DefaultBudgetOutputTokens
	}
	if d.ContextWindow > 0 {
		out = min(out, max(d.ContextWindow-req.PromptTokens, 0))
	}
	return (float64(req.PromptTokens)*d.CostInput + float64(out)*d.CostOutput) / 1e6
}

// WorstCost is the most req may cost on any deployment of g, or of the
// fallback groups it may use, that can take it (worstCost: its prompt
// estimate and max_tokens at the deployment's prices), in USD: what a
// consumer's budget holds of it until its answer is known. 0 when none
// has prices.
func (g *Group) WorstCost(req *Request) float64 {
	usd := 0.0
	for hop := range req.chain(g) {
		for _, d := range hop.Deployments {
			if req.servedBy(d) {
				usd = max(usd, worstCost(d, req))
			}
		}
	}
	return usd
}

// holds are an attempt's holds on the budgets it is under, its
// deployment's and its group's (nil: none), settled by spend with what
// its answer cost or given back by release.
type holds struct{ d, g *capacity.Hold }

// release gives back what the attempt still holds: it spent nothing (a
// refusal, a failure, an answer that stated no usage).
func (h holds) release(now time.Time, d *Deployment, g *Group) {
	if h.d != nil {
		d.Spending.Settle(now, h.d, 0)
	}
	if h.g != nil && g != nil {
		g.Spending.Settle(now, h.g, 0)
	}
}

// budgetRefusal is a budget with no room for an attempt's hold: whose
// (a deployment's, the group's) and when it renews.
type budgetRefusal struct {
	group    bool
	scope    string // "model group <name>", "deployment <name>"
	spending *capacity.Spending
	usd      float64 // the hold refused
	until    time.Time
}

// never reports whether the hold is larger than the whole budget: no
// renewal lets it through.
func (b *budgetRefusal) never() bool { return b.usd > b.spending.Limit().USD }

// error is the refusal as the client is told it: 429 quota_exhausted,
// naming the budget, with Retry-After until it renews; a hold larger than
// the whole budget is a 400 that says so, with no Retry-After (no wait
// lets it through: a smaller max_tokens may).
func (b *budgetRefusal) error(now time.Time) *Error {
	if b.never() {
		l := b.spending.Limit()
		return &Error{Status: http.StatusBadRequest, Class: provider.ClientError, Message: b.scope + ": this request's worst case of $" +
			strconv.FormatFloat(b.usd, 'f', 6, 64) + " (its prompt, and max_tokens or " + strconv.Itoa(DefaultBudgetOutputTokens) +
			" output tokens when it sets none) is more than the whole budget of $" + strconv.FormatFloat(l.USD, 'f', -1, 64) +
			" per " + period.String(l.Period) + "; no renewal lets it through: set a smaller max_tokens"}
	}
	msg := capacity.BudgetMessage(b.spending.Limit(), b.until)
	if over, _ := b.spending.Over(now); !over {
		l := b.spending.Limit()
		msg = "budget of $" + strconv.FormatFloat(l.USD, 'f', -1, 64) + " per " + period.String(l.Period) +
			" has no room left for this request's worst case of $" + strconv.FormatFloat(b.usd, 'f', 6, 64) +
			" (its prompt and max_tokens; it renews at " + b.until.UTC().Format("2006-01-02 15:04:05") + " UTC)"
	}
	return &Error{Status: http.StatusTooManyRequests, Class: provider.QuotaExhausted, Message: b.scope + ": " + msg,
		RetryAfter: max(b.until.Sub(now), time.Second)}
}

// hold holds req's worst case on d (worstCost) against d's budget and
// g's before the attempt is sent; a refusal says which budget has no
// room (nothing is held then).
func (r *Router) hold(d *Deployment, g *Group, req *Request, now time.Time) (holds, *budgetRefusal) {
	usd := worstCost(d, req)
	dh, ok, until := d.Spending.Hold(now, usd)
	if !ok {
		return holds{}, &budgetRefusal{scope: "deployment " + d.Name, spending: d.Spending, usd: usd, until: until}
	}
	gh, ok, until := g.Spending.Hold(now, usd)
	if !ok {
		holds{d: dh}.release(now, d, g)
		return holds{}, &budgetRefusal{group: true, scope: "model group " + g.Name, spending: g.Spending, usd: usd, until: until}
	}
	return holds{d: dh, g: gh}, nil
}

// groupBudget tells a request at once that g's budget cannot hold it
// now (the cheapest worst case of g's deployments that serve its format
// does not fit) when the budget renews after its deadline or a fallback
// group may serve it. A request it may fit after the renewal goes on (and
// waits for it, waitBudget).
func (r *Router) groupBudget(g *Group, req *Request, need capacity.Need, now, deadline time.Time) *Error {
	if g.Spending == nil {
		return nil
	}
	usd := -1.0
	for _, d := range g.Deployments {
		if c := worstCost(d, req); req.servedBy(d) && (usd < 0 || c < usd) {
			usd = c
		}
	}
	fits, until := g.Spending.Fits(now, max(usd, 0))
	b := &budgetRefusal{group: true, scope: "model group " + g.Name, spending: g.Spending, usd: usd, until: until}
	if fits || until.Before(deadline) && !b.never() && !fallbackLeft(g, req, need, now, deadline) {
		return nil
	}
	return b.error(now)
}

// waitBudget holds a request whose hold g's budget refused: told at once
// when the budget renews after its deadline or a fallback group may serve
// it (the group's error lets it go on there), else waiting in g's queue
// (joining it) until the renewal, or until an attempt under way gives
// back what it held (its queue is woken then).
func (r *Router) waitBudget(ctx context.Context, g *Group, me **waiter, req *Request, need capacity.Need, b *budgetRefusal, now, deadline time.Time) error {
	if !b.until.Before(deadline) || b.never() || fallbackLeft(g, req, need, now, deadline) {
		return b.error(now)
	}
	if *me == nil {
		var limit int
		if *me, limit = r.joinQueue(g, req, nil, need, now, deadline); *me == nil {
			e := queueFullError(g, nil, limit, now)
			e.RetryAfter = max(b.until.Sub(now), time.Second)
			return e
		}
	}
	r.debug("waiting for the group's budget to renew", zap.String("group", g.Name), zap.Time("renews", b.until))
	return (*me).sleep(ctx, r.Clock, b.until.Sub(now))
}
