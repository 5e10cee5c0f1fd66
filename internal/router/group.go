package router

import (
	"cmp"
	"context"
	"iter"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Serve answers req from a group of deployments served once (its queue
// holds only this request): see ServeGroup.
func (r *Router) Serve(ctx context.Context, group []*Deployment, req *Request) *Result {
	return r.ServeGroup(ctx, &Group{Deployments: group}, req)
}

// ServeGroup answers req from g, trying the best-ranked usable deployment
// first, with failover. When no deployment has capacity it waits in g's
// queue for its turn (see queue). It spends no more than MaxAttempts
// attempts (certain refusals spend none) and never waits past the
// deadline: when every deployment is cooling past it, or its place in the
// queue cannot be served before it, it answers at once, with Retry-After
// set to when it could be; or, when g has a Fallback, goes on to that
// group (and its fallback, in turn) with what is left of the deadline and
// the attempts. A deployment that failed the request is tried again only
// when no other deployment of g, and no fallback group, is left.
func (r *Router) ServeGroup(ctx context.Context, g *Group, req *Request) *Result {
	res := &Result{lastEnd: r.Clock.Now()}
	deadline := res.lastEnd.Add(r.Deadline)
	var pending, prior *outcome // of the group before: its last failed attempt, if not yet logged; its last failed one
	var best Result             // the failure to answer with if no group serves (betterFailure)
	tooLarge := true            // every group failed for the prompt's size
	var perBuf [16]attemptState // what the request learned of each deployment of the group it is at
	for hop := range req.chain(g) {
		if !req.servedByAny(hop.Deployments) && (hop != g || req.servedByChain(g)) {
			continue // a group that cannot take the request's API at all (embeddings to Anthropic)
		}
		clear(perBuf[:])
		w := walk{per: perBuf[:min(len(hop.Deployments), len(perBuf))], minContext: -1, pending: pending, prior: prior}
		if len(hop.Deployments) > len(perBuf) {
			w.per = make([]attemptState, len(hop.Deployments))
		}
		if res.Group != nil {
			r.debug("falling back to another model group", zap.String("from", res.Group.Name), zap.String("to", hop.Name),
				zap.Int("attempts", res.Attempts))
			*res = Result{Attempts: res.Attempts, FailoverReason: res.FailoverReason, lastEnd: res.lastEnd, refused: res.refused}
		}
		r.serve(ctx, hop, req, res, &w, deadline)
		res.Group = hop
		pending, w.pending = w.pending, nil
		prior = cmp.Or(w.last, w.prior)
		if !fallsBack(res) {
			break // an answer, or one no other group would change
		}
		tooLarge = tooLarge && failedForSize(res)
		if best.Group == nil || betterFailure(res, &best) {
			best = *res
		}
		if hop.Fallback == nil || !r.attemptsLeft(res) || ctx.Err() != nil || !r.Clock.Now().Before(deadline) {
			break
		}
	}
	r.logPending(&walk{pending: pending}, nil) // a failed attempt no other followed
	if res.Stream != nil {
		res.Stream.prepareResume(ctx, req, res.Attempts)
	}
	tried := res.Group
	if best.Group != nil && fallsBack(res) {
		attempts, reason := res.Attempts, res.FailoverReason
		*res = best
		res.Attempts, res.FailoverReason = attempts, reason
	}
	res.Tried = tried
	if e, ok := res.Err.(*Error); ok && tooLarge && e.Class == provider.ContextLength && g.Fallback != nil {
		// Too large for every group of the chain: say so of them all.
		largest := int64(0)
		for hop := range req.chain(g) {
			for _, d := range hop.Deployments {
				if req.servedBy(d) {
					largest = max(largest, d.ContextWindow)
				}
			}
		}
		e.Message = contextMessage(req, "this model or its fallback groups", largest)
	}
	return res
}

// failedForSize reports whether a group's failure was the prompt's size:
// the context pre-check's 400, or a provider's context_length passed on.
func failedForSize(res *Result) bool {
	if e, ok := res.Err.(*Error); ok {
		return e.Class == provider.ContextLength
	}
	return res.Error != nil && res.Error.Class == provider.ContextLength
}

// betterFailure reports whether a group's failure a tells the client more
// than b, an earlier group's: one to retry (a 429, a 502, a 504) over one
// that refuses the request as it is (a 400: too large for that group,
// or not expressible there), since the earlier group would take it later;
// among those to retry, the one with the earlier Retry-After. Otherwise
// the earlier group's stands.
func betterFailure(a, b *Result) bool {
	retry := func(res *Result) (bool, time.Duration) {
		if e, ok := res.Err.(*Error); ok && e.Status >= 429 && e.Status != http.StatusNotImplemented {
			return true, e.RetryAfter
		}
		return false, 0
	}
	ra, wa := retry(a)
	rb, wb := retry(b)
	switch {
	case ra != rb:
		return ra
	case !ra:
		return false
	}
	return wa > 0 && (wb <= 0 || wa < wb)
}

// MaxFallbacks is the most fallback groups one request goes through (the
// config refuses longer chains and cycles; this keeps a group built by hand
// from looping).
const MaxFallbacks = 16

// fallsBack reports whether a group's answer lets its fallback group try:
// none of its deployments could serve the request (rate-limited, failing,
// out of time for it, its context too small, unable to express it), as
// opposed to an answer, a client that left, or a request the provider
// refused as it is.
func fallsBack(res *Result) bool {
	switch _, ok := res.Err.(*Error); { // the router's own errors are never wrapped
	case ok:
		return true
	case res.Err != nil:
		return false // the client went away
	case res.Error != nil:
		return res.Error.Class == provider.ContextLength // a larger model may take it
	}
	return false
}

// fallbackLeft reports whether the walk of g may go on to g's fallback
// group when g has nothing better left for req: whether that group, or one
// after it, has a deployment that serves req's format and may take it
// before its deadline (a fallback cooling past it is no way out). A
// request pinned to one deployment, or a resume's (it stays in the
// stream's group), has none.
func fallbackLeft(g *Group, req *Request, need capacity.Need, now, deadline time.Time) bool {
	if g.Fallback == nil || req.Pinned != nil || req.resume != nil {
		return false
	}
	var f capacity.Features
	for hop := range req.chain(g) {
		if hop == g {
			continue
		}
		if over, _ := hop.Spending.Over(now); over {
			continue
		}
		for _, d := range hop.Deployments {
			if !req.servedBy(d) || !req.fitsContext(d) {
				continue
			}
			d.stateFor(req).ReadFeaturesFor(&f, now, need, req.Stream)
			if !f.Disabled && !f.TooLarge && f.At.Before(deadline) {
				return true
			}
		}
	}
	return false
}

// Serves reports whether the group, or one of its fallback groups, has a
// deployment that serves requests in format f at all.
func (g *Group) Serves(f provider.Format) bool {
	for hop := range g.Chain() {
		if Serves(hop.Deployments, f) {
			return true
		}
	}
	return false
}

// Chain yields g, then its fallback groups in turn, MaxFallbacks of them
// at most.
func (g *Group) Chain() iter.Seq[*Group] {
	return func(yield func(*Group) bool) {
		for hop, hops := g, 0; hop != nil && hops <= MaxFallbacks; hop, hops = hop.Fallback, hops+1 {
			if !yield(hop) {
				return
			}
		}
	}
}

// chain yields g, then those of its fallback groups (Chain) that req may
// be served by (Request.Groups): up to the first it may not.
func (req *Request) chain(g *Group) iter.Seq[*Group] {
	return func(yield func(*Group) bool) {
		for hop := range g.Chain() {
			if hop != g && len(req.Groups) > 0 && !slices.Contains(req.Groups, hop.Name) {
				return
			}
			if !yield(hop) {
				return
			}
		}
	}
}

// Serves reports whether some deployment of group serves requests in
// format f at all (see provider.Provider.Serves).
func Serves(group []*Deployment, f provider.Format) bool {
	for _, d := range group {
		if d.Provider.Serves(f) {
			return true
		}
	}
	return false
}
