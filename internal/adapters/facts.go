package adapters

import "github.com/llmrouter/caddy-llm-router/provider"

// The facts the built-in types state of themselves (provider's optional
// interfaces): the header their key goes in, their name in traces
// (OpenTelemetry's gen_ai.provider.name, a well-known value of
// https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/), how
// their models continue a final assistant message and how their prompt
// cache is billed. Bedrock and Vertex state
// no key header: they authenticate by signing or a token of the transport,
// so pass_through cannot reach them.

// keyHeader is where an account's key goes: header name, value prefix.
type keyHeader struct{ name, prefix string }

var (
	// bearerKey: OpenAI (https://platform.openai.com/docs/api-reference/authentication),
	// and a Bedrock API key or Vertex access token when the transport gives none.
	bearerKey = keyHeader{"Authorization", "Bearer "}
	// azureKey: https://learn.microsoft.com/en-us/azure/ai-foundry/openai/reference#authentication
	azureKey = keyHeader{"Api-Key", ""}
	// anthropicKey: https://docs.anthropic.com/en/api/overview#authentication
	anthropicKey = keyHeader{"X-Api-Key", ""}
	// geminiKey: https://ai.google.dev/api#api-keys
	geminiKey = keyHeader{"X-Goog-Api-Key", ""}
)

// KeyHeader implements provider.KeyHeader: "Authorization: Bearer <key>".
func (*OpenAI) KeyHeader() (name, prefix string) { return bearerKey.name, bearerKey.prefix }

// KeyHeader implements provider.KeyHeader: "api-key: <key>".
func (*Azure) KeyHeader() (name, prefix string) { return azureKey.name, azureKey.prefix }

// KeyHeader implements provider.KeyHeader: "x-api-key: <key>".
func (*Anthropic) KeyHeader() (name, prefix string) { return anthropicKey.name, anthropicKey.prefix }

// KeyHeader implements provider.KeyHeader: "x-goog-api-key: <key>".
func (*Gemini) KeyHeader() (name, prefix string) { return geminiKey.name, geminiKey.prefix }

// GenAIProviderName implements provider.TraceNamer: "openai".
func (*OpenAI) GenAIProviderName() string { return "openai" }

// GenAIProviderName implements provider.TraceNamer: "azure.ai.openai".
func (*Azure) GenAIProviderName() string { return "azure.ai.openai" }

// GenAIProviderName implements provider.TraceNamer: "anthropic".
func (*Anthropic) GenAIProviderName() string { return "anthropic" }

// GenAIProviderName implements provider.TraceNamer: "gcp.gemini".
func (*Gemini) GenAIProviderName() string { return "gcp.gemini" }

// GenAIProviderName implements provider.TraceNamer: "aws.bedrock".
func (*Bedrock) GenAIProviderName() string { return "aws.bedrock" }

// GenAIProviderName implements provider.TraceNamer: "gcp.vertex_ai".
func (*Vertex) GenAIProviderName() string { return "gcp.vertex_ai" }

// ContinuationFor implements provider.Continuer: as configured
// (OpenAI.Continuation), the same for every model of the server.
func (p *OpenAI) ContinuationFor(string) provider.Continuation { return p.Continuation }

// ContinuationFor implements provider.Continuer: Azure OpenAI answers a
// final assistant message afresh.
func (*Azure) ContinuationFor(string) provider.Continuation { return provider.NoContinuation }

// ContinuationFor implements provider.Continuer: Claude continues a final
// assistant message as it is (prefill; not with extended thinking on,
// which its Plan refuses).
func (*Anthropic) ContinuationFor(string) provider.Continuation { return provider.Prefill }

// ContinuationFor implements provider.Continuer: Gemini answers a final
// model turn afresh.
func (*Gemini) ContinuationFor(string) provider.Continuation { return provider.NoContinuation }

// ContinuationFor implements provider.Continuer: prefill for Anthropic's
// models (InvokeModel takes Anthropic's Messages body); none for the
// others, through Converse, whose models differ in what they continue.
func (*Bedrock) ContinuationFor(model string) provider.Continuation {
	if bedrockAnthropic(model) {
		return provider.Prefill
	}
	return provider.NoContinuation
}

// ContinuationFor implements provider.Continuer: prefill for Anthropic's
// models (rawPredict takes Anthropic's Messages body); none for Google's,
// which answer a final model turn afresh.
func (*Vertex) ContinuationFor(model string) provider.Continuation {
	if publisher, _ := vertexModel(model); publisher == "anthropic" {
		return provider.Prefill
	}
	return provider.NoContinuation
}

// Prompt-cache prices as the providers publish them, in multiples of the
// model's input price (provider.CachePricer):
//
//   - Claude (anthropic; bedrock's and vertex's Anthropic models): cache
//     reads 0.1x, 5-minute writes 1.25x, 1-hour writes 2x
//     (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching#pricing;
//     Bedrock and Vertex bill Claude alike:
//     https://aws.amazon.com/bedrock/pricing/,
//     https://cloud.google.com/vertex-ai/generative-ai/pricing).
//   - Gemini (gemini; vertex's Google models): cached tokens at the
//     context-caching price, 0.1x for Gemini 2.5 and later
//     (https://ai.google.dev/gemini-api/docs/pricing); the storage price
//     per hour of an explicit cache is no answer's and is not counted.
//     Writes cost the input price.
//   - The others (openai, azure, bedrock's Converse models, vertex's other
//     publishers) state none: no write premium (OpenAI caches for free:
//     https://platform.openai.com/docs/guides/prompt-caching), and cached
//     input at the deployment's cost_cached_input, else at its input price:
//     OpenAI's cached price is per model (0.5x for gpt-4o, 0.25x for
//     gpt-4.1, 0.1x for gpt-5: https://platform.openai.com/docs/pricing),
//     so the router takes the bound none exceeds and never counts a budget
//     short.
const (
	claudeCacheRead    = 0.1
	claudeCacheWrite   = 1.25
	claudeCacheWrite1h = 2
	geminiCacheRead    = 0.1
)

// CachePrices implements provider.CachePricer: Claude's.
func (*Anthropic) CachePrices(string) (read, write, write1h float64) {
	return claudeCacheRead, claudeCacheWrite, claudeCacheWrite1h
}

// CachePrices implements provider.CachePricer: Gemini's.
func (*Gemini) CachePrices(string) (read, write, write1h float64) { return geminiCacheRead, 1, 1 }

// CachePrices implements provider.CachePricer: Claude's for Anthropic's
// models, the input price for Converse's.
func (*Bedrock) CachePrices(model string) (read, write, write1h float64) {
	if bedrockAnthropic(model) {
		return claudeCacheRead, claudeCacheWrite, claudeCacheWrite1h
	}
	return 1, 1, 1
}

// CachePrices implements provider.CachePricer: Claude's for Anthropic's
// models, Gemini's for Google's, the input price for other publishers'.
func (*Vertex) CachePrices(model string) (read, write, write1h float64) {
	switch publisher, _ := vertexModel(model); publisher {
	case "anthropic":
		return claudeCacheRead, claudeCacheWrite, claudeCacheWrite1h
	case "google":
		return geminiCacheRead, 1, 1
	}
	return 1, 1, 1
}

// Interface guards
var (
	_ provider.KeyHeader   = (*OpenAI)(nil)
	_ provider.KeyHeader   = (*Azure)(nil)
	_ provider.KeyHeader   = (*Anthropic)(nil)
	_ provider.KeyHeader   = (*Gemini)(nil)
	_ provider.TraceNamer  = (*OpenAI)(nil)
	_ provider.TraceNamer  = (*Azure)(nil)
	_ provider.TraceNamer  = (*Anthropic)(nil)
	_ provider.TraceNamer  = (*Gemini)(nil)
	_ provider.TraceNamer  = (*Bedrock)(nil)
	_ provider.TraceNamer  = (*Vertex)(nil)
	_ provider.Continuer   = (*OpenAI)(nil)
	_ provider.Continuer   = (*Azure)(nil)
	_ provider.Continuer   = (*Anthropic)(nil)
	_ provider.Continuer   = (*Gemini)(nil)
	_ provider.Continuer   = (*Bedrock)(nil)
	_ provider.Continuer   = (*Vertex)(nil)
	_ provider.CachePricer = (*Anthropic)(nil)
	_ provider.CachePricer = (*Gemini)(nil)
	_ provider.CachePricer = (*Bedrock)(nil)
	_ provider.CachePricer = (*Vertex)(nil)
)
