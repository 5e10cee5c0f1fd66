package router

import (
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// tierOf is d's tier, 1 when unset.
func tierOf(d *Deployment) int { return max(d.Tier, 1) }

// tiered narrows the candidates to the lowest tier that can serve the
// request before its deadline, with the lower tiers (which cannot, and
// stay for the answer): a deployment of tier n+1 is tried only when none
// of tier n or lower can. A tier can serve when one of its deployments
// (or a lower tier's) comes back before the deadline, early enough that
// its answer and a failover after it still fit (its own latency, and twice
// the fastest known latency above the tier, for the spread of answer
// times), and the known windows forecast room for the request's place in
// the queue; a tier
// whose deployments all cool down after failures, or failed this request,
// cannot (a higher tier is not kept waiting for a retry that may fail
// again). When no
// tier can, every candidate stays, for the 429 or 502 it makes. A group of
// one tier costs one pass.
func (r *Router) tiered(g *Group, cands []scored, per []attemptState, me *waiter, req *Request, need capacity.Need, now, deadline time.Time) []scored {
	group := g.Deployments
	lowest, highest := tierOf(group[cands[0].i]), tierOf(group[cands[0].i])
	for _, c := range cands[1:] {
		t := tierOf(group[c.i])
		lowest, highest = min(lowest, t), max(highest, t)
	}
	if lowest == highest {
		return cands
	}
	// Its place: those before it when it waits, every waiting request
	// when it has not joined the queue yet (it would join behind them),
	// but those waiting for capacity it does not share (placeOf).
	ahead, tokensAhead := g.placeOf(me, req)
	for t := lowest; t < highest; t = nextTier(group, cands, t) {
		// The candidates of tier t or lower, to the front.
		k := 0
		for j := range cands {
			if tierOf(group[cands[j].i]) <= t {
				cands[k], cands[j] = cands[j], cands[k]
				k++
			}
		}
		if canServe(group, cands[:k], cands[k:], per, ahead, tokensAhead, req, need, now, deadline) {
			return cands[:k]
		}
	}
	return cands
}

// canServe reports whether sub, a part of the candidates (a tier and those
// below it, the deployments that read a request's bound state), can serve
// the request before its deadline without the rest: one of them comes back
// early enough that its answer and a failover to the rest after it still
// fit (its own latency, and twice the fastest known latency of the rest),
// they do not all cool down after failures (recovering), and the known
// windows forecast room for the request's place in the queue (ahead
// requests of tokensAhead tokens before it).
func canServe(group []*Deployment, sub, rest []scored, per []attemptState, ahead, tokensAhead int64, req *Request, need capacity.Need, now, deadline time.Time) bool {
	back := earliest(sub)
	if !back.f.At.Add(seconds(back.f.Latency)+2*failoverTime(rest)).Before(deadline) || recovering(sub, per, now) {
		return false
	}
	enough, _ := forecast(group, sub, ahead+1, tokensAhead+req.Tokens, need.Reserve, now, deadline, false)
	return enough
}

// failoverTime is the fastest known latency of cands (the higher tiers),
// 0 when none is known: what a failover to them takes, on average.
func failoverTime(cands []scored) time.Duration {
	fastest := 0.0
	for _, c := range cands {
		if l := c.f.Latency; l > 0 && (fastest == 0 || l < fastest) {
			fastest = l
		}
	}
	return seconds(fastest)
}

// seconds is a latency EWMA (seconds) as a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

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

// recovering reports whether none of cands is usable at now and each
// cools down after failures (a server error, a timeout), not for capacity,
// or failed this very request (per: a 429 despite what it stated is no
// capacity to plan on): a retry of them may fail again, so a request that
// has somewhere else to go (a higher tier, a fallback group) goes there
// rather than waiting.
func recovering(cands []scored, per []attemptState, now time.Time) bool {
	for _, c := range cands {
		switch cooling := c.f.At.After(now); {
		case !cooling:
			return false // usable now
		case per[c.i].tried:
			// it failed this request: not worth waiting for
		case !c.f.Why.Failure(), c.f.Why == provider.RateLimited, c.f.Why == provider.QuotaExhausted:
			return false // busy or limited: capacity the planner waits for
		}
	}
	return len(cands) > 0
}
