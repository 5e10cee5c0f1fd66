package router

import (
	"sync/atomic"

	"github.com/llmrouter/caddy-llm-router/internal/estimate"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Request is what the router needs of one client request: the request as
// providers read it, and its size in tokens.
type Request struct {
	*provider.Request
	// Tokens estimates prompt plus max_tokens, for token windows.
	Tokens int64
	// PromptTokens and OutputTokens (max_tokens; 0 when unset) price the
	// request for the cost feature.
	PromptTokens, OutputTokens int64
	// Priority orders the request among those waiting for capacity, from
	// MinPriority to MaxPriority (higher first); see Router.Reserve.
	Priority int
	// Consumer names who is asking ("" : anonymous, one consumer of its
	// own), and Weight is its share among the consumers whose requests
	// wait in the same queue at the same priority (0: 1). The queue
	// serves them by weighted fair queueing (queue.go): each backlogged
	// consumer gets at least Weight / (sum of the backlogged weights) of
	// the requests served.
	Consumer string
	Weight   float64
	// Groups, when set, are the model groups the request may be served
	// by, by name: the group it asks for, and those of its fallback
	// groups the consumer's plan lists (its `groups`); the walk of the
	// fallback groups stops at the first it does not list. Empty: any.
	Groups []string
	// Pinned, when set, is the only deployment that may serve the request:
	// it continues state that deployment's provider account keeps (a
	// Responses previous_response_id). The request waits for it within the
	// deadline when it is cooling, and never fails over to another.
	Pinned *Deployment
	// Prefer, when set, is the deployment that served the request's
	// conversation last (affinity): taken whenever it is usable now, over
	// the ranking, so that its prompt cache stays warm.
	Prefer *Deployment
	// PreferMargin, when above 0, takes Prefer only while its score is
	// within that much of the best usable deployment's (scores are 0..1;
	// see Weights), so that a cache's savings do not outweigh capacity
	// or health: CacheMargin for a prompt-cache prefix's affinity.
	PreferMargin float64
	// NoHedge keeps the request from being hedged (HedgeAfter): the
	// provider runs what it accepts to its end whoever waits (a Responses
	// background create), so a twin would be a second job, billed too.
	NoHedge bool
	// Bound, when set, is what of the request only some deployments can
	// read (a Responses request's encrypted reasoning): see Bound.
	Bound *Bound
	// CountTokens: the request asks for a count of its prompt's tokens,
	// not an answer (Anthropic's count_tokens; Body is a Messages body,
	// Format Messages). Only a deployment whose provider is a
	// provider.TokenCounter takes it (see count.go); its attempts are
	// claimed, observed and recorded as any, and the answer ({"input_tokens":
	// n}) is passed on as the provider sent it.
	CountTokens bool
	// Keys are the client's keys of its conversation and prompt cache,
	// for the handler's affinity (see Keys).
	Keys Keys
	// unbound is set once a provider refused the bound state: every
	// attempt after it is sent the request with all of it stripped.
	unbound atomic.Bool
	// exact caches the prompt's o200k_base count (estimate.Exact), nil
	// until counted; prefixes its cache prefix (CachePrefixes), nil until
	// hashed.
	exact    atomic.Pointer[exactCount]
	prefixes atomic.Pointer[cachePrefix]
	// resume narrows the attempts of a resume's request (Stream.resume);
	// nil for a client's.
	resume *resumeSpec
}

// exactCount is a count of a prompt's tokens: n, or more than n when not
// complete (the count stopped at its limit).
type exactCount struct {
	n        int64
	complete bool
}

// The exact count decides a deployment's context-window check when the
// estimate (bytes / 4) is between exactLow and exactHigh times its window:
// bytes / 4 can be a third too high for English and code, a quarter too
// low for Chinese, and three times too high for text JSON escapes
// ("\u4e2d"); outside those bounds the estimate decides alone.
const (
	exactLow  = 0.7
	exactHigh = 4.0
)

// fitsContext reports whether the request fits d's context window: by
// the exact count of its tokenizer for a model that counts with
// o200k_base near its window, else by the estimate. A window of 0
// (unknown) takes anything; when the count cannot be made (others are
// under way), the request is sent: the provider's own context_length
// answer fails it over.
func (req *Request) fitsContext(d *Deployment) bool {
	w := d.ContextWindow
	switch {
	case w <= 0:
		return true
	case req.OutputTokens >= w:
		return false
	case !d.ExactTokens || float64(req.Tokens) <= exactLow*float64(w):
		return req.Tokens <= w
	case float64(req.Tokens) > exactHigh*float64(w):
		return false
	}
	limit := w - req.OutputTokens
	c := req.exact.Load()
	if c == nil || !c.complete && c.n <= limit {
		if d.State.Disabled() {
			return true // left out anyway: not worth a count
		}
		n, complete, ok := estimate.Exact(req.Body, limit)
		if !ok {
			return true
		}
		c = &exactCount{n: n, complete: complete}
		req.exact.Store(c)
	}
	return c.complete && c.n <= limit
}
