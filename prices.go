package llmrouter

import (
	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// Prompt-cache prices as the providers publish them, in multiples of the
// model's input price (CostInput). A deployment's cost_cached_input,
// cost_cache_write and cost_cache_write_1h set its own; unset, these
// apply by the family of its model:
//
//   - Claude (provider types anthropic, bedrock with an "anthropic." model,
//     vertex with a "claude" or publishers/anthropic model): cache reads
//     0.1x, 5-minute writes 1.25x, 1-hour writes 2x
//     (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching#pricing;
//     Bedrock and Vertex bill Claude alike:
//     https://aws.amazon.com/bedrock/pricing/,
//     https://cloud.google.com/vertex-ai/generative-ai/pricing).
//   - Gemini (gemini, vertex with a Google model): cached tokens at the
//     context-caching price, 0.1x for Gemini 2.5 and later
//     (https://ai.google.dev/gemini-api/docs/pricing); the storage price
//     per hour of an explicit cache is no answer's and is not counted.
//     Writes cost the input price.
//   - Every other (openai, azure, Converse models, OpenAI-compatible
//     servers): no write premium (OpenAI caches for free:
//     https://platform.openai.com/docs/guides/prompt-caching), and cached
//     input at cost_cached_input, else at cost_input: OpenAI's cached price
//     is per model (0.5x for gpt-4o, 0.25x for gpt-4.1, 0.1x for gpt-5:
//     https://platform.openai.com/docs/pricing), so the router takes the
//     bound none exceeds and never counts a budget short.
const (
	claudeCacheRead    = 0.1
	claudeCacheWrite   = 1.25
	claudeCacheWrite1h = 2
	geminiCacheRead    = 0.1
)

// setPrices sets d's prices of prompt-cache reads and writes: dc's own,
// else the defaults of its provider type typ and model.
func setPrices(d *router.Deployment, typ string, dc *Deployment) {
	read, write, write1h := 1.0, 1.0, 1.0
	switch modelFamily(typ, dc.Model) {
	case "claude":
		read, write, write1h = claudeCacheRead, claudeCacheWrite, claudeCacheWrite1h
	case "gemini":
		read = geminiCacheRead
	}
	price := func(set *float64, times float64) float64 {
		if set != nil {
			return *set
		}
		return dc.CostInput * times
	}
	d.CostCached = price(dc.CostCachedInput, read)
	d.CostCacheWrite = price(dc.CostCacheWrite, write)
	d.CostCacheWrite1h = price(dc.CostCacheWrite1h, write1h)
}

// modelFamily names the family whose cache prices a deployment of
// provider type typ and model bills by: "claude", "gemini" or "".
func modelFamily(typ, model string) string {
	switch {
	case typ == "anthropic", typ == "bedrock" && adapters.BedrockAnthropic(model),
		typ == "vertex" && adapters.VertexPublisher(model) == "anthropic":
		return "claude"
	case typ == "gemini", typ == "vertex" && adapters.VertexPublisher(model) == "google":
		return "gemini"
	}
	return ""
}

// cachePricesError tells a deployment's prompt-cache write price that is
// no price: each must be a finite number from 0 to maxPrice USD per 1M
// tokens.
func (d *Deployment) cachePricesError() error {
	for _, p := range []struct {
		name string
		v    *float64
	}{{"cost_cache_write", d.CostCacheWrite}, {"cost_cache_write_1h", d.CostCacheWrite1h}} {
		if p.v != nil && (!finite(*p.v) || *p.v < 0 || *p.v > maxPrice) {
			return fieldErr(p.name, "%s must be from 0 to %g USD per 1M tokens, got %v", p.name, float64(maxPrice), *p.v)
		}
	}
	return nil
}
