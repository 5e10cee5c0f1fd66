package router

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Deployment is a provider x an upstream model: the unit that is ranked,
// rate-limited and failed over.
type Deployment struct {
	// Name identifies the deployment to clients and operators:
	// "<provider>/<upstream model>".
	Name string
	// Model is the upstream model name the provider is asked for.
	Model string
	// Provider is the configured account that plans each attempt and
	// decodes each answer.
	Provider provider.Provider
	// Transport performs the upstream exchange (Caddy's HTTP transport).
	Transport http.RoundTripper
	// Timeout bounds one non-streaming attempt until its body is read; 0:
	// the request's deadline alone (DefaultTimeout).
	Timeout time.Duration
	// TTFTTimeout bounds a streaming attempt until its first content.
	TTFTTimeout time.Duration
	// IdleTimeout bounds the silence between two events of a stream.
	IdleTimeout time.Duration
	// Spending is the deployment's budget and what its answers spent (nil:
	// none): once spent, the deployment is out until it renews, as a spent
	// quota.
	Spending *capacity.Spending
	// ProviderType is the provider's type ("openai", "bedrock", ...), for
	// traces' gen_ai.provider.name when the type states none
	// (provider.TraceNamer).
	ProviderType string
	// CostInput and CostOutput are USD per 1M tokens; 0 = unknown.
	// CostCached is the price of input tokens read from the prompt cache
	// (USD per 1M tokens).
	CostInput, CostOutput, CostCached float64
	// CostCacheWrite and CostCacheWrite1h are the prices of input tokens
	// written to the prompt cache, to its 5-minute and its one-hour
	// lifetime (USD per 1M tokens).
	CostCacheWrite, CostCacheWrite1h float64
	// Quality is the operator's judgment, 0..1.
	Quality float64
	// ContextWindow is the largest prompt plus output, in tokens; 0 = unknown.
	ContextWindow int64
	// ExactTokens: the model counts with o200k_base (estimate.O200k), so
	// the context-window check may count the prompt exactly.
	ExactTokens bool
	// Weight shares the traffic among near-tied deployments, in proportion
	// (see pick); at least 1.
	Weight int
	// Tier orders the group: a deployment of tier n+1 is tried only when
	// none of tier n or lower can serve the request before its deadline
	// (see tiered); 0 counts as 1.
	Tier int
	// State is the deployment's capacity state, shared across requests and
	// config reloads.
	State *capacity.State
	// CountState, when set, is the capacity state of its count_tokens
	// requests (Request.CountTokens): Anthropic's token counting has rate
	// limits of its own, separate from message creation's
	// (docs.anthropic.com, "Token counting"), so a count's 429 and its
	// headers speak of the counts alone, and neither cool nor re-window
	// State. nil: counts share State.
	CountState *capacity.State
	// Secrets are values that must never leave the router (the provider's
	// key): where a provider's answer echoes one (an error naming the key it
	// got), whole or masked, it is redacted from what the router logs, keeps
	// and passes on, whatever its length (see package redact for the rules).
	Secrets []string

	// refusesPrefill is learned: the deployment refused a resume's
	// continuation as a model without prefill (see prefillRefusal), so it
	// is not asked for another (a replay it may still serve). It lasts as
	// long as the Deployment: a config reload makes it anew.
	refusesPrefill atomic.Bool
}

// stateFor is the capacity state req's attempts on d claim and observe:
// CountState for a count of tokens (when set), else State.
func (d *Deployment) stateFor(req *Request) *capacity.State {
	if req.CountTokens && d.CountState != nil {
		return d.CountState
	}
	return d.State
}

// Cost is what an answer that used u cost on d, in USD, as its provider
// bills it: the input tokens read from the prompt cache at CostCached,
// those written to it at CostCacheWrite (its one-hour lifetime at
// CostCacheWrite1h), the rest of the input at CostInput, and the output
// tokens at CostOutput, all per 1M tokens. The parts are bounded by the
// whole: a provider's garbage never prices a token twice. Rounded to
// capacity.USDResolution.
func (d *Deployment) Cost(u provider.Usage) float64 {
	input := max(u.InputTokens, 0)
	cached := min(max(u.CachedInputTokens, 0), input)
	written := min(max(u.CacheWriteTokens, 0), input-cached)
	hour := min(max(u.CacheWrite1hTokens, 0), written)
	return capacity.RoundUSD((float64(input-cached-written)*d.CostInput + float64(cached)*d.CostCached +
		float64(written-hour)*d.CostCacheWrite + float64(hour)*d.CostCacheWrite1h +
		float64(max(u.OutputTokens, 0))*d.CostOutput) / 1e6)
}
