package router

import (
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// tierOf is d's tier, 1 when unset.
func tierOf(d *Deployment) int { return max(d.Tier, 1) }

// tiered narrows the candidates to the lowest tier that can serve the
// request before its deadline, with the lower tiers (which cannot, and
// stay for the answer): a deployment of tier n+1 is tried only when none
// of tier n or lower can. A tier can serve when one of its deployments
// (or a lower tier's) comes back before the deadline and the known
// windows forecast room for the request's place in the queue. When no
// tier can, every candidate stays, for the 429 or 502 it makes. A group of
// one tier costs one pass.
func (r *Router) tiered(g *Group, cands []scored, me *waiter, req *Request, need capacity.Need, now, deadline time.Time) []scored {
	group := g.Deployments
	lowest, highest := tierOf(group[cands[0].i]), tierOf(group[cands[0].i])
	for _, c := range cands[1:] {
		t := tierOf(group[c.i])
		lowest, highest = min(lowest, t), max(highest, t)
	}
	if lowest == highest {
		return cands
	}
	var ahead, tokensAhead int64
	if me != nil {
		ahead, tokensAhead = g.queue.place(me)
	}
	for t := lowest; t < highest; t = nextTier(group, cands, t) {
		// The candidates of tier t or lower, to the front.
		k := 0
		for j := range cands {
			if tierOf(group[cands[j].i]) <= t {
				cands[k], cands[j] = cands[j], cands[k]
				k++
			}
		}
		sub := cands[:k]
		if earliest(sub).f.At.Before(deadline) {
			if enough, _ := forecast(group, sub, ahead+1, tokensAhead+req.Tokens, need.Reserve, now, deadline); enough {
				return sub
			}
		}
	}
	return cands
}

// nextTier is the lowest tier of the candidates above t.
func nextTier(group []*Deployment, cands []scored, t int) int {
	next := 0
	for _, c := range cands {
		if ct := tierOf(group[c.i]); ct > t && (next == 0 || ct < next) {
			next = ct
		}
	}
	return next
}
