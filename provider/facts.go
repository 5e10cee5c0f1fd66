package provider

// Facts about a provider type: optional interfaces a Provider implements to
// state what the router would otherwise not know of it. Each is asked only
// when the router needs it; a type that does not implement one gets the
// default its doc gives, so a third party's type states only what applies
// to it. (Which formats a type serves is Provider.Serves, which every type
// implements.)

// KeyHeader is a Provider whose key goes in one request header, the same
// on every endpoint of its API, so that pass_through can send it requests
// the router does not read (audio, images, files, batches) with the
// account's key in place of the client's.
//
// Asked once, when a configuration names the provider as its
// pass_through. Default: pass_through refuses the provider at load (its
// type authenticates otherwise, such as by signing each request).
type KeyHeader interface {
	// KeyHeader returns the header's canonical name and what its value
	// holds before the key: "Authorization", "Bearer " (OpenAI);
	// "X-Api-Key", "" (Anthropic).
	KeyHeader() (name, prefix string)
}

// TraceNamer is a Provider that names its system in traces: the value of
// OpenTelemetry's gen_ai.provider.name on each attempt's span, one of the
// semantic conventions' well-known values when there is one
// (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/:
// "openai", "azure.ai.openai", "anthropic", "gcp.gemini", "aws.bedrock",
// "gcp.vertex_ai", "mistral_ai", ...).
//
// Asked when an attempt's span starts (only under a traced request).
// Default: the provider type's name ("acme" for llm_router.providers.acme).
type TraceNamer interface {
	// GenAIProviderName returns gen_ai.provider.name; "" means the default.
	GenAIProviderName() string
}

// Continuer is a Provider that says how it continues an answer from text it
// did not write (the final assistant message of a resume's request,
// Request.Continues), so that a broken stream is resumed only on the
// deployments whose model can (the router's resume).
//
// Asked of each deployment of the stream's group when a stream breaks,
// before any continuation is planned: one whose model it says
// NoContinuation for is not planned nor tried. Plan has the last word on a
// given request (it returns ErrNoContinuation for one it cannot continue:
// Claude with extended thinking on). Default: every deployment is planned,
// and its Plan's ErrNoContinuation says which cannot.
type Continuer interface {
	// ContinuationFor returns how model (a deployment's upstream model)
	// continues a final assistant message: NoContinuation when it answers
	// it afresh or refuses it.
	ContinuationFor(model string) Continuation
}

// CachePricer is a Provider that says how its models' prompt cache is
// billed, in multiples of the model's input price (a deployment's
// cost_input), so that a deployment that sets no cache prices of its own
// (cost_cached_input, cost_cache_write, cost_cache_write_1h) is charged as
// the provider bills it.
//
// Asked once per deployment, when the configuration loads. Default: 1, 1,
// 1: cache reads and writes at the input price (no write premium; a cached
// price below it, such as OpenAI's per-model one, is the deployment's to
// set), so that a budget is never counted short.
type CachePricer interface {
	// CachePrices returns the multiples of model's input price that a
	// cache read, a 5-minute cache write and a 1-hour cache write cost.
	CachePrices(model string) (read, write, write1h float64)
}
