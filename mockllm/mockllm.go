// Package mockllm is a scripted fake LLM provider, OpenAI-compatible
// by default and optionally speaking Anthropic's Messages API, Gemini's
// generateContent API, the Amazon Bedrock runtime API (InvokeModel with
// Anthropic bodies, Converse, their event-stream variants, SigV4 or API
// key authentication) or Google Vertex AI (Gemini and Anthropic
// publisher models, OAuth 2 access tokens from a fake token endpoint)
// (Handler.Dialect).
//
// It serves chat answers (plain and streamed), the Responses API,
// Embeddings and the model list with canned answers, and injects the failures a router
// has to survive: provider rate limits with the provider's rate-limit
// headers or quota errors, error statuses, hung requests, streams cut
// mid-way, stalled or sending malformed JSON, error events inside a
// stream, keep-alives before the first token and late first tokens. It
// continues a final assistant message as the provider does (Anthropic's
// prefill, prefix completion), or rejects it. Integration tests, the demo Caddyfile,
// benchmarks and chaos soak tests run it as the Caddy handler
// http.handlers.llm_mock; unit tests of other packages use it as a
// plain http.Handler through Setup and HTTPHandler.
//
// The package imports Caddy because it is a Caddy module, but never
// the router's root package or its other packages, so it can stand in
// for any provider without import cycles.
package mockllm

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// This file holds the Handler, its configuration and lifecycle
// (Provision, Setup, Validate, Cleanup) and its two faces: the Caddy
// middleware and the plain http.Handler. The rest of the package:
// serve.go (routing, request handling), continuation.go (continuing
// the final assistant message), ratelimit.go, faults.go,
// stream.go (streamed answers, pacing), stats.go, and the dialects'
// wire formats in openai.go, anthropic.go, gemini.go, bedrock.go (with
// its SigV4 check in sigv4.go) and vertex.go.

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults applied when the corresponding field is zero.
const (
	DefaultChunks          = 5
	DefaultReply           = "Hello from llm_mock."
	DefaultRateLimitWindow = time.Minute
	DefaultModelID         = "mock"
	DefaultTokenLifetime   = time.Hour

	// keepAliveInterval is how often the keepalive fault writes an SSE
	// comment while the first token is delayed.
	keepAliveInterval = 100 * time.Millisecond

	// maxBodyBytes bounds what one request may make the mock buffer.
	maxBodyBytes = 32 << 20
)

// Dialects, the values of Handler.Dialect: whose wire format the mock
// speaks.
const (
	DialectOpenAI    = "openai"
	DialectAnthropic = "anthropic"
	DialectGemini    = "gemini"
	DialectBedrock   = "bedrock"
	DialectVertex    = "vertex"
)

// Handler is a fake LLM provider. Paths are matched by suffix, so any
// prefix such as /v1 works. In the openai dialect (the default):
//
//	POST .../chat/completions   Chat Completions, plain or "stream": true (SSE)
//	POST .../embeddings         a fixed 3-dimensional embedding per input item (base64 float32s for encoding_format base64, as the OpenAI SDKs ask by default)
//	POST .../responses          Responses API, plain or "stream": true (typed SSE
//	                            events); previous_response_id must name a
//	                            response this mock gave (else 400); with
//	                            Organization, encrypted reasoning minted
//	                            and checked per organization
//	GET .../responses/{id}      a response this mock gave, as last written
//	                            (else 404 "Response with id '...' not found.")
//	DELETE .../responses/{id}   forgets it: {"id","object":"response","deleted":true}
//
// In the anthropic dialect:
//
//	POST .../messages           Messages API, plain or "stream": true (SSE)
//
// In the gemini dialect ({model} is any name without "/"):
//
//	POST .../models/{model}:generateContent         a GenerateContentResponse
//	POST .../models/{model}:streamGenerateContent   with ?alt=sse an SSE stream of
//	                                                them, else a streamed JSON array
//
// In the bedrock dialect ({modelId} is one path segment, escaped: a
// model id such as us.anthropic.claude-sonnet-4-5-20250929-v1:0, or an
// ARN with its "/" sent as %2F; see bedrock.go):
//
//	POST .../model/{modelId}/invoke                        an Anthropic Messages body
//	POST .../model/{modelId}/invoke-with-response-stream   (Anthropic models only) answered
//	                                                       as the anthropic dialect does,
//	                                                       the stream's events wrapped in
//	                                                       application/vnd.amazon.eventstream
//	POST .../model/{modelId}/converse                      the Converse API, any model
//	POST .../model/{modelId}/converse-stream               ConverseStream (event stream)
//
// In the vertex dialect (see vertex.go):
//
//	POST .../projects/{p}/locations/{l}/publishers/google/models/{model}:generateContent
//	POST .../projects/{p}/locations/{l}/publishers/google/models/{model}:streamGenerateContent
//	                            as the gemini dialect
//	POST .../projects/{p}/locations/{l}/publishers/anthropic/models/{model}:rawPredict
//	POST .../projects/{p}/locations/{l}/publishers/anthropic/models/{model}:streamRawPredict
//	                            a Messages body without "model", with anthropic_version
//	                            "vertex-2023-10-16"; answered as the anthropic dialect does
//	POST .../token              the OAuth 2 token endpoint of a service account's
//	                            JWT bearer grant; its access tokens authenticate
//	                            every other vertex request
//
// And in every dialect:
//
//	GET  .../models             one model, Model or "mock", in the dialect's format
//	GET  .../llm_mock/stats     what reached the provider (see Stats)
//	POST .../llm_mock/reset     zero the counters, the rate-limit window and the prompt cache
//
// Anything else, including the API paths of the other dialects, goes
// to the next handler in Caddy, or gets 404 from the plain
// http.Handler returned by HTTPHandler, so a request sent to a mock of
// the wrong provider is visible.
//
// Token counts are estimates: a request's prompt tokens are its body
// size in bytes / 4 (rounded up), its completion tokens the number of
// chunks (0 for embeddings; for the answer to a continuation, the
// chunks' share of Reply it holds: Chunks × its runes / Reply's runes,
// rounded up).
//
// An answer to an API request (chat completions, embeddings, messages,
// generateContent, invoke, converse, rawPredict) is decided in this
// order, as a real provider decides admission when a request arrives:
// the request is counted in Stats; a wrong API
// key gets 401 (gemini: 403 when no key is sent; bedrock: 403 for bad
// credentials or signature; vertex: 401 for a missing, unknown or
// expired access token); an unparsable body gets 400; a body the
// provider's schema rejects gets 400 (bedrock, vertex's anthropic
// publisher); a continuation the provider rejects gets 400 (see
// Continuation and continuation.go); RateLimit may answer 429; each of
// those refusals is sent at once. An admitted request then waits
// Latency (its generation: the rate-limit headers, computed at
// admission, come after it, as a real provider's do); the first active
// matching fault applies; otherwise the normal answer is sent. Errors
// are in the dialect's own format.
//
// Use without Caddy: Setup then HTTPHandler; Close releases requests
// still waiting.
type Handler struct {
	// Dialect is the wire format and API the mock serves: "openai"
	// (Chat Completions, Embeddings), "anthropic" (Messages API),
	// "gemini" (generateContent), "bedrock" (Amazon Bedrock runtime:
	// InvokeModel, Converse) or "vertex" (Google Vertex AI: Gemini and
	// Anthropic models). It decides the paths served, how the API key
	// is sent, the answer and stream formats, the error bodies and the
	// rate-limit headers. Default: "openai".
	Dialect string `json:"dialect,omitempty"`

	// Model is the model name put in answers and in the model list.
	// Default: the model named in the request (its body; in the gemini
	// dialect its path), or "mock" in the model list and when the
	// request names none.
	Model string `json:"model,omitempty"`

	// Latency delays the response headers of every admitted API
	// request (chat completions, embeddings, messages,
	// generateContent), faults included: its generation. Refusals (401,
	// 400, 429) come at once, and the rate-limit headers state what
	// held at admission, Latency before they are read. Default: 0 (no
	// delay). Unit: duration (JSON integer nanoseconds or a string
	// such as "150ms").
	Latency caddy.Duration `json:"latency,omitempty"`

	// FirstTokenDelay is, for streamed answers only, the pause after
	// the response headers are sent and flushed and before the first
	// content chunk: the time to first token on top of Latency. In the
	// anthropic dialect the message_start, content_block_start and
	// ping events are sent before it, as Anthropic does.
	// Default: 0. Unit: duration.
	FirstTokenDelay caddy.Duration `json:"first_token_delay,omitempty"`

	// Chunks is the number of content chunks of a stream; Reply is
	// split into this many pieces. It is also the completion token
	// count reported in usage. Default: 5. Unit: chunks.
	Chunks int `json:"chunks,omitempty"`

	// ChunkInterval is the pause between two content chunks of a
	// stream. Default: 0. Unit: duration.
	ChunkInterval caddy.Duration `json:"chunk_interval,omitempty"`

	// Reply is the assistant's answer. Streams send it in Chunks pieces
	// whose concatenation equals Reply (split on rune boundaries, so
	// pieces may be empty when Reply has fewer runes than Chunks). A
	// continuation gets the rest of Reply (see Continuation), in Chunks
	// pieces too.
	// Default: "Hello from llm_mock.".
	Reply string `json:"reply,omitempty"`

	// ToolCall scripts a tool round trip (see toolcall.go): a request
	// whose conversation does not end with a tool's result is answered
	// with one call of this tool (openai, anthropic and the Responses API;
	// bedrock's invoke and vertex's rawPredict as anthropic; bedrock's
	// Converse when its toolConfig offers the tool; not Gemini models);
	// the one that brings the result gets Reply.
	// Default: none.
	ToolCall *ToolCall `json:"tool_call,omitempty"`

	// APIKey, when set, is required with every API request, where the
	// dialect expects it: "Authorization: Bearer <key>" (openai; bedrock,
	// where it is a Bedrock API key and AWSCredentials are accepted
	// too), "x-api-key: <key>" (anthropic), "x-goog-api-key: <key>" or
	// the query parameter ?key=<key> (gemini; the header wins when both
	// are sent). Other requests get 401 with the dialect's
	// authentication error (openai: "Incorrect API key provided: <the
	// key as OpenAI shows it, see openAIShownKey>"; gemini: 403
	// PERMISSION_DENIED when no key is sent at all, 401 UNAUTHENTICATED
	// for a wrong one; bedrock: 403, see AWSCredentials), and so do
	// POSTs with a wrong key to paths the mock does not serve (openai,
	// anthropic, gemini): authentication comes before routing. Not allowed in the vertex dialect, which
	// always wants an access token from its token endpoint.
	// Placeholders such as {env.MOCK_KEY} are replaced at provision.
	// Default: empty (no authentication).
	APIKey string `json:"api_key,omitempty"`

	// AWSCredentials (bedrock dialect only), when set, make every API
	// request carry either an AWS Signature Version 4 made with these
	// credentials for the service "bedrock" (any region, any session
	// token) or, when APIKey is set, "Authorization: Bearer <APIKey>".
	// The signature is checked as AWS does, by signing the request
	// again with the SDK's signer: the escaped path as received, the
	// signed headers only, the body's SHA-256. Other requests get 403
	// with x-amzn-ErrorType MissingAuthenticationTokenException (no
	// Authorization), UnrecognizedClientException (unknown access key
	// id or API key), IncompleteSignatureException (a malformed
	// Authorization or no X-Amz-Date) or InvalidSignatureException.
	// The request time is not checked against the clock.
	// Placeholders are replaced at provision. Default: none.
	AWSCredentials *AWSCredentials `json:"aws_credentials,omitempty"`

	// TokenLifetime (vertex dialect only) is the lifetime of the access
	// tokens the token endpoint issues: their expires_in, in whole
	// seconds rounded up. A token is accepted until its issue time plus
	// TokenLifetime plus 1s, on the clock of the handler checking it.
	// Default: 1h. Unit: duration.
	TokenLifetime caddy.Duration `json:"token_lifetime,omitempty"`

	// RateLimit imposes a provider-side rate limit. Every answer then
	// carries the dialect's rate-limit headers: OpenAI's x-ratelimit-*,
	// or Anthropic's anthropic-ratelimit-* with RFC 3339 reset instants
	// (Gemini sends none). Default: none.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`

	// Continuation is how the mock answers a request asking it to
	// continue the conversation's final assistant message (see
	// continuation.go): Anthropic's prefill (Messages bodies: the
	// anthropic dialect, bedrock's invoke, vertex's rawPredict), or in
	// the openai dialect's Chat Completions a final assistant message
	// with "prefix": true or a body with "continue_final_message": true.
	// "accept" answers with Reply after the message's text (the whole
	// Reply when it does not start with it); "reject" answers 400 in
	// the dialect's format (anthropic, vertex: invalid_request_error
	// "assistant message prefill is not supported for this model";
	// bedrock: ValidationException; openai: invalid_request_error), as
	// a provider whose model takes no prefill.
	// Default: "accept".
	Continuation string `json:"continuation,omitempty"`

	// Organization (openai dialect's Responses API), when set, makes the
	// mock an account of that organization as OpenAI binds reasoning
	// state: every response's output begins with a reasoning item whose
	// encrypted_content only a mock of the same Organization reads
	// ("gAAAA" and a base64 text naming it), and a request whose input
	// carries an item with encrypted_content any other minted is refused
	// with OpenAI's 400 invalid_encrypted_content ("The encrypted content
	// gAAA...XXXX could not be verified. Reason: Encrypted content could
	// not be decrypted or parsed."). Default: none (no reasoning items, no
	// check).
	Organization string `json:"organization,omitempty"`

	// Faults are injected failures. For each API request that gets
	// past authentication and RateLimit, the first fault that is
	// active and selects the request applies.
	// Default: none.
	Faults []Fault `json:"faults,omitempty"`

	dialect int            // Dialect as one of the dl* values
	apiKey  string         // APIKey with placeholders replaced
	awsKey  AWSCredentials // AWSCredentials with placeholders replaced
	reply   string         // Reply, or DefaultReply
	pieces  []string       // reply split in Chunks pieces

	now    func() time.Time // clock for windows and "created"; tests inject it
	logger *zap.Logger
	st     *state // shared by copies of a provisioned Handler
}

// state is what requests share and mutate.
type state struct {
	start     time.Time // origin of fault From/For windows
	done      chan struct{}
	closeOnce sync.Once
	ids       atomic.Uint64
	responses responseIDs // the Responses API ids given

	mu          sync.Mutex
	stats       Stats
	rlStart     time.Time // zero until the first request
	rlRequests  int
	rlTokens    int
	prefixes    map[[32]byte]struct{} // the prompt cache's prefixes (cache.go)
	shutdownChs map[*http.Server]chan struct{}
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_mock",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets up the handler.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.setup()
	return nil
}

// Setup prepares a Handler built in Go, without a caddy.Context, and
// validates it. Placeholders in APIKey are replaced as in Provision.
// Each call starts fresh counters, rate-limit window and fault clock.
func (h *Handler) Setup() error {
	if err := h.Validate(); err != nil {
		return err
	}
	h.setup()
	return nil
}

func (h *Handler) setup() {
	if h.logger == nil {
		h.logger = zap.NewNop()
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.dialect = dialectOf(h.Dialect)
	repl := caddy.NewReplacer()
	h.apiKey = repl.ReplaceAll(h.APIKey, "")
	h.awsKey = AWSCredentials{}
	if c := h.AWSCredentials; c != nil {
		h.awsKey = AWSCredentials{
			AccessKeyID:     repl.ReplaceAll(c.AccessKeyID, ""),
			SecretAccessKey: repl.ReplaceAll(c.SecretAccessKey, ""),
		}
	}
	h.reply = h.replyText()
	// A new slice: a copy of a set-up Handler shares the old one.
	h.pieces = splitReply(h.reply, h.chunks())
	h.st = &state{
		start:       h.now(),
		done:        make(chan struct{}),
		shutdownChs: make(map[*http.Server]chan struct{}),
	}
}

// Validate rejects unknown dialects, negative values, unknown fault
// kinds, bad statuses and settings of another dialect.
func (h *Handler) Validate() error {
	dl := dialectOf(h.Dialect)
	switch {
	case dl < 0:
		return fmt.Errorf("unknown dialect %q (want openai, anthropic, gemini, bedrock or vertex)", h.Dialect)
	case h.AWSCredentials != nil && dl != dlBedrock:
		return fmt.Errorf("aws_credentials is only used by the bedrock dialect")
	case h.AWSCredentials != nil && (h.AWSCredentials.AccessKeyID == "" || h.AWSCredentials.SecretAccessKey == ""):
		return fmt.Errorf("aws_credentials needs an access key id and a secret access key")
	case h.TokenLifetime < 0:
		return fmt.Errorf("token_lifetime must not be negative, got %s", time.Duration(h.TokenLifetime))
	case h.TokenLifetime != 0 && dl != dlVertex:
		return fmt.Errorf("token_lifetime is only used by the vertex dialect")
	case h.APIKey != "" && dl == dlVertex:
		return fmt.Errorf("api_key is not used by the vertex dialect: it takes access tokens from its token endpoint")
	case h.Latency < 0:
		return fmt.Errorf("latency must not be negative, got %s", time.Duration(h.Latency))
	case h.FirstTokenDelay < 0:
		return fmt.Errorf("first_token_delay must not be negative, got %s", time.Duration(h.FirstTokenDelay))
	case h.Chunks < 0:
		return fmt.Errorf("chunks must not be negative, got %d", h.Chunks)
	case h.ChunkInterval < 0:
		return fmt.Errorf("chunk_interval must not be negative, got %s", time.Duration(h.ChunkInterval))
	case h.Continuation != "" && h.Continuation != ContinuationAccept && h.Continuation != ContinuationReject:
		return fmt.Errorf("unknown continuation %q (want accept or reject)", h.Continuation)
	}
	if rl := h.RateLimit; rl != nil {
		switch {
		case rl.Requests < 0:
			return fmt.Errorf("rate_limit: requests must not be negative, got %d", rl.Requests)
		case rl.Tokens < 0:
			return fmt.Errorf("rate_limit: tokens must not be negative, got %d", rl.Tokens)
		case rl.Window < 0:
			return fmt.Errorf("rate_limit: window must not be negative, got %s", time.Duration(rl.Window))
		}
	}
	for i, f := range h.Faults {
		if err := f.validate(); err != nil {
			return fmt.Errorf("fault %d (%s): %w", i, f.Kind, err)
		}
		if err := f.validateQuota(dl); err != nil {
			return fmt.Errorf("fault %d (%s): %w", i, f.Kind, err)
		}
	}
	return nil
}

// Cleanup releases requests still waiting (hang faults, delays): they
// abort their connections.
func (h *Handler) Cleanup() error {
	if h.st != nil {
		h.st.closeOnce.Do(func() { close(h.st.done) })
	}
	return nil
}

// Close is Cleanup for handlers used without Caddy.
func (h *Handler) Close() error { return h.Cleanup() }

// HTTPHandler returns h as a plain http.Handler; h must have been set
// up by Setup (or Provision). Paths it does not serve get 404.
func (h *Handler) HTTPHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.serve(w, r) {
			http.NotFound(w, r)
		}
	})
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.serve(w, r) {
		return nil
	}
	return next.ServeHTTP(w, r)
}

// Dialect numbers, set up from Handler.Dialect.
const (
	dlOpenAI = iota
	dlAnthropic
	dlGemini
	dlBedrock
	dlVertex
)

// dialectOf maps a Dialect name to its number, -1 when unknown.
func dialectOf(name string) int {
	switch name {
	case "", DialectOpenAI:
		return dlOpenAI
	case DialectAnthropic:
		return dlAnthropic
	case DialectGemini:
		return dlGemini
	case DialectBedrock:
		return dlBedrock
	case DialectVertex:
		return dlVertex
	}
	return -1
}

func (h *Handler) chunks() int {
	if h.Chunks > 0 {
		return h.Chunks
	}
	return DefaultChunks
}

// tokenLifetime is TokenLifetime or its default.
func (h *Handler) tokenLifetime() time.Duration {
	if h.TokenLifetime > 0 {
		return time.Duration(h.TokenLifetime)
	}
	return DefaultTokenLifetime
}

func (h *Handler) replyText() string {
	if h.Reply != "" {
		return h.Reply
	}
	return DefaultReply
}

// splitReply cuts s into n pieces of near-equal rune counts.
func splitReply(s string, n int) []string {
	runes := []rune(s)
	out := make([]string, n)
	for i := range n {
		out[i] = string(runes[i*len(runes)/n : (i+1)*len(runes)/n])
	}
	return out
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
