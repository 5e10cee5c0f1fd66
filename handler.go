package llmrouter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Response headers that tell the client which deployment answered.
const (
	HeaderDeployment = "X-LLM-Router-Deployment"
	HeaderAttempts   = "X-LLM-Router-Attempts"
)

// ServeHTTP answers the LLM API paths; anything else goes to next:
//
//	POST .../chat/completions  OpenAI Chat Completions (streaming or not)
//	POST .../embeddings        OpenAI embeddings
//	POST .../messages          Anthropic Messages (streaming or not)
//	GET  .../models[/{id}]     the model groups
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	path := strings.TrimSuffix(r.URL.Path, "/")
	var serve func(http.ResponseWriter, *http.Request) error
	in := openAIFormat
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		serve = h.serveChat
	case strings.HasSuffix(path, "/embeddings"):
		serve = h.serveEmbeddings
	case strings.HasSuffix(path, "/messages"):
		serve, in = h.serveMessages, anthropicFormat
	case strings.HasSuffix(path, "/models") && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		return h.serveModels(w)
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		// GET .../models/{id}: one model group, as the SDKs' models.retrieve asks.
		if i := strings.LastIndex(path, "/models/"); i >= 0 {
			return h.serveModel(w, path[i+len("/models/"):])
		}
		return next.ServeHTTP(w, r)
	default:
		return next.ServeHTTP(w, r)
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		in.writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "", "use POST")
		return nil
	}
	return serve(w, r)
}

// format is a client API's way of writing errors and answers.
type format uint8

const (
	openAIFormat    format = iota // {"error":{"message","type","param","code"}}
	anthropicFormat               // {"type":"error","error":{"type","message"}}
)

// writeError answers with an error in the client's format. typ and code are
// OpenAI's; the Anthropic format takes its type from the status.
func (f format) writeError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	if f == anthropicFormat {
		writeBody(w, status, adapters.AnthropicError(adapters.AnthropicErrorType(status), msg))
		return
	}
	writeError(w, status, typ, code, param, msg)
}

// chatRequest is what routing needs of a Chat Completions body; the rest is
// passed upstream untouched.
type chatRequest struct {
	Model               string        `json:"model"`
	Messages            []chatMessage `json:"messages"`
	Stream              bool          `json:"stream"`
	N                   *int          `json:"n"`
	MaxTokens           *int64        `json:"max_tokens"`
	MaxCompletionTokens *int64        `json:"max_completion_tokens"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// chatMessage is checked for shape only; content goes upstream untouched.
type chatMessage struct {
	Role string `json:"role"`
}

// routingKeys are the body keys the router reads: each must appear at most
// once and spelled exactly so, or the provider might read another value.
var routingKeys = []string{"model", "messages", "stream", "n", "max_tokens", "max_completion_tokens", "stream_options"}

// readJSON reads a request body for any of the API paths, answering the
// client itself (false) when it cannot be read.
func (h *Handler) readJSON(w http.ResponseWriter, r *http.Request, in format) ([]byte, bool) {
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		in.writeError(w, http.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_encoding", "",
			"request bodies with Content-Encoding are not accepted; send plain JSON")
		return nil, false
	}
	body, err := readBody(w, r, h.MaxBody)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			in.writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
				fmt.Sprintf("request body exceeds %d bytes", h.MaxBody))
			return nil, false
		}
		in.writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "", "could not read the request body")
		return nil, false
	}
	return body, true
}

// decode unmarshals body into v and checks its routing keys, answering a
// 400 (false) when it does not fit.
func decode(w http.ResponseWriter, in format, body []byte, v any, keys ...string) bool {
	if err := json.Unmarshal(body, v); err != nil {
		param, msg := "", "the request body is not valid JSON"
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			param, msg = typeErr.Field, "the request body must be a JSON object"
			if typeErr.Field != "" {
				msg = fmt.Sprintf("invalid type for '%s': expected %s", typeErr.Field, jsonKind(typeErr))
			}
		}
		in.writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", param, msg)
		return false
	}
	if err := adapters.CheckKeys(body, keys...); err != nil {
		in.writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", err.Error())
		return false
	}
	return true
}

// lookup finds a model group, answering a 404 (false) when there is none.
func (h *Handler) lookup(w http.ResponseWriter, in format, model string) ([]*router.Deployment, bool) {
	if model == "" {
		in.writeError(w, http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "model",
			"you must provide a model parameter")
		return nil, false
	}
	group, ok := h.groups[model]
	if !ok {
		in.writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			fmt.Sprintf("the model %s does not exist; GET /v1/models lists the model groups", strconv.Quote(truncate(model, 100))))
	}
	return group, ok
}

func (h *Handler) serveChat(w http.ResponseWriter, r *http.Request) error {
	body, ok := h.readJSON(w, r, openAIFormat)
	if !ok {
		return nil
	}
	var req chatRequest
	if !decode(w, openAIFormat, body, &req, routingKeys...) {
		return nil
	}
	if len(req.Messages) == 0 && req.Model != "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "messages",
			"'messages' must be a non-empty array")
		return nil
	}
	for i, m := range req.Messages {
		if m.Role == "" {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_value", fmt.Sprintf("messages[%d]", i),
				fmt.Sprintf("messages[%d] must be an object with a role", i))
			return nil
		}
	}
	if req.N != nil && (*req.N < 1 || *req.N > 128) {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_value", "n", "'n' must be between 1 and 128")
		return nil
	}
	group, ok := h.lookup(w, openAIFormat, req.Model)
	if !ok {
		return nil
	}
	rreq := &router.Request{Body: body, Stream: req.Stream, Choices: 1, PromptTokens: int64(len(body))/4 + 1}
	if req.MaxCompletionTokens != nil && *req.MaxCompletionTokens > 0 {
		rreq.OutputTokens = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil && *req.MaxTokens > 0 {
		rreq.OutputTokens = *req.MaxTokens
	}
	if req.N != nil {
		rreq.Choices = *req.N
	}
	if req.StreamOptions != nil {
		rreq.IncludeUsage = req.StreamOptions.IncludeUsage
	}
	return h.answer(w, r, openAIFormat, req.Model, group, rreq)
}

func (h *Handler) serveEmbeddings(w http.ResponseWriter, r *http.Request) error {
	body, ok := h.readJSON(w, r, openAIFormat)
	if !ok {
		return nil
	}
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if !decode(w, openAIFormat, body, &req, "model", "input") {
		return nil
	}
	group, ok := h.lookup(w, openAIFormat, req.Model)
	if !ok {
		return nil
	}
	if !slices.ContainsFunc(group, func(d *router.Deployment) bool { _, ok := d.Adapter.(adapters.Embedder); return ok }) {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "model_not_supported", "model",
			fmt.Sprintf("the model %s has no deployment that serves embeddings", strconv.Quote(truncate(req.Model, 100))))
		return nil
	}
	if len(req.Input) == 0 || string(req.Input) == "null" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "input",
			"you must provide an input parameter")
		return nil
	}
	return h.answer(w, r, openAIFormat, req.Model, group, &router.Request{
		Kind: router.Embeddings, Body: body, PromptTokens: int64(len(body))/4 + 1,
	})
}

// serveMessages answers Anthropic Messages requests over the same model
// groups: natively on anthropic deployments, translated for the others.
func (h *Handler) serveMessages(w http.ResponseWriter, r *http.Request) error {
	body, ok := h.readJSON(w, r, anthropicFormat)
	if !ok {
		return nil
	}
	var req struct {
		Model     string            `json:"model"`
		Messages  []json.RawMessage `json:"messages"`
		Stream    bool              `json:"stream"`
		MaxTokens int64             `json:"max_tokens"`
	}
	if !decode(w, anthropicFormat, body, &req, "model", "messages", "stream", "max_tokens", "system") {
		return nil
	}
	group, ok := h.lookup(w, anthropicFormat, req.Model)
	if !ok {
		return nil
	}
	if len(req.Messages) == 0 || req.MaxTokens <= 0 {
		anthropicFormat.writeError(w, http.StatusBadRequest, "", "", "", "messages (a non-empty array) and max_tokens (> 0) are required")
		return nil
	}
	// The Chat Completions form, for deployments of other formats. A request
	// it cannot express (a server tool, say) still goes to the group's
	// anthropic deployments, natively; only without any is it a 400.
	chat, _, _, err := adapters.MessagesToChat(body)
	if err != nil && !hasNative(group, "anthropic") {
		anthropicFormat.writeError(w, http.StatusBadRequest, "", "", "", err.Error())
		return nil
	}
	header := http.Header{}
	for _, k := range adapters.NativeHeaders["anthropic"] {
		if v := r.Header.Values(k); len(v) > 0 {
			header[k] = v
		}
	}
	return h.answer(w, r, anthropicFormat, req.Model, group, &router.Request{
		Body: chat, Stream: req.Stream, Choices: 1, PromptTokens: int64(len(body))/4 + 1, OutputTokens: req.MaxTokens,
		// The translation asks OpenAI-format providers for usage.
		IncludeUsage: req.Stream, NativeFormat: "anthropic", NativeBody: body, NativeHeader: header,
	})
}

// hasNative reports whether a deployment of group takes format natively.
func hasNative(group []*router.Deployment, format string) bool {
	for _, d := range group {
		if n, ok := d.Adapter.(adapters.Native); ok && n.NativeFormat() == format {
			return true
		}
	}
	return false
}

// answer routes rreq over group and writes the outcome in the client's format.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, in format, model string, group []*router.Deployment, rreq *router.Request) error {
	rreq.Tokens = rreq.PromptTokens + rreq.OutputTokens
	res := h.router.Serve(r.Context(), group, rreq)
	h.annotate(r, res)
	if errors.Is(res.Err, router.ErrClientGone) {
		h.count(model, res, 499) // nginx's "client closed request"
		return nil
	}
	var rerr *router.Error
	if errors.As(res.Err, &rerr) {
		h.count(model, res, rerr.Status)
		setRouterHeaders(w, res)
		if rerr.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(rerr.RetryAfter/time.Second)))
		}
		in.writeError(w, rerr.Status, rerr.Type, rerr.Code, "", rerr.Message)
		return nil
	}
	h.count(model, res, res.Status)
	setRouterHeaders(w, res)
	if res.Stream != nil {
		return h.relay(w, in, res)
	}
	body := res.Body
	if in == anthropicFormat && !res.Native {
		if res.Status >= 300 {
			// A provider's client error, as an OpenAI error body: restate it.
			var e errorBody
			_ = json.Unmarshal(body, &e)
			body = adapters.AnthropicError(adapters.AnthropicErrorType(res.Status), e.Error.Message)
		} else if msg, err := adapters.ChatToMessages(body); err == nil {
			body = msg
		} else {
			in.writeError(w, http.StatusBadGateway, "server_error", "upstream_unavailable", "", "the answer could not be translated")
			return nil
		}
	}
	writeBody(w, res.Status, body)
	return nil
}

// relay writes a committed stream as server-sent events in the client's
// format, flushing each. A failure after the first byte ends the stream
// with an in-band error event and no terminator ("[DONE]", message_stop),
// so no client takes a cut answer for a complete one.
func (h *Handler) relay(w http.ResponseWriter, in format, res *router.Result) error {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	write := func(b []byte) error {
		if len(b) == 0 {
			return nil
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	var event func(data []byte, done bool) error
	switch {
	case in == openAIFormat:
		event = func(data []byte, done bool) error {
			if done {
				return write([]byte("data: [DONE]\n\n"))
			}
			return write(append(append([]byte("data: "), data...), '\n', '\n'))
		}
	case res.Stream.Native():
		// The provider's own Messages events, as they come; a stream that was
		// complete without its message_stop gets one.
		stopped := false
		event = func(data []byte, done bool) error {
			if done {
				if stopped {
					return nil
				}
				return write([]byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
			}
			stopped = bytes.HasPrefix(data, []byte("event: message_stop"))
			return write(data)
		}
	default:
		enc := adapters.NewMessagesStreamEncoder()
		event = func(data []byte, done bool) error {
			if done {
				return write(enc.Done())
			}
			return write(enc.Chunk(data))
		}
	}
	err := res.Stream.Relay(event)
	var se *router.StreamError
	if errors.As(err, &se) {
		msg := "the upstream stream failed after it began: " + se.Message
		if in == anthropicFormat {
			typ := "api_error"
			switch se.Class {
			case provider.Overloaded:
				typ = "overloaded_error"
			case provider.RateLimited:
				typ = "rate_limit_error"
			}
			_ = write(adapters.MessagesStreamError(typ, msg))
		} else {
			payload, _ := json.Marshal(errorBody{Error: errorDetail{Message: msg, Type: "server_error", Code: "stream_interrupted"}})
			_ = write(append(append([]byte("data: "), payload...), '\n', '\n'))
		}
	} else if err != nil {
		h.logger.Debug("client went away mid-stream", zap.String("deployment", res.Deployment.Name), zap.Error(err))
	}
	return nil
}

func (h *Handler) serveModels(w http.ResponseWriter) error {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: make([]model, 0, len(h.names))}
	for _, n := range h.names {
		list.Data = append(list.Data, model{ID: n, Object: "model", OwnedBy: "llm_router"})
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(list)
}

func (h *Handler) serveModel(w http.ResponseWriter, id string) error {
	if _, ok := h.groups[id]; !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			fmt.Sprintf("the model %s does not exist", strconv.Quote(truncate(id, 100))))
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}{id, "model", 0, "llm_router"})
}

// jsonKind names the JSON type a field needed, for error messages.
func jsonKind(e *json.UnmarshalTypeError) string {
	switch e.Type.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int64, reflect.Pointer:
		return "an integer"
	case reflect.Slice:
		return "an array"
	case reflect.Struct:
		return "an object"
	}
	return "another type"
}

// annotate sets the placeholders and adds the same facts to Caddy's access
// log entry for the request.
func (h *Handler) annotate(r *http.Request, res *router.Result) {
	name := ""
	if res.Deployment != nil {
		name = res.Deployment.Name
	}
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set("http.llm_router.deployment", name)
		repl.Set("http.llm_router.attempts", res.Attempts)
		repl.Set("http.llm_router.failover_reason", res.FailoverReason)
	}
	if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
		extra.Set(zap.String("llm_deployment", name))
		extra.Set(zap.Int("llm_attempts", res.Attempts))
		extra.Set(zap.String("llm_failover_reason", res.FailoverReason))
	}
}

// count adds the request to llm_router_requests_total.
func (h *Handler) count(group string, res *router.Result, status int) {
	name := ""
	if res.Deployment != nil {
		name = res.Deployment.Name
	}
	h.metrics.request(group, name, status)
}

func setRouterHeaders(w http.ResponseWriter, res *router.Result) {
	if res.Deployment != nil {
		w.Header().Set(HeaderDeployment, res.Deployment.Name)
	}
	w.Header().Set(HeaderAttempts, strconv.Itoa(res.Attempts))
}

// readBody reads the whole body, at most limit bytes (else an
// *http.MaxBytesError).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// One allocation of the announced size (+1 to see the end) instead
		// of io.ReadAll's doubling from 512 bytes.
		buf.Grow(int(r.ContentLength) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	return buf.Bytes(), err
}

// errorBody is the OpenAI error format.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// writeError answers with an OpenAI-format error.
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	var p *string
	if param != "" {
		p = &param
	}
	b, _ := json.Marshal(errorBody{Error: errorDetail{Message: msg, Type: typ, Param: p, Code: code}})
	writeBody(w, status, b)
}

// writeBody answers with a JSON body.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
