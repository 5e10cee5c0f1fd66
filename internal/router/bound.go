package router

import (
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Bound is what of a request only some deployments can read: state that
// one provider organization minted and alone can decrypt (a Responses
// request's reasoning items with encrypted_content, its compaction items).
// The router knows no organization; it asks Bound:
//
//   - the deployments that can read it (Reads) take the request while one
//     of them can serve it before its deadline, as a lower tier does (see
//     tiered), over the ranking;
//   - any other is sent the request without what it cannot read (Strip),
//     so that the request is served rather than refused;
//   - a provider's refusal of what it could not read (Refused: an item the
//     router never saw minted) is not passed on: the request is sent once
//     more, elsewhere first, with all of it stripped.
type Bound struct {
	// Reads reports whether d can read all of it (a deployment of the
	// organization that minted it); nil when none is known to.
	Reads func(d *Deployment) bool
	// Strip returns body (the request's, or a resume's continuation of it)
	// without what d is known not to read, or, when all is set, without any
	// of it; and whether it removed anything (body itself when not).
	Strip func(body []byte, d *Deployment, all bool) ([]byte, bool)
	// Refused reports whether a provider's client error says it could not
	// read it (OpenAI's 400 invalid_encrypted_content).
	Refused func(obs provider.Observation) bool
}

// forDeployment is the request as d is sent it: without what of its
// Bound d cannot read (all of it once a provider refused some).
func (req *Request) forDeployment(d *Deployment) *provider.Request {
	b := req.Bound
	if b == nil || b.Strip == nil {
		return req.Request
	}
	if body, stripped := b.Strip(req.Body, d, req.unbound.Load()); stripped {
		return req.Request.WithBody(body)
	}
	return req.Request
}

// refusedBound reports whether out is a provider's refusal of the
// request's bound state that the request has not met yet: from then on
// every attempt is sent the request with all of it stripped (once; a
// second refusal is passed on).
func (req *Request) refusedBound(out *outcome) bool {
	b := req.Bound
	if b == nil || b.Refused == nil || b.Strip == nil || !b.Refused(out.obs) {
		return false
	}
	return req.unbound.CompareAndSwap(false, true)
}

// readers narrows the candidates to the deployments that can read the
// request's bound state (Bound.Reads) when one of them can serve it before
// its deadline (canServe, as for a tier); else they all stay, and the
// others are sent the request stripped (forDeployment). Once a provider
// refused the bound state, nothing is known to read it: all stay.
func (r *Router) readers(g *Group, cands []scored, per []attemptState, me *waiter, req *Request, need capacity.Need, now, deadline time.Time) []scored {
	b := req.Bound
	if b == nil || b.Reads == nil || req.unbound.Load() {
		return cands
	}
	k := 0
	for j := range cands {
		if b.Reads(g.Deployments[cands[j].i]) {
			cands[k], cands[j] = cands[j], cands[k]
			k++
		}
	}
	if k == 0 || k == len(cands) {
		return cands
	}
	ahead, tokensAhead := g.placeOf(me, req)
	if canServe(g.Deployments, cands[:k], cands[k:], per, ahead, tokensAhead, req, need, now, deadline) {
		return cands[:k]
	}
	return cands
}
