// Package api holds the client APIs: the formats clients speak to the
// router. Each API parses and validates a request body into a
// router.Request, and writes the router's result (an answer, a stream, a
// provider's client error passed on, or the router's own error) in its
// format; below this package nothing speaks a client's format: Chat
// (OpenAI Chat Completions), Embeddings, Messages (Anthropic's), Responses
// (OpenAI's) and Completions (OpenAI's legacy completions).
//
// Endpoints (paths.go) lists every path the router serves, these APIs'
// and the others, once: ForPath routes by it, the 404 and the docs list
// it.
//
// An answer comes from the router in the attempt's format (Result.Format):
// the client's own when the provider took the request natively, passed on
// as it came, or Chat, which every API translates into its own.
//
// It imports neither Caddy nor the root package.
package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/excerpt"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// API is one client API.
type API interface {
	// Format is the API's wire format.
	Format() provider.Format
	// Parse reads a request body, and the client's headers, into a router
	// request and the model group it names. A body that does not fit is an
	// *Error (400) and changes nothing.
	Parse(body []byte, header http.Header) (*router.Request, string, *Error)
	// WriteError answers with e in the API's format.
	WriteError(w http.ResponseWriter, e *Error)
	// Write answers with the router's result. It returns an error only when
	// the client went away while a stream was relayed.
	Write(w http.ResponseWriter, res *router.Result) error
}

// Code says why a request is refused, whichever API writes it; each API
// turns it into its own error type (and code).
type Code uint8

// The codes.
const (
	// Requests refused before routing.
	InvalidBody         Code = iota + 1 // the body could not be read
	InvalidJSON                         // not JSON, wrong types, duplicate or miscased routing keys
	MissingParameter                    // a required field is absent or empty (Param)
	InvalidValue                        // a field's value is out of range (Param)
	MethodNotAllowed                    // not a POST
	BodyTooLarge                        // over max_body
	UnsupportedEncoding                 // a Content-Encoding body
	UnsupportedMedia                    // a Content-Type that is not JSON (CheckJSON)
	ModelNotFound                       // no such model group
	ModelNotSupported                   // the group has no deployment that serves the API
	NotFound                            // a path the router does not serve
	ResponseNotFound                    // a Responses API response the router cannot reach (OpenAI's 404: code null)
	PreviousNotFound                    // a previous_response_id the consumer may not continue (OpenAI's 400 previous_response_not_found)
	CrossOrigin                         // a pass_through request a page on another origin sent without a CORS preflight
	WebSocketRefused                    // a WebSocket upgrade the router does not serve (426)
	Unauthorized                        // no API key, or one the router's keys do not know (401)
	Forbidden                           // a model group the consumer's plan does not allow (403)
	// The router's own answers (router.Error).
	Unsupported    // no deployment could express the request
	ContextTooLong // the request is larger than every deployment's context window
	RateLimited    // every deployment is rate-limited
	Unavailable    // every deployment failed
	Deadline       // the deadline passed
	// An answer that could not be translated into the client's format.
	Untranslatable
)

// Error is a refusal or a failure the router answers itself, in the
// client's format, with x-should-retry: false (see writeError) unless
// Retryable.
type Error struct {
	Status  int
	Code    Code
	Param   string
	Message string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds).
	RetryAfter time.Duration
	// Retryable leaves the client's own retry policy alone (no
	// x-should-retry): the router made one attempt and did not retry it
	// (pass_through's provider could not be reached), so the client's
	// retry is the only one; or a consumer's limit admits the request
	// again after a RetryAfter the SDKs sleep (the root's
	// maxSDKRetryAfter).
	Retryable bool
}

func (e *Error) Error() string { return e.Message }

// Errorf returns an *Error of status and code with a formatted message.
func Errorf(status int, code Code, param, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// ModelNotFoundError is the 404 for an unknown model group.
func ModelNotFoundError(model string) *Error {
	return Errorf(http.StatusNotFound, ModelNotFound, "model",
		"the model %s does not exist; GET /v1/models lists the model groups", strconv.Quote(excerpt.Of(model, 100)))
}

// NotSupportedError is the 400 for a model group none of whose
// deployments serves format f.
func NotSupportedError(model string, f provider.Format) *Error {
	return Errorf(http.StatusBadRequest, ModelNotSupported, "model",
		"the model %s has no deployment that serves %s", strconv.Quote(excerpt.Of(model, 100)), f)
}

// MethodError is the 405 for anything but a POST.
var MethodError = &Error{Status: http.StatusMethodNotAllowed, Code: MethodNotAllowed, Message: "use POST"}

// fromRouter turns the router's own error into the client's.
func fromRouter(e *router.Error) *Error {
	out := &Error{Status: e.Status, Message: e.Message, RetryAfter: e.RetryAfter}
	switch e.Class {
	case provider.ClientError:
		out.Code = Unsupported
	case provider.ContextLength:
		out.Code = ContextTooLong
	case provider.RateLimited, provider.QuotaExhausted:
		out.Code = RateLimited
	case provider.Transport:
		out.Code = Deadline // the router's only transport error
	default:
		out.Code = Unavailable
	}
	return out
}

// ReadBody reads a request body, at most limit bytes; what does not fit
// (a Content-Type that is not JSON: see CheckJSON; an encoded body, one
// over limit, a broken read) is an *Error.
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *Error) {
	if e := CheckJSON(r.Header.Get("Content-Type")); e != nil {
		return nil, e
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return nil, Errorf(http.StatusUnsupportedMediaType, UnsupportedEncoding, "",
			"request bodies with Content-Encoding are not accepted; send plain JSON")
	}
	tooLarge := func() *Error {
		return Errorf(http.StatusRequestEntityTooLarge, BodyTooLarge, "", "request body exceeds %d bytes", limit)
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// One allocation of the announced size (+1 to see the end) instead
		// of io.ReadAll's doubling from 512 bytes.
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, Errorf(http.StatusBadRequest, InvalidBody, "", "could not read the request body")
	}
	return buf.Bytes(), nil
}

// CheckJSON checks a request's Content-Type (ct, "" when it has none): nil
// for application/json or a +json type (application/vnd.api+json), in any
// case and with any parameters (charset=utf-8), else the 415 that names
// what was sent and what is accepted. A missing Content-Type is refused
// too: every official SDK (OpenAI's and Anthropic's, in Python, Node and
// Go) sends application/json, and a request that cannot say JSON is what
// a page on another origin can send without the browser asking first (a
// CORS preflight): text/plain, multipart/form-data,
// application/x-www-form-urlencoded (also what curl -d sends), or no
// Content-Type at all (fetch with a Blob or ArrayBuffer body). Such a
// request would otherwise spend the operator's provider accounts.
func CheckJSON(ct string) *Error {
	if mt, _, err := mime.ParseMediaType(ct); err == nil {
		if mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json") {
			return nil
		}
	}
	sent := "no Content-Type"
	if ct != "" {
		sent = "Content-Type " + strconv.Quote(excerpt.Of(ct, 100))
	}
	return Errorf(http.StatusUnsupportedMediaType, UnsupportedMedia, "",
		"request bodies must be JSON, sent with Content-Type application/json (or a +json type; parameters such as charset=utf-8 are fine), "+
			"but the request has %s; with curl, add -H 'Content-Type: application/json'", sent)
}

// format is what the shared writing needs of an API.
type format interface {
	API
	// errorBody is e in the API's error format.
	errorBody(e *Error) []byte
	// restate is a provider's client error (status, and what the provider
	// said) in the API's error format, for an answer in another format.
	restate(status int, said *provider.Observation) []byte
	// isError reports whether body (valid JSON) is an error in the API's
	// format, which a client's SDK can read.
	isError(body []byte) bool
	// fromChat translates a Chat answer into the API's format.
	fromChat(body []byte) ([]byte, error)
	// newStream returns the writer of one stream of the given format.
	newStream(from provider.Format) streamWriter
}

// streamWriter writes one stream's events in the client's format to w
// (the response, which buffers until relay flushes).
type streamWriter interface {
	event(w io.Writer, ev provider.Event) error
	done(w io.Writer) error
	failed(w io.Writer, e *router.StreamError) error
}

// writeError answers with e in f's format, its Retry-After, and
// x-should-retry: false. The official SDKs (OpenAI's and Anthropic's, in
// Python, Node and Go) retry 408, 409, 429 and 5xx twice more unless that
// header says false, and sleep any Retry-After (PROVIDERS.md): an error the
// router answers itself is either a refusal of the request as it is, or a
// give-up after it walked the deployments within the request's deadline,
// and a retry at once would only wait the deadline again. Retry-After, when
// set, is the router's real wait (a reset, a renewal, a circuit's next
// probe), for a client that schedules its own retry. A provider's own error
// passed on (write) is its statement, and gets neither.
func writeError(w http.ResponseWriter, f format, e *Error) {
	if !e.Retryable {
		w.Header().Set("X-Should-Retry", "false")
	}
	if e.RetryAfter > 0 {
		// Rounded up: a client that waits exactly this long comes back
		// after the window renewed, not just before.
		w.Header().Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	writeBody(w, e.Status, f.errorBody(e))
}

// write answers with res in f's format.
func write(w http.ResponseWriter, f format, res *router.Result) error {
	if errors.Is(res.Err, router.ErrClientGone) {
		return nil
	}
	var rerr *router.Error
	if errors.As(res.Err, &rerr) {
		writeError(w, f, fromRouter(rerr))
		return nil
	}
	if res.Stream != nil {
		return relay(w, f.newStream(res.Format), res.Stream)
	}
	body := res.Body
	switch {
	case res.Status >= 300:
		// Passed on as it came only when it is an error in the client's
		// format: a proxy's HTML page, plain text, or an OpenAI-compatible
		// server's own error object (TGI's {"error":"...","error_type":...},
		// Ollama's {"error":"..."}) is restated, its status and message
		// kept, so that the client's SDK reads it.
		if body == nil || res.Format != f.Format() || !json.Valid(body) || !f.isError(body) {
			body = f.restate(res.Status, res.Error)
		}
	case res.Format == f.Format():
	default:
		var err error
		if body, err = f.fromChat(body); err != nil {
			writeError(w, f, Errorf(http.StatusBadGateway, Untranslatable, "", "the answer could not be translated"))
			return nil
		}
	}
	if a, ok := f.(answerer); ok && res.Status < 300 {
		a.answered(res, body)
	}
	writeBody(w, res.Status, body)
	return nil
}

// answerer is a format told of each successful non-streamed answer, as
// the client gets it (Responses: to remember which deployment holds the
// response's state).
type answerer interface {
	answered(res *router.Result, body []byte)
}

// relay writes a committed stream as server-sent events, flushed whenever
// the router is about to wait for the provider (Stream.FlushWaits: events
// that came together go out in one write) and at the end. A failure after
// the first byte ends the stream with an in-band error event and no
// terminator, so that no client takes a cut answer for a complete one.
func relay(w http.ResponseWriter, sw streamWriter, s *router.Stream) error {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	s.FlushWaits(rc.Flush)
	err := s.Relay(func(ev provider.Event, done bool) error {
		if !done {
			return sw.event(w, ev)
		}
		if err := sw.done(w); err != nil {
			return err
		}
		return rc.Flush()
	})
	var se *router.StreamError
	if errors.As(err, &se) {
		if sw.failed(w, se) == nil {
			_ = rc.Flush()
		}
		return nil
	}
	return err
}

// writeBody answers with a JSON body.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// streamFailure is the message of an in-band error that ends a stream:
// the router's own bound (max_stream_bytes) said as it is.
func streamFailure(e *router.StreamError) string {
	if e.Bounded {
		return e.Message
	}
	return "the upstream stream failed after it began: " + e.Message
}
