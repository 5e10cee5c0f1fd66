package llmrouter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/adapters"
	"github.com/llmrouter/caddy-llm-router/router"
)

// Response headers that tell the client which deployment answered.
const (
	HeaderDeployment = "X-LLM-Router-Deployment"
	HeaderAttempts   = "X-LLM-Router-Attempts"
)

// ServeHTTP answers Chat Completions and the model list; anything else goes
// to next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "", "use POST for chat completions")
			return nil
		}
		return h.serveChat(w, r)
	case strings.HasSuffix(path, "/models") && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		return h.serveModels(w)
	case r.Method == http.MethodGet || r.Method == http.MethodHead:
		// GET .../models/{id}: one model group, as the SDKs' models.retrieve asks.
		if i := strings.LastIndex(path, "/models/"); i >= 0 {
			return h.serveModel(w, path[i+len("/models/"):])
		}
	}
	return next.ServeHTTP(w, r)
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

// clientCredentialHeaders are the API-key headers SDKs send. They never go
// upstream (upstream requests are built fresh); they are also dropped from
// the request so Caddy's access log, which redacts only Authorization, does
// not record them.
var clientCredentialHeaders = []string{"X-Api-Key", "Api-Key", "X-Goog-Api-Key"}

func (h *Handler) serveChat(w http.ResponseWriter, r *http.Request) error {
	for _, k := range clientCredentialHeaders {
		r.Header.Del(k)
	}
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		writeError(w, http.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_encoding", "",
			"request bodies with Content-Encoding are not accepted; send plain JSON")
		return nil
	}
	body, err := readBody(w, r, h.MaxBody)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
				fmt.Sprintf("request body exceeds %d bytes", h.MaxBody))
			return nil
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_body", "", "could not read the request body")
		return nil
	}
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		param, msg := "", "the request body is not valid JSON"
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			param, msg = typeErr.Field, "the request body must be a JSON object"
			if typeErr.Field != "" {
				msg = fmt.Sprintf("invalid type for '%s': expected %s", typeErr.Field, jsonKind(typeErr))
			}
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", param, msg)
		return nil
	}
	if err := adapters.CheckKeys(body, routingKeys...); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "", err.Error())
		return nil
	}
	if req.Model == "" {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", "model",
			"you must provide a model parameter")
		return nil
	}
	if len(req.Messages) == 0 {
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
	group, ok := h.groups[req.Model]
	if !ok {
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			fmt.Sprintf("the model %s does not exist; GET /v1/models lists the model groups", strconv.Quote(truncate(req.Model, 100))))
		return nil
	}

	rreq := &router.Request{Body: body, Stream: req.Stream, Choices: 1, PromptTokens: int64(len(body))/4 + 1}
	if req.MaxCompletionTokens != nil && *req.MaxCompletionTokens > 0 {
		rreq.OutputTokens = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil && *req.MaxTokens > 0 {
		rreq.OutputTokens = *req.MaxTokens
	}
	rreq.Tokens = rreq.PromptTokens + rreq.OutputTokens
	if req.N != nil {
		rreq.Choices = *req.N
	}
	if req.StreamOptions != nil {
		rreq.IncludeUsage = req.StreamOptions.IncludeUsage
	}
	res := h.router.Serve(r.Context(), group, rreq)
	h.annotate(r, res)
	if errors.Is(res.Err, router.ErrClientGone) {
		h.count(req.Model, res, 499) // nginx's "client closed request"
		return nil
	}
	var rerr *router.Error
	if errors.As(res.Err, &rerr) {
		h.count(req.Model, res, rerr.Status)
		setRouterHeaders(w, res)
		if rerr.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(rerr.RetryAfter/time.Second)))
		}
		writeError(w, rerr.Status, rerr.Type, rerr.Code, "", rerr.Message)
		return nil
	}
	h.count(req.Model, res, res.Status)
	if res.Stream != nil {
		return h.relay(w, r, res)
	}
	setRouterHeaders(w, res)
	ct := "application/json"
	if res.Header != nil && res.Header.Get("Content-Type") != "" && res.Status >= 300 {
		ct = res.Header.Get("Content-Type")
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
	return nil
}

// relay writes a committed stream as server-sent events, flushing each. A
// failure after the first byte ends the stream with an in-band error event
// and no "[DONE]", so no client takes a cut answer for a complete one.
func (h *Handler) relay(w http.ResponseWriter, r *http.Request, res *router.Result) error {
	setRouterHeaders(w, res)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	err := res.Stream.Relay(func(data []byte, done bool) error {
		var werr error
		if done {
			_, werr = w.Write([]byte("data: [DONE]\n\n"))
		} else {
			_, werr = w.Write(append(append([]byte("data: "), data...), '\n', '\n'))
		}
		if werr != nil {
			return werr
		}
		return rc.Flush()
	})
	var se *router.StreamError
	if errors.As(err, &se) {
		payload, _ := json.Marshal(errorBody{Error: errorDetail{
			Message: "the upstream stream failed after it began: " + se.Message,
			Type:    "server_error", Code: "stream_interrupted",
		}})
		_, _ = w.Write(append(append([]byte("data: "), payload...), '\n', '\n'))
		_ = rc.Flush()
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
	return io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
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
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
