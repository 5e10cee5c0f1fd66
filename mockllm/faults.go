package mockllm

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Faults (Handler.Faults): their kinds and validation, which fault
// selects a request, hang and abandon, and the error bodies of
// rate_limit, status and error_event faults. Cut, error_event, stall
// and malformed faults strike streams in stream.go, where slow faults
// delay their first chunk.

// Fault kinds, the values of Fault.Kind.
const (
	FaultRateLimit  = "rate_limit"
	FaultStatus     = "status"
	FaultHang       = "hang"
	FaultCut        = "cut"
	FaultErrorEvent = "error_event"
	FaultKeepAlive  = "keepalive"
	FaultStall      = "stall"
	FaultMalformed  = "malformed"
	FaultSlow       = "slow"
)

// Fault is one scripted failure.
type Fault struct {
	// Kind selects the failure:
	//
	//   - rate_limit: Status (default 429) with the dialect's rate-limit
	//     error: OpenAI's rate_limit_exceeded; Anthropic's
	//     rate_limit_error with a retry-after header; Gemini's
	//     RESOURCE_EXHAUSTED with QuotaFailure (QuotaID) and RetryInfo
	//     (RetryDelay); Bedrock's ThrottlingException (Quota: too many
	//     requests, tokens or tokens per day); Vertex's RESOURCE_EXHAUSTED (Quota:
	//     dynamic shared quota, per-minute or per-day project quota)
	//     with a RetryInfo when RetryDelay is set, for both publishers.
	//     See RetryDelay for Retry-After.
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
	//     other 4xx FAILED_PRECONDITION, others UNKNOWN; vertex: the
	//     google.rpc error for the google publisher, the Anthropic error
	//     for the anthropic one); a Bedrock exception, named in
	//     x-amzn-ErrorType, whose message is {"message": ...} (400
	//     ValidationException "Input is too long for requested model.",
	//     403 AccessDeniedException, 404 ResourceNotFoundException, 408
	//     ModelTimeoutException, 424 ModelErrorException, 429
	//     ThrottlingException, 500 InternalServerException, 503 and 529
	//     ServiceUnavailableException "Bedrock is unable to process your
	//     request."; other 4xx ValidationException, others
	//     InternalServerException).
	//   - hang: never answer; the handler returns when the client goes
	//     away, and aborts the connection when the server shuts down or
	//     the handler is cleaned up.
	//   - cut: streams send After content chunks then abort the
	//     connection without their end ([DONE], message_stop, Gemini's
	//     finishReason; bedrock event streams send the first half of the
	//     next message first, so the cut is mid-frame); plain answers
	//     send headers with the full Content-Length and half the body,
	//     then abort. Clients read an unexpected EOF.
	//   - error_event: streams send After content chunks, then an error
	//     event and end without their normal end: OpenAI's data: event
	//     holding a server_error; Anthropic's "event: error" with an
	//     overloaded_error; Gemini's data: event holding a 503
	//     UNAVAILABLE google.rpc error ("The model is overloaded.");
	//     vertex: Anthropic's or Gemini's as the publisher's; bedrock: an
	//     event-stream exception message (:message-type exception) whose
	//     :exception-type fits Status: serviceUnavailableException
	//     (unset, 503, 529), throttlingException (429),
	//     internalServerException (500), modelTimeoutException (408),
	//     validationException (400), else modelStreamErrorException; its
	//     payload {"message": ...}. Plain answers get Status (default
	//     500 openai, 529 anthropic and vertex's anthropic publisher, 503
	//     gemini, vertex's google publisher and bedrock) with that error
	//     (bedrock: the exception of a status fault of that code).
	//   - keepalive: during FirstTokenDelay streams send a keep-alive
	//     every 100ms: ": keep-alive" SSE comments (openai, gemini SSE),
	//     "event: ping" events (anthropic; bedrock invoke streams as
	//     chunk messages), nothing for a Gemini stream without ?alt=sse
	//     (a JSON array) or a Converse stream. It never selects plain
	//     requests, so a later fault may apply to them.
	//   - stall: streams send After content chunks, then nothing more
	//     (no keep-alive, no end) while the connection stays open: the
	//     handler returns when the client goes away, and aborts the
	//     connection when the server shuts down or the handler is
	//     cleaned up. Plain answers hang as with hang.
	//   - malformed: streams send After content chunks, then one event
	//     whose data is not valid JSON, and end normally without their
	//     end ([DONE], message_stop, ...): OpenAI's
	//     data: {"choices":[{"delta":{"content":"x (the Responses
	//     API's "event: response.output_text.delta", legacy
	//     completions' {"choices":[{"text":"x); Anthropic's
	//     "event: content_block_delta" with a delta cut short; Gemini's
	//     data: event (without ?alt=sse: an array element) cut short;
	//     bedrock: an event message whose payload is JSON cut short (a
	//     chunk message, or Converse's contentBlockDelta). Plain answers
	//     get 200 with the first half of the answer's body (its
	//     Content-Length that half's).
	//   - slow: the answer is normal but late: streams send their
	//     first content chunk Delay after FirstTokenDelay (the response
	//     headers, and the anthropic prelude, come as usual); plain
	//     answers, and tool-call streams (written at once), are sent
	//     Delay after Latency. The time to first token of a provider's
	//     slow tail.
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
	// cut, error_event, stall or malformed fault strikes; 0 strikes
	// right after the response headers (anthropic: after
	// message_start, content_block_start and ping). Default: 1 (when
	// unset). Unit: chunks.
	After *int `json:"after,omitempty"`

	// RetryDelay is how long a rate_limit fault tells the client to
	// wait: Retry-After in whole seconds, rounded up (openai,
	// anthropic, bedrock), or the RetryInfo retryDelay "<seconds>s"
	// (gemini, vertex). Default: 0, which in the openai dialect sends
	// no Retry-After (as before), in bedrock no Retry-After and in
	// vertex no RetryInfo (as they do), and in the others the time
	// until the RateLimit window ends, or 1m without a RateLimit.
	// Unit: duration.
	RetryDelay caddy.Duration `json:"retry_delay,omitempty"`

	// QuotaID is the quotaId of the QuotaFailure violation in a gemini
	// rate_limit fault's body, for example
	// GenerateRequestsPerDayPerProjectPerModel-FreeTier to script a
	// spent per-day quota; in the vertex dialect, the quota named by a
	// per_minute or per_day Quota's message (after
	// "aiplatform.googleapis.com/"). Ignored by other kinds and dialects.
	// Default: GenerateRequestsPerMinutePerProjectPerModel-FreeTier
	// (gemini); generate_content_requests_per_minute_per_project_per_base_model
	// or generate_content_requests_per_day_per_project_per_base_model
	// (vertex).
	QuotaID string `json:"quota_id,omitempty"`

	// Quota is which limit a rate_limit fault reports exhausted. In the
	// bedrock dialect "requests" ("Too many requests, please wait
	// before trying again."), "tokens" ("Too many tokens, please wait
	// before trying again.") or "tokens_per_day" ("Too many tokens per
	// day, please wait before trying again."); in the vertex dialect
	// "shared" (the dynamic shared quota: "Resource exhausted. Please
	// try again later. ..."), "per_minute" or "per_day" (a project
	// quota of the base model: "Quota exceeded for
	// aiplatform.googleapis.com/<quota> with base model: <model>. ...",
	// <quota> as QuotaID says). Other dialects reject it.
	// Default: "requests" (bedrock), "shared" (vertex).
	Quota string `json:"quota,omitempty"`

	// Delay is how much later a slow fault's answer comes: see Kind.
	// Required, and positive, for slow; other kinds refuse it.
	// Unit: duration.
	Delay caddy.Duration `json:"delay,omitempty"`
}

// slowDelay is the delay of f when it is a slow fault, else 0; f may
// be nil.
func (f *Fault) slowDelay() time.Duration {
	if f == nil || f.Kind != FaultSlow {
		return 0
	}
	return time.Duration(f.Delay)
}

// Values of Fault.Quota.
const (
	QuotaRequests  = "requests"       // bedrock
	QuotaTokens    = "tokens"         // bedrock
	QuotaTokensDay = "tokens_per_day" // bedrock
	QuotaShared    = "shared"         // vertex
	QuotaPerMinute = "per_minute"     // vertex
	QuotaPerDay    = "per_day"        // vertex
)

// validateQuota checks Quota against dialect dl.
func (f *Fault) validateQuota(dl int) error {
	if f.Quota == "" {
		return nil
	}
	switch dl {
	case dlBedrock:
		if f.Quota == QuotaRequests || f.Quota == QuotaTokens || f.Quota == QuotaTokensDay {
			return nil
		}
		return fmt.Errorf("quota %q is not a bedrock quota (want requests, tokens or tokens_per_day)", f.Quota)
	case dlVertex:
		if f.Quota == QuotaShared || f.Quota == QuotaPerMinute || f.Quota == QuotaPerDay {
			return nil
		}
		return fmt.Errorf("quota %q is not a vertex quota (want shared, per_minute or per_day)", f.Quota)
	}
	return fmt.Errorf("quota is only used by the bedrock and vertex dialects")
}

func (f *Fault) validate() error {
	switch f.Kind {
	case FaultRateLimit, FaultStatus, FaultHang, FaultCut, FaultErrorEvent, FaultKeepAlive, FaultStall, FaultMalformed, FaultSlow:
	case "":
		return errors.New("kind is required")
	default:
		return fmt.Errorf("unknown kind %q (want rate_limit, status, hang, cut, error_event, keepalive, stall, malformed or slow)", f.Kind)
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
	case f.Kind == FaultSlow && f.Delay <= 0:
		return fmt.Errorf("delay must be positive, got %s", time.Duration(f.Delay))
	case f.Kind != FaultSlow && f.Delay != 0:
		return errors.New("delay is only used by slow faults")
	}
	if f.Quota != "" && !knownQuota(f.Quota) {
		return fmt.Errorf("unknown quota %q (want requests, tokens, tokens_per_day, shared, per_minute or per_day)", f.Quota)
	}
	return nil
}

// knownQuota reports whether q is a value of Fault.Quota.
func knownQuota(q string) bool {
	switch q {
	case QuotaRequests, QuotaTokens, QuotaTokensDay, QuotaShared, QuotaPerMinute, QuotaPerDay:
		return true
	}
	return false
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

// writeFaultRateLimit answers with a rate_limit fault; lim is the
// window after this request was counted.
func (h *Handler) writeFaultRateLimit(w http.ResponseWriter, f *Fault, lim limitState, model string) {
	code := statusOr(f.Status, http.StatusTooManyRequests)
	retry := time.Duration(f.RetryDelay)
	switch h.dialect {
	case dlBedrock:
		if retry > 0 && w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(retry), 10))
		}
		msg := bedrockTooManyRequests
		switch f.Quota {
		case QuotaTokens:
			msg = bedrockTooManyTokens
		case QuotaTokensDay:
			msg = bedrockTooManyTokensDay
		}
		writeBedrockFault(w, f, code, "ThrottlingException", msg)
		return
	case dlVertex:
		body := []byte(f.Body)
		if f.Body == "" {
			body = vertexQuotaError(code, f.Quota, f.QuotaID, model, retry)
		}
		writeBody(w, code, body)
		return
	}
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

// writeStatusFault answers with the error of a status fault (or a plain
// bedrock error_event) of status code, in the format of wire.
func (h *Handler) writeStatusFault(w http.ResponseWriter, f *Fault, code, wire int) {
	if h.dialect == dlBedrock {
		typ, msg := bedrockStatusError(code)
		writeBedrockFault(w, f, code, typ, msg)
		return
	}
	body := []byte(f.Body)
	if f.Body == "" {
		body = h.statusBody(code, wire)
	}
	writeBody(w, code, body)
}

// statusBody is the error body of a status fault (not bedrock).
func (h *Handler) statusBody(code, wire int) []byte {
	switch wire {
	case wireAnthropic:
		return anthropicStatusError(code)
	case wireGemini:
		return googleError(code, geminiStatusMessage(code))
	}
	return errorBody("mock status "+strconv.Itoa(code), "server_error", "")
}

// errorEventStatus is the default status of a plain error_event answer.
func (h *Handler) errorEventStatus(wire int) int {
	switch {
	case h.dialect == dlBedrock:
		return http.StatusServiceUnavailable
	case wire == wireAnthropic:
		return statusOverloaded
	case wire == wireGemini:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// errorPayload is the error an error_event fault sends: in a stream
// the payload of the error event, else the body.
func (h *Handler) errorPayload(f *Fault, wire int) []byte {
	if f.Body != "" {
		return []byte(f.Body)
	}
	switch {
	case h.dialect == dlBedrock:
		_, msg := bedrockStreamException(f.Status)
		return bedrockMessage(msg)
	case wire == wireAnthropic:
		return anthropicError("overloaded_error", "Overloaded")
	case wire == wireGemini:
		return []byte(geminiOverloadedEvent)
	}
	return errorBody("The server had an error while processing your request.", "server_error", "")
}
