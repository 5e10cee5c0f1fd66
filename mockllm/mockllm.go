// Package mockllm is a scripted fake LLM provider, OpenAI-compatible
// by default and optionally speaking Anthropic's Messages API or
// Gemini's generateContent API (Handler.Dialect).
//
// It serves chat answers (plain and streamed), Embeddings and the
// model list with canned answers, and injects the failures a router
// has to survive: provider rate limits with the provider's rate-limit
// headers or quota errors, error statuses, hung requests, streams cut
// mid-way, error events inside a stream and keep-alives before the
// first token. Integration tests, the demo Caddyfile, benchmarks and chaos
// soak tests run it as the Caddy handler http.handlers.llm_mock; unit
// tests of other packages use it as a plain http.Handler through New.
//
// The package imports Caddy because it is a Caddy module, but never
// the router's root package or its other packages, so it can stand in
// for any provider without import cycles.
package mockllm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults applied when the corresponding field is zero.
const (
	DefaultChunks          = 5
	DefaultReply           = "Hello from llm_mock."
	DefaultRateLimitWindow = time.Minute
	DefaultModelID         = "mock"

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
)

// Fault kinds, the values of Fault.Kind.
const (
	FaultRateLimit  = "rate_limit"
	FaultStatus     = "status"
	FaultHang       = "hang"
	FaultCut        = "cut"
	FaultErrorEvent = "error_event"
	FaultKeepAlive  = "keepalive"
)

// Handler is a fake LLM provider. Paths are matched by suffix, so any
// prefix such as /v1 works. In the openai dialect (the default):
//
//	POST .../chat/completions   Chat Completions, plain or "stream": true (SSE)
//	POST .../embeddings         a fixed 3-dimensional embedding
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
// And in every dialect:
//
//	GET  .../models             one model, Model or "mock", in the dialect's format
//	GET  .../llm_mock/stats     what reached the provider (see Stats)
//	POST .../llm_mock/reset     zero the counters and the rate-limit window
//
// Anything else, including the API paths of the other dialects, goes
// to the next handler in Caddy, or gets 404 from the plain
// http.Handler returned by New and HTTPHandler, so a request sent to
// a mock of the wrong provider is visible.
//
// Token counts are estimates: a request's prompt tokens are its body
// size in bytes / 4 (rounded up), its completion tokens the number of
// chunks (0 for embeddings).
//
// An answer to an API request (chat completions, embeddings, messages,
// generateContent) is decided in this order: the request is counted
// in Stats; Latency passes; a wrong API key gets 401 (gemini: 403
// when no key is sent); an unparsable body gets 400; RateLimit may
// answer 429; the first active matching fault applies; otherwise the
// normal answer is sent. Errors are in the dialect's own format.
//
// Use without Caddy: New, or Setup then HTTPHandler; Close releases
// requests still waiting.
type Handler struct {
	// Dialect is the wire format and API the mock serves: "openai"
	// (Chat Completions, Embeddings), "anthropic" (Messages API) or
	// "gemini" (generateContent). It decides the paths served, how the
	// API key is sent, the answer and stream formats, the error bodies
	// and the rate-limit headers. Default: "openai".
	Dialect string `json:"dialect,omitempty"`

	// Model is the model name put in answers and in the model list.
	// Default: the model named in the request (its body; in the gemini
	// dialect its path), or "mock" in the model list and when the
	// request names none.
	Model string `json:"model,omitempty"`

	// Latency delays the response headers of every API answer (chat
	// completions, embeddings, messages, generateContent), errors and
	// faults included. Default: 0 (no
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
	// pieces may be empty when Reply has fewer runes than Chunks).
	// Default: "Hello from llm_mock.".
	Reply string `json:"reply,omitempty"`

	// APIKey, when set, is required with every API request, where the
	// dialect expects it: "Authorization: Bearer <key>" (openai),
	// "x-api-key: <key>" (anthropic), "x-goog-api-key: <key>" or the
	// query parameter ?key=<key> (gemini; the header wins when both are
	// sent). Other requests get 401 with the dialect's authentication
	// error (gemini: 403 PERMISSION_DENIED when no key is sent at all,
	// 401 UNAUTHENTICATED for a wrong one). Placeholders such as
	// {env.MOCK_KEY} are replaced at provision.
	// Default: empty (no authentication).
	APIKey string `json:"api_key,omitempty"`

	// RateLimit imposes a provider-side rate limit. Every answer then
	// carries the dialect's rate-limit headers: OpenAI's x-ratelimit-*,
	// or Anthropic's anthropic-ratelimit-* with RFC 3339 reset instants
	// (Gemini sends none). Default: none.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`

	// Faults are injected failures. For each API request that gets
	// past authentication and RateLimit, the first fault that is
	// active and selects the request applies.
	// Default: none.
	Faults []Fault `json:"faults,omitempty"`

	dialect int      // Dialect as one of the dl* values
	apiKey  string   // APIKey with placeholders replaced
	pieces  [][]byte // Reply split in Chunks pieces, each a JSON string
	reply   []byte   // Reply as a JSON string

	now    func() time.Time // clock for windows and "created"; tests inject it
	logger *zap.Logger
	st     *state // shared by copies of a provisioned Handler
}

// RateLimit is a fixed-window provider rate limit, one window for
// requests and tokens alike. The window starts with the first API
// request and a new one starts with the first request after it ends.
// A request that would exceed a limit gets 429 and is not counted
// against the window; requests rejected with 401 or 400 are not
// counted either. The 429 is in the dialect's format:
// OpenAI's rate_limit_exceeded error with Retry-After; Anthropic's
// rate_limit_error with retry-after; Gemini's RESOURCE_EXHAUSTED
// google.rpc error with a QuotaFailure (quotaId
// GenerateRequestsPerMinutePerProjectPerModel-FreeTier, or
// GenerateContentInputTokensPerModelPerMinute-FreeTier when the tokens
// limit is the one exceeded) and a RetryInfo. Retry-After, retry-after
// and retryDelay are the whole seconds until the window ends, rounded
// up.
type RateLimit struct {
	// Requests is the number of requests allowed per window.
	// Default: 0 (unlimited, no x-ratelimit-*-requests headers).
	// Unit: requests.
	Requests int `json:"requests,omitempty"`

	// Tokens is the number of tokens allowed per window; a request
	// uses its prompt plus completion tokens. Default: 0 (unlimited,
	// no x-ratelimit-*-tokens headers). Unit: tokens.
	Tokens int `json:"tokens,omitempty"`

	// Window is the length of the fixed window. Default: 1m.
	// Unit: duration.
	Window caddy.Duration `json:"window,omitempty"`
}

// Fault is one scripted failure.
type Fault struct {
	// Kind selects the failure:
	//
	//   - rate_limit: Status (default 429) with the dialect's rate-limit
	//     error: OpenAI's rate_limit_exceeded; Anthropic's
	//     rate_limit_error with a retry-after header; Gemini's
	//     RESOURCE_EXHAUSTED with QuotaFailure (QuotaID) and RetryInfo
	//     (RetryDelay). See RetryDelay for Retry-After.
	//   - status: Status (default 500) with the dialect's error body:
	//     an OpenAI server_error "mock status <code>"; an Anthropic
	//     error whose type matches the status (400
	//     invalid_request_error, 401 authentication_error, 402
	//     billing_error, 403 permission_error, 404 not_found_error, 413
	//     request_too_large, 429 rate_limit_error, 500 api_error, 504
	//     timeout_error, 529 overloaded_error "Overloaded"; other 4xx
	//     invalid_request_error, others api_error); a google.rpc error
	//     whose status matches the code (400 INVALID_ARGUMENT, 401
	//     UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 409
	//     ABORTED, 429 RESOURCE_EXHAUSTED, 499 CANCELLED, 500 INTERNAL,
	//     501 UNIMPLEMENTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED;
	//     other 4xx FAILED_PRECONDITION, others UNKNOWN).
	//   - hang: never answer; the handler returns when the client goes
	//     away, and aborts the connection when the server shuts down or
	//     the handler is cleaned up.
	//   - cut: streams send After content chunks then abort the
	//     connection without their end ([DONE], message_stop, Gemini's
	//     finishReason); plain answers send headers with the full
	//     Content-Length and half the body, then abort. Clients read an
	//     unexpected EOF.
	//   - error_event: streams send After content chunks, then an error
	//     event and end without their normal end: OpenAI's data: event
	//     holding a server_error; Anthropic's "event: error" with an
	//     overloaded_error; Gemini's data: event holding a 503
	//     UNAVAILABLE google.rpc error ("The model is overloaded.").
	//     Plain answers get Status (default 500 openai, 529 anthropic,
	//     503 gemini) with that error.
	//   - keepalive: during FirstTokenDelay streams send a keep-alive
	//     every 100ms: ": keep-alive" SSE comments (openai, gemini SSE),
	//     "event: ping" events (anthropic), nothing for a Gemini stream
	//     without ?alt=sse (a JSON array). It never selects plain
	//     requests, so a later fault may apply to them.
	//
	// Required.
	Kind string `json:"kind"`

	// Every selects the Nth, 2Nth, ... API request, counted from 1
	// over all such requests received since provision or the last
	// reset (rejected ones included).
	// Default: 0 (every request).
	Every int `json:"every,omitempty"`

	// From is when the fault becomes active, measured from provision.
	// Default: 0 (at once). Unit: duration.
	From caddy.Duration `json:"from,omitempty"`

	// For is how long the fault stays active after From.
	// Default: 0 (forever). Unit: duration.
	For caddy.Duration `json:"for,omitempty"`

	// Status is the HTTP status of rate_limit (default 429), status
	// (default 500) and non-streamed error_event (default 500 openai,
	// 529 anthropic, 503 gemini) faults.
	// Must be 100-599. Unit: HTTP status code.
	Status int `json:"status,omitempty"`

	// Headers are set on the faulted answer, replacing any header of
	// the same name the mock would send (for example Retry-After, or
	// an x-ratelimit-* header). Default: none.
	Headers http.Header `json:"headers,omitempty"`

	// Body replaces the default error body of rate_limit, status and
	// error_event faults (for streamed error_event, the payload of the
	// error event). Default: the dialect's error described above.
	Body string `json:"body,omitempty"`

	// After is the number of content chunks a stream sends before a
	// cut or error_event fault strikes; 0 strikes right after the
	// response headers (anthropic: after message_start,
	// content_block_start and ping). Default: 1 (when unset).
	// Unit: chunks.
	After *int `json:"after,omitempty"`

	// RetryDelay is how long a rate_limit fault tells the client to
	// wait: Retry-After in whole seconds, rounded up (openai,
	// anthropic), or the RetryInfo retryDelay "<seconds>s" (gemini).
	// Default: 0, which in the openai dialect sends no Retry-After (as
	// before) and in the others the time until the RateLimit window
	// ends, or 1m without a RateLimit. Unit: duration.
	RetryDelay caddy.Duration `json:"retry_delay,omitempty"`

	// QuotaID is the quotaId of the QuotaFailure violation in a gemini
	// rate_limit fault's body, for example
	// GenerateRequestsPerDayPerProjectPerModel-FreeTier to script a
	// spent per-day quota. Ignored by other kinds and dialects.
	// Default: GenerateRequestsPerMinutePerProjectPerModel-FreeTier.
	QuotaID string `json:"quota_id,omitempty"`
}

// Stats describe what reached the provider: API requests (chat
// completions, embeddings, messages, generateContent), faulted and
// rejected ones included.
type Stats struct {
	// Requests is the number of requests received.
	Requests int64 `json:"requests"`
	// Faults is the number of answers a fault was injected into.
	Faults int64 `json:"faults"`
	// RateLimited is the number of 429s sent because of RateLimit.
	RateLimited int64 `json:"rate_limited"`
	// LastModel is the model named by the last request's body, or in
	// the gemini dialect by its path.
	LastModel string `json:"last_model"`
	// LastAuthorization is the last request's Authorization header.
	LastAuthorization string `json:"last_authorization"`
	// LastAPIKey is the API key the last request sent where the
	// dialect expects it (see Handler.APIKey): the Bearer token of
	// Authorization, x-api-key, or x-goog-api-key else ?key=; empty
	// when it sent none.
	LastAPIKey string `json:"last_api_key"`
	// LastHeaders are the last request's headers, values joined by ", ".
	LastHeaders map[string]string `json:"last_headers"`
	// LastBody is the last request's body.
	LastBody string `json:"last_body"`
}

// state is what requests share and mutate.
type state struct {
	start     time.Time // origin of fault From/For windows
	done      chan struct{}
	closeOnce sync.Once
	ids       atomic.Uint64

	mu          sync.Mutex
	stats       Stats
	rlStart     time.Time // zero until the first request
	rlRequests  int
	rlTokens    int
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
	h.apiKey = caddy.NewReplacer().ReplaceAll(h.APIKey, "")
	reply := h.replyText()
	h.reply = appendJSONString(nil, reply)
	h.pieces = h.pieces[:0]
	for _, p := range splitReply(reply, h.chunks()) {
		h.pieces = append(h.pieces, appendJSONString(nil, p))
	}
	h.st = &state{
		start:       h.now(),
		done:        make(chan struct{}),
		shutdownChs: make(map[*http.Server]chan struct{}),
	}
}

// Validate rejects unknown dialects, negative values, unknown fault
// kinds and bad statuses.
func (h *Handler) Validate() error {
	switch {
	case dialectOf(h.Dialect) < 0:
		return fmt.Errorf("unknown dialect %q (want openai, anthropic or gemini)", h.Dialect)
	case h.Latency < 0:
		return fmt.Errorf("latency must not be negative, got %s", time.Duration(h.Latency))
	case h.FirstTokenDelay < 0:
		return fmt.Errorf("first_token_delay must not be negative, got %s", time.Duration(h.FirstTokenDelay))
	case h.Chunks < 0:
		return fmt.Errorf("chunks must not be negative, got %d", h.Chunks)
	case h.ChunkInterval < 0:
		return fmt.Errorf("chunk_interval must not be negative, got %s", time.Duration(h.ChunkInterval))
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
	}
	return nil
}

func (f *Fault) validate() error {
	switch f.Kind {
	case FaultRateLimit, FaultStatus, FaultHang, FaultCut, FaultErrorEvent, FaultKeepAlive:
	case "":
		return errors.New("kind is required")
	default:
		return fmt.Errorf("unknown kind %q (want rate_limit, status, hang, cut, error_event or keepalive)", f.Kind)
	}
	switch {
	case f.Every < 0:
		return fmt.Errorf("every must not be negative, got %d", f.Every)
	case f.From < 0:
		return fmt.Errorf("from must not be negative, got %s", time.Duration(f.From))
	case f.For < 0:
		return fmt.Errorf("for must not be negative, got %s", time.Duration(f.For))
	case f.Status != 0 && (f.Status < 100 || f.Status > 599):
		return fmt.Errorf("status must be 100-599, got %d", f.Status)
	case f.After != nil && *f.After < 0:
		return fmt.Errorf("after must not be negative, got %d", *f.After)
	case f.RetryDelay < 0:
		return fmt.Errorf("retry_delay must not be negative, got %s", time.Duration(f.RetryDelay))
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

// New returns cfg, set up with Setup, as a plain http.Handler for
// tests without Caddy, e.g. httptest.NewServer(h). Paths it does not
// serve get 404. To read Stats or Close it from Go, call Setup and
// HTTPHandler on a *Handler instead.
func New(cfg Handler) (http.Handler, error) {
	h := new(Handler)
	*h = cfg
	h.st = nil
	h.pieces = nil
	if err := h.Setup(); err != nil {
		return nil, err
	}
	return h.HTTPHandler(), nil
}

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

// Stats returns what has reached the provider so far.
func (h *Handler) Stats() Stats {
	if h.st == nil {
		return Stats{LastHeaders: map[string]string{}}
	}
	h.st.mu.Lock()
	s := h.st.stats
	h.st.mu.Unlock()
	s.LastHeaders = maps.Clone(s.LastHeaders)
	if s.LastHeaders == nil {
		s.LastHeaders = map[string]string{}
	}
	return s
}

// Reset zeroes the counters, forgets the last request and restarts
// the rate-limit window. Fault From/For windows keep counting from
// provision.
func (h *Handler) Reset() {
	if h.st == nil {
		return
	}
	h.st.mu.Lock()
	h.st.stats = Stats{}
	h.st.rlStart = time.Time{}
	h.st.rlRequests, h.st.rlTokens = 0, 0
	h.st.mu.Unlock()
}

// Dialect numbers, set up from Handler.Dialect.
const (
	dlOpenAI = iota
	dlAnthropic
	dlGemini
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
	}
	return -1
}

// Endpoints the mock answers API requests on.
const (
	epChat = iota
	epEmbeddings
	epMessages       // anthropic
	epGenerate       // gemini :generateContent
	epStreamGenerate // gemini :streamGenerateContent
)

// call is an API request routed to an endpoint.
type call struct {
	ep    int
	model string // gemini: the model named by the path
	array bool   // gemini stream without ?alt=sse: a streamed JSON array
}

// serve answers the paths the mock owns and reports whether it did.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request) bool {
	p := r.URL.Path
	switch r.Method {
	case http.MethodPost:
		if strings.HasSuffix(p, "/llm_mock/reset") {
			h.Reset()
			writeJSON(w, http.StatusOK, h.Stats())
			return true
		}
		c, ok := h.route(r)
		if !ok {
			return false
		}
		h.serveAPI(w, r, c)
	case http.MethodGet:
		switch {
		case strings.HasSuffix(p, "/llm_mock/stats"):
			writeJSON(w, http.StatusOK, h.Stats())
		case strings.HasSuffix(p, "/models"):
			h.serveModels(w)
		default:
			return false
		}
	default:
		return false
	}
	return true
}

// route finds the API endpoint of a POST in the handler's dialect.
func (h *Handler) route(r *http.Request) (call, bool) {
	p := r.URL.Path
	switch h.dialect {
	case dlAnthropic:
		if strings.HasSuffix(p, "/messages") {
			return call{ep: epMessages}, true
		}
	case dlGemini:
		return geminiRoute(r)
	default:
		switch {
		case strings.HasSuffix(p, "/chat/completions"):
			return call{ep: epChat}, true
		case strings.HasSuffix(p, "/embeddings"):
			return call{ep: epEmbeddings}, true
		}
	}
	return call{}, false
}

func (h *Handler) serveModels(w http.ResponseWriter) {
	id := h.Model
	if id == "" {
		id = DefaultModelID
	}
	var b []byte
	switch h.dialect {
	case dlAnthropic:
		b = anthropicModels(id)
	case dlGemini:
		b = geminiModels(id)
	default:
		b = append([]byte(`{"object":"list","data":[{"id":`), appendJSONString(nil, id)...)
		b = append(b, `,"object":"model","owned_by":"llm_mock"}]}`...)
	}
	writeBody(w, http.StatusOK, b)
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// apiRequest is the part of a request body the mock looks at.
type apiRequest struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
}

// serveAPI answers an API request: chat completions, embeddings,
// messages or generateContent.
func (h *Handler) serveAPI(w http.ResponseWriter, r *http.Request, c call) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= 1<<20 {
			bufPool.Put(buf)
		}
	}()
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	body := buf.Bytes()
	var req apiRequest
	if h.dialect == dlGemini {
		// The model and streaming are in the path; the body only has
		// to be a JSON object (a GenerateContentRequest).
		var obj struct{}
		if err == nil {
			err = json.Unmarshal(body, &obj)
		}
		req = apiRequest{Model: c.model, Stream: c.ep == epStreamGenerate}
	} else if err == nil {
		err = json.Unmarshal(body, &req)
	}
	embeddings := c.ep == epEmbeddings
	key := h.requestKey(r)
	n := h.record(r, req.Model, key, body)

	p := pacer{ctx: r.Context(), done: h.st.done}
	defer p.stop()
	if !p.wait(time.Duration(h.Latency)) {
		h.abandon(r)
		return
	}

	hdr := w.Header()
	if h.dialect != dlOpenAI {
		// On the mock's clock, which rate-limit resets are relative to.
		hdr.Set("Date", h.now().UTC().Format(http.TimeFormat))
	}
	if h.apiKey != "" && key != h.apiKey {
		h.setLimitHeaders(hdr, h.limit(0, false))
		h.writeUnauthorized(w, key)
		return
	}
	if err != nil {
		h.setLimitHeaders(hdr, h.limit(0, false))
		h.writeBadRequest(w)
		return
	}

	model := h.Model
	if model == "" {
		model = req.Model
	}
	if model == "" {
		model = DefaultModelID
	}
	prompt := (len(body) + 3) / 4
	completion := 0
	if !embeddings {
		completion = h.chunks()
	}
	lim := h.limit(prompt+completion, true)
	h.setLimitHeaders(hdr, lim)
	if lim.exceeded != "" {
		h.st.mu.Lock()
		h.st.stats.RateLimited++
		h.st.mu.Unlock()
		h.writeRateLimited(w, lim, model)
		return
	}

	stream := req.Stream && !embeddings
	a := answer{
		model:      model,
		prompt:     prompt,
		completion: completion,
		fault:      h.pickFault(n, stream),
	}
	if f := a.fault; f != nil {
		h.st.mu.Lock()
		h.st.stats.Faults++
		h.st.mu.Unlock()
		if ce := h.logger.Check(zap.DebugLevel, "injecting fault"); ce != nil {
			ce.Write(zap.String("kind", f.Kind), zap.Int64("request", n), zap.String("path", r.URL.Path))
		}
		for k, v := range f.Headers {
			// A clone: middleware appending to the response's header
			// values must not write into the shared config.
			hdr[http.CanonicalHeaderKey(k)] = slices.Clone(v)
		}
		switch f.Kind {
		case FaultHang:
			h.hang(r)
			return
		case FaultRateLimit:
			h.writeFaultRateLimit(w, f, lim, model)
			return
		case FaultStatus:
			code := statusOr(f.Status, http.StatusInternalServerError)
			body := []byte(f.Body)
			if f.Body == "" {
				body = h.statusBody(code)
			}
			writeBody(w, code, body)
			return
		case FaultErrorEvent:
			if !stream {
				writeBody(w, statusOr(f.Status, h.errorEventStatus()), h.errorPayload(f))
				return
			}
		}
	}

	switch {
	case embeddings:
		h.writePlain(w, h.embedding(a), a.fault)
	case stream:
		h.stream(w, r, &p, a, h.streamFormat(a, c))
	default:
		h.writePlain(w, h.plainAnswer(a), a.fault)
	}
}

// requestKey is the API key r sends where the dialect expects it.
func (h *Handler) requestKey(r *http.Request) string {
	switch h.dialect {
	case dlAnthropic:
		return r.Header.Get("x-api-key")
	case dlGemini:
		if k := r.Header.Get("x-goog-api-key"); k != "" {
			return k
		}
		return r.URL.Query().Get("key")
	}
	k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return k
}

func (h *Handler) writeUnauthorized(w http.ResponseWriter, key string) {
	switch h.dialect {
	case dlAnthropic:
		writeBody(w, http.StatusUnauthorized, anthropicError("authentication_error", "invalid x-api-key"))
	case dlGemini:
		if key == "" {
			writeBody(w, http.StatusForbidden, googleError(http.StatusForbidden,
				"Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API."))
			return
		}
		writeBody(w, http.StatusUnauthorized, googleAPIKeyInvalid())
	default:
		writeError(w, http.StatusUnauthorized, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
	}
}

func (h *Handler) writeBadRequest(w http.ResponseWriter) {
	switch h.dialect {
	case dlAnthropic:
		writeBody(w, http.StatusBadRequest, anthropicError("invalid_request_error", "There was an issue with the format of your request: invalid JSON body"))
	case dlGemini:
		writeBody(w, http.StatusBadRequest, googleError(http.StatusBadRequest, "Invalid JSON payload received."))
	default:
		writeError(w, http.StatusBadRequest, "We could not parse the JSON body of your request.", "invalid_request_error", "")
	}
}

// writeRateLimited answers a request over the RateLimit window.
func (h *Handler) writeRateLimited(w http.ResponseWriter, lim limitState, model string) {
	switch h.dialect {
	case dlAnthropic:
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(lim.reset), 10))
		writeBody(w, http.StatusTooManyRequests, anthropicRateLimitError(lim, h.window()))
	case dlGemini:
		writeBody(w, http.StatusTooManyRequests, geminiWindowQuotaError(lim, model))
	default:
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(lim.reset), 10))
		writeError(w, http.StatusTooManyRequests, "Rate limit reached for "+lim.exceeded, lim.exceeded, "rate_limit_exceeded")
	}
}

// writeFaultRateLimit answers with a rate_limit fault; lim is the
// window after this request was counted.
func (h *Handler) writeFaultRateLimit(w http.ResponseWriter, f *Fault, lim limitState, model string) {
	code := statusOr(f.Status, http.StatusTooManyRequests)
	retry := time.Duration(f.RetryDelay)
	if retry <= 0 && h.dialect != dlOpenAI {
		retry = DefaultRateLimitWindow
		if lim.on {
			retry = lim.reset
		}
	}
	if retry > 0 && h.dialect != dlGemini && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(retry), 10))
	}
	body := []byte(f.Body)
	if f.Body == "" {
		switch h.dialect {
		case dlAnthropic:
			body = anthropicError("rate_limit_error", "This request would exceed your rate limit. Please try again later.")
		case dlGemini:
			quotaID := f.QuotaID
			if quotaID == "" {
				quotaID = geminiRequestsPerMinute
			}
			limit := 0
			if rl := h.RateLimit; rl != nil {
				limit = rl.Requests
			}
			body = geminiQuotaError(code, model, geminiRequestsMetric, quotaID, limit, retry)
		default:
			body = errorBody("Rate limit reached for requests", "requests", "rate_limit_exceeded")
		}
	}
	writeBody(w, code, body)
}

// statusBody is the error body of a status fault.
func (h *Handler) statusBody(code int) []byte {
	switch h.dialect {
	case dlAnthropic:
		return anthropicStatusError(code)
	case dlGemini:
		return googleError(code, geminiStatusMessage(code))
	}
	return errorBody("mock status "+strconv.Itoa(code), "server_error", "")
}

// errorEventStatus is the default status of a plain error_event answer.
func (h *Handler) errorEventStatus() int {
	switch h.dialect {
	case dlAnthropic:
		return statusOverloaded
	case dlGemini:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// errorPayload is the error an error_event fault sends: in a stream
// the payload of the error event, else the body.
func (h *Handler) errorPayload(f *Fault) []byte {
	if f.Body != "" {
		return []byte(f.Body)
	}
	switch h.dialect {
	case dlAnthropic:
		return anthropicError("overloaded_error", "Overloaded")
	case dlGemini:
		return []byte(geminiOverloadedEvent)
	}
	return errorBody("The server had an error while processing your request.", "server_error", "")
}

// plainAnswer is the non-streamed answer to a chat request.
func (h *Handler) plainAnswer(a answer) []byte {
	switch h.dialect {
	case dlAnthropic:
		return h.anthropicMessage(a)
	case dlGemini:
		return h.geminiResponse(a)
	}
	return h.completion(a)
}

// streamFormat returns the wire format of a's stream.
func (h *Handler) streamFormat(a answer, c call) streamFormat {
	switch h.dialect {
	case dlAnthropic:
		return &anthropicStream{a: a, id: h.st.ids.Add(1)}
	case dlGemini:
		return &geminiStream{a: a, array: c.array}
	}
	return &openaiStream{a: a, prefix: h.chunkPrefix(a.model)}
}

// answer is what one successful (or faulted) response is made of.
type answer struct {
	model      string
	prompt     int
	completion int
	fault      *Fault
}

// record counts a request in Stats and returns its 1-based number.
func (h *Handler) record(r *http.Request, model, key string, body []byte) int64 {
	hdrs := make(map[string]string, len(r.Header))
	for k, v := range r.Header {
		hdrs[k] = strings.Join(v, ", ")
	}
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	s := &h.st.stats
	s.Requests++
	s.LastModel = model
	s.LastAuthorization = r.Header.Get("Authorization")
	s.LastAPIKey = key
	s.LastHeaders = hdrs
	s.LastBody = string(body)
	return s.Requests
}

// pickFault returns the first fault active now that selects request n.
// keepalive faults select streams only.
func (h *Handler) pickFault(n int64, stream bool) *Fault {
	elapsed := h.now().Sub(h.st.start)
	for i := range h.Faults {
		f := &h.Faults[i]
		if f.Every > 1 && n%int64(f.Every) != 0 {
			continue
		}
		from := time.Duration(f.From)
		if elapsed < from || (f.For > 0 && elapsed >= from+time.Duration(f.For)) {
			continue
		}
		if f.Kind == FaultKeepAlive && !stream {
			continue
		}
		return f
	}
	return nil
}

// limitState is a snapshot of the rate-limit window.
type limitState struct {
	on       bool
	requests int // limit, 0 = none
	tokens   int // limit, 0 = none
	remReq   int
	remTok   int
	reset    time.Duration // until the window ends
	now      time.Time     // when the snapshot was taken
	exceeded string        // "requests" or "tokens" when over the limit
}

// window is the length of the RateLimit window.
func (h *Handler) window() time.Duration {
	if h.RateLimit != nil && h.RateLimit.Window > 0 {
		return time.Duration(h.RateLimit.Window)
	}
	return DefaultRateLimitWindow
}

// limit checks a request that uses tokens against the window. With
// consume it starts or rolls the window and counts the request when
// it fits; without, it only reports the current state.
func (h *Handler) limit(tokens int, consume bool) limitState {
	rl := h.RateLimit
	if rl == nil || (rl.Requests <= 0 && rl.Tokens <= 0) {
		return limitState{}
	}
	window := h.window()
	now := h.now()
	st := h.st
	st.mu.Lock()
	defer st.mu.Unlock()
	start, reqs, toks := st.rlStart, st.rlRequests, st.rlTokens
	if start.IsZero() || !now.Before(start.Add(window)) {
		start, reqs, toks = now, 0, 0
		if consume {
			st.rlStart, st.rlRequests, st.rlTokens = now, 0, 0
		}
	}
	ls := limitState{on: true, requests: rl.Requests, tokens: rl.Tokens, reset: start.Add(window).Sub(now), now: now}
	if consume {
		switch {
		case rl.Requests > 0 && reqs+1 > rl.Requests:
			ls.exceeded = "requests"
		case rl.Tokens > 0 && toks+tokens > rl.Tokens:
			ls.exceeded = "tokens"
		default:
			reqs++
			toks += tokens
			st.rlRequests, st.rlTokens = reqs, toks
		}
	}
	ls.remReq = max(0, rl.Requests-reqs)
	ls.remTok = max(0, rl.Tokens-toks)
	return ls
}

// setLimitHeaders sets the dialect's rate-limit headers, if any.
func (h *Handler) setLimitHeaders(hdr http.Header, ls limitState) {
	if !ls.on {
		return
	}
	switch h.dialect {
	case dlAnthropic:
		setAnthropicLimitHeaders(hdr, ls)
		return
	case dlGemini:
		return // Gemini sends no rate-limit headers
	}
	reset := ls.reset.Round(time.Millisecond).String()
	if ls.requests > 0 {
		hdr.Set("x-ratelimit-limit-requests", strconv.Itoa(ls.requests))
		hdr.Set("x-ratelimit-remaining-requests", strconv.Itoa(ls.remReq))
		hdr.Set("x-ratelimit-reset-requests", reset)
	}
	if ls.tokens > 0 {
		hdr.Set("x-ratelimit-limit-tokens", strconv.Itoa(ls.tokens))
		hdr.Set("x-ratelimit-remaining-tokens", strconv.Itoa(ls.remTok))
		hdr.Set("x-ratelimit-reset-tokens", reset)
	}
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	return max(1, int64(math.Ceil(d.Seconds())))
}

// hang never answers: it returns when the client goes away and aborts
// the connection when the server shuts down or the handler is cleaned
// up, so neither waits for a client that never leaves.
func (h *Handler) hang(r *http.Request) {
	select {
	case <-r.Context().Done():
		return
	case <-h.st.done:
	case <-h.serverShutdown(r):
	}
	panic(http.ErrAbortHandler)
}

// serverShutdown returns a channel closed when the http.Server serving
// r starts shutting down, or nil when r carries no server.
func (h *Handler) serverShutdown(r *http.Request) <-chan struct{} {
	srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	if srv == nil {
		return nil
	}
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	ch, ok := h.st.shutdownChs[srv]
	if !ok {
		ch = make(chan struct{})
		h.st.shutdownChs[srv] = ch
		var once sync.Once
		srv.RegisterOnShutdown(func() { once.Do(func() { close(ch) }) })
	}
	return ch
}

// abandon ends a request whose wait was interrupted: nothing to do if
// the client left, else the mock is closing and aborts the connection
// rather than let net/http finish it as a success.
func (h *Handler) abandon(r *http.Request) {
	if r.Context().Err() != nil {
		return
	}
	panic(http.ErrAbortHandler)
}

// writePlain sends a non-streamed answer, or half of it then an abort
// for a cut fault.
func (h *Handler) writePlain(w http.ResponseWriter, body []byte, f *Fault) {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if f != nil && f.Kind == FaultCut {
		_, _ = w.Write(body[:len(body)/2])
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}
	_, _ = w.Write(body)
}

// streamFormat writes one stream in a dialect's wire format. Each
// method appends to b and returns it; the stream driver sends what it
// returns as one flushed write.
type streamFormat interface {
	contentType() string
	// head is sent with the response headers, before FirstTokenDelay.
	head(b []byte) []byte
	// keepAlive is sent every keepAliveInterval of FirstTokenDelay by
	// a keepalive fault; nil for none.
	keepAlive() []byte
	// chunk carries content piece i (a JSON string); last tells the
	// last piece of a stream that will end normally.
	chunk(b []byte, i int, piece []byte, last bool) []byte
	// end follows the last chunk of a stream no fault struck.
	end(b []byte) []byte
	// errorEvent carries payload, the error of an error_event fault.
	errorEvent(b []byte, payload []byte) []byte
}

// stream sends a streamed answer.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, p *pacer, a answer, sf streamFormat) {
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", sf.contentType())
	hdr.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	ev := sf.head(make([]byte, 0, 512))
	if len(ev) > 0 {
		if !sendEvent(w, rc, ev) {
			return
		}
	} else if rc.Flush() != nil {
		return
	}

	ftd := time.Duration(h.FirstTokenDelay)
	if ka := sf.keepAlive(); ka != nil && a.fault != nil && a.fault.Kind == FaultKeepAlive {
		end := time.Now().Add(ftd)
		for {
			left := time.Until(end)
			if left <= 0 {
				break
			}
			if !sendEvent(w, rc, ka) {
				return
			}
			if !p.wait(min(left, keepAliveInterval)) {
				h.abandon(r)
				return
			}
		}
	} else if !p.wait(ftd) {
		h.abandon(r)
		return
	}

	strike := -1 // chunk index before which a cut or error_event strikes
	if f := a.fault; f != nil && (f.Kind == FaultCut || f.Kind == FaultErrorEvent) {
		strike = 1
		if f.After != nil {
			strike = *f.After
		}
		strike = min(strike, len(h.pieces))
	}

	last := len(h.pieces) - 1
	for i, piece := range h.pieces {
		if i == strike {
			h.strike(w, rc, sf, a.fault)
			return
		}
		if i > 0 && !p.wait(time.Duration(h.ChunkInterval)) {
			h.abandon(r)
			return
		}
		ev = sf.chunk(ev[:0], i, piece, i == last && strike < 0)
		if !sendEvent(w, rc, ev) {
			return
		}
	}
	if strike == len(h.pieces) {
		h.strike(w, rc, sf, a.fault)
		return
	}
	if ev = sf.end(ev[:0]); len(ev) > 0 {
		sendEvent(w, rc, ev)
	}
}

// strike ends a stream with a cut or error_event fault.
func (h *Handler) strike(w http.ResponseWriter, rc *http.ResponseController, sf streamFormat, f *Fault) {
	if f.Kind == FaultCut {
		_ = rc.Flush()
		panic(http.ErrAbortHandler)
	}
	sendEvent(w, rc, sf.errorEvent(nil, h.errorPayload(f)))
}

// keepAliveComment is the SSE comment of keepalive faults (openai,
// gemini).
var keepAliveComment = []byte(": keep-alive\n\n")

func sendEvent(w http.ResponseWriter, rc *http.ResponseController, ev []byte) bool {
	if _, err := w.Write(ev); err != nil {
		return false
	}
	return rc.Flush() == nil
}

// openaiStream is a Chat Completions stream: data: chunks, a final
// chunk with finish_reason and usage, then [DONE].
type openaiStream struct {
	a      answer
	prefix []byte // every event up to the delta object
}

func (s *openaiStream) contentType() string  { return "text/event-stream" }
func (s *openaiStream) head(b []byte) []byte { return b }
func (s *openaiStream) keepAlive() []byte    { return keepAliveComment }

func (s *openaiStream) chunk(b []byte, i int, piece []byte, _ bool) []byte {
	b = append(b, s.prefix...)
	if i == 0 {
		b = append(b, `{"role":"assistant","content":`...)
	} else {
		b = append(b, `{"content":`...)
	}
	b = append(b, piece...)
	return append(b, "},\"finish_reason\":null}]}\n\n"...)
}

func (s *openaiStream) end(b []byte) []byte {
	b = append(b, s.prefix...)
	b = append(b, `{},"finish_reason":"stop"}],"usage":`...)
	b = appendUsage(b, s.a.prompt, s.a.completion, true)
	return append(b, "}\n\ndata: [DONE]\n\n"...)
}

func (s *openaiStream) errorEvent(b, payload []byte) []byte {
	b = append(b, "data: "...)
	b = append(b, payload...)
	return append(b, "\n\n"...)
}

// chunkPrefix is every stream event up to the delta object.
func (h *Handler) chunkPrefix(model string) []byte {
	b := []byte(`data: {"id":"chatcmpl-mock-`)
	b = strconv.AppendUint(b, h.st.ids.Add(1), 10)
	b = append(b, `","object":"chat.completion.chunk","created":`...)
	b = strconv.AppendInt(b, h.now().Unix(), 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, model)
	return append(b, `,"choices":[{"index":0,"delta":`...)
}

func (h *Handler) completion(a answer) []byte {
	b := make([]byte, 0, 256+len(h.reply))
	b = append(b, `{"id":"chatcmpl-mock-`...)
	b = strconv.AppendUint(b, h.st.ids.Add(1), 10)
	b = append(b, `","object":"chat.completion","created":`...)
	b = strconv.AppendInt(b, h.now().Unix(), 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, a.model)
	b = append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	b = append(b, h.reply...)
	b = append(b, `},"finish_reason":"stop"}],"usage":`...)
	b = appendUsage(b, a.prompt, a.completion, true)
	return append(b, '}')
}

func (h *Handler) embedding(a answer) []byte {
	b := make([]byte, 0, 192)
	b = append(b, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2,0.3]}],"model":`...)
	b = appendJSONString(b, a.model)
	b = append(b, `,"usage":`...)
	b = appendUsage(b, a.prompt, 0, false)
	return append(b, '}')
}

func appendUsage(b []byte, prompt, completion int, withCompletion bool) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	if withCompletion {
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(completion), 10)
	}
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	return append(b, '}')
}

func (h *Handler) chunks() int {
	if h.Chunks > 0 {
		return h.Chunks
	}
	return DefaultChunks
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

func statusOr(code, def int) int {
	if code != 0 {
		return code
	}
	return def
}

// errorBody is an OpenAI error object; an empty code is null.
func errorBody(msg, typ, code string) []byte {
	b := append([]byte(`{"error":{"message":`), appendJSONString(nil, msg)...)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"param":null,"code":`...)
	if code == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, code)
	}
	return append(b, "}}"...)
}

func writeError(w http.ResponseWriter, status int, msg, typ, code string) {
	writeBody(w, status, errorBody(msg, typ, code))
}

func writeBody(w http.ResponseWriter, status int, body []byte) {
	hdr := w.Header()
	if hdr.Get("Content-Type") == "" {
		hdr.Set("Content-Type", "application/json")
	}
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error(), "server_error", "")
		return
	}
	writeBody(w, status, b)
}

// appendJSONString appends s as a JSON string. Invalid UTF-8 becomes
// U+FFFD, as with encoding/json.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// pacer waits on one reusable timer, giving up when the request's
// context ends or the handler is cleaned up.
type pacer struct {
	ctx  context.Context
	done <-chan struct{}
	t    *time.Timer
}

// wait pauses for d and reports whether the request should go on.
func (p *pacer) wait(d time.Duration) bool {
	if d <= 0 {
		select {
		case <-p.ctx.Done():
			return false
		case <-p.done:
			return false
		default:
			return true
		}
	}
	if p.t == nil {
		p.t = time.NewTimer(d)
	} else {
		p.t.Reset(d)
	}
	select {
	case <-p.t.C:
		return true
	case <-p.ctx.Done():
		return false
	case <-p.done:
		return false
	}
}

func (p *pacer) stop() {
	if p.t != nil {
		p.t.Stop()
	}
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
