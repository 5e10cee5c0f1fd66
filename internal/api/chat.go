package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Chat is OpenAI's Chat Completions API
// (https://platform.openai.com/docs/api-reference/chat): POST
// .../chat/completions, streamed or not; errors as
// {"error":{"message","type","param","code"}}.
type Chat struct{}

// chatRouting is what routing needs of a Chat Completions body; the rest
// goes upstream untouched.
type chatRouting struct {
	Model    string `json:"model"`
	Messages []struct {
		Role string `json:"role"`
	} `json:"messages"`
	Stream              bool   `json:"stream"`
	N                   *int   `json:"n"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// chatKeys are the body keys the router reads: each must appear at most
// once and spelled exactly so, or the provider might read another value.
var chatKeys = []string{"model", "messages", "stream", "n", "max_tokens", "max_completion_tokens", "stream_options"}

// Format implements API.
func (Chat) Format() provider.Format { return provider.Chat }

// Parse implements API: a JSON object with a model and a non-empty
// messages array of objects with a role, n within 1..128.
func (Chat) Parse(body []byte, _ http.Header) (*router.Request, string, *Error) {
	var req chatRouting
	if e := decode(body, &req, chatKeys...); e != nil {
		return nil, "", e
	}
	if req.Model == "" {
		return nil, "", missingModel()
	}
	if len(req.Messages) == 0 {
		return nil, "", Errorf(http.StatusBadRequest, MissingParameter, "messages", "'messages' must be a non-empty array")
	}
	for i, m := range req.Messages {
		if m.Role == "" {
			return nil, "", Errorf(http.StatusBadRequest, InvalidValue, fmt.Sprintf("messages[%d]", i),
				"messages[%d] must be an object with a role", i)
		}
	}
	if req.N != nil && (*req.N < 1 || *req.N > 128) {
		return nil, "", Errorf(http.StatusBadRequest, InvalidValue, "n", "'n' must be between 1 and 128")
	}
	pr := &provider.Request{Format: provider.Chat, Body: body, Stream: req.Stream, Choices: 1}
	if req.N != nil {
		pr.Choices = *req.N
	}
	if req.StreamOptions != nil {
		pr.IncludeUsage = req.StreamOptions.IncludeUsage
	}
	rr := &router.Request{Request: pr, PromptTokens: promptTokens(body)}
	if req.MaxCompletionTokens != nil && *req.MaxCompletionTokens > 0 {
		rr.OutputTokens = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil && *req.MaxTokens > 0 {
		rr.OutputTokens = *req.MaxTokens
	}
	rr.Tokens = rr.PromptTokens + rr.OutputTokens
	return rr, req.Model, nil
}

// promptTokens estimates a body's prompt tokens: bytes / 4.
func promptTokens(body []byte) int64 { return int64(len(body))/4 + 1 }

func missingModel() *Error {
	return Errorf(http.StatusBadRequest, MissingParameter, "model", "you must provide a model parameter")
}

// WriteError implements API.
func (c Chat) WriteError(w http.ResponseWriter, e *Error) { writeError(w, c, e) }

// Write implements API.
func (c Chat) Write(w http.ResponseWriter, res *router.Result) error { return write(w, c, res) }

// chatErrors gives each code its error type and code.
var chatErrors = map[Code][2]string{
	InvalidBody:         {"invalid_request_error", "invalid_body"},
	InvalidJSON:         {"invalid_request_error", "invalid_json"},
	MissingParameter:    {"invalid_request_error", "missing_required_parameter"},
	InvalidValue:        {"invalid_request_error", "invalid_value"},
	MethodNotAllowed:    {"invalid_request_error", "method_not_allowed"},
	BodyTooLarge:        {"invalid_request_error", "request_too_large"},
	UnsupportedEncoding: {"invalid_request_error", "unsupported_encoding"},
	ModelNotFound:       {"invalid_request_error", "model_not_found"},
	ModelNotSupported:   {"invalid_request_error", "model_not_supported"},
	Unsupported:         {"invalid_request_error", "unsupported_request"},
	RateLimited:         {"rate_limit_error", "rate_limit_exceeded"},
	Unavailable:         {"server_error", "upstream_unavailable"},
	Deadline:            {"timeout", "deadline_exceeded"},
	Untranslatable:      {"server_error", "upstream_unavailable"},
}

func (Chat) errorBody(e *Error) []byte {
	t := chatErrors[e.Code]
	return chat.NewError(e.Message, t[0], t[1], e.Param)
}

// restate writes a provider's client error in OpenAI's format: the type by
// class, the code that says the same as the class ("context_length_exceeded")
// or else the provider's own.
func (Chat) restate(_ int, said *provider.Observation) []byte {
	typ, code := "server_error", ""
	switch said.Class {
	case provider.ClientError:
		typ = "invalid_request_error"
	case provider.ContextLength:
		typ, code = "invalid_request_error", "context_length_exceeded"
	case provider.Auth:
		typ, code = "authentication_error", "invalid_api_key"
	case provider.RateLimited:
		typ, code = "rate_limit_error", "rate_limit_exceeded"
	case provider.QuotaExhausted:
		typ, code = "insufficient_quota", "insufficient_quota"
	case provider.Overloaded:
		code = "overloaded"
	}
	if code == "" {
		code = strings.ToLower(said.Code)
	}
	return chat.NewError(said.Message, typ, code, "")
}

func (Chat) fromChat(body []byte) ([]byte, error) { return body, nil }

func (Chat) newStream(provider.Format) streamWriter { return chatStream{} }

// chatStream writes chunks as "data: <chunk>" events, then "data: [DONE]".
type chatStream struct{}

func (chatStream) event(dst []byte, ev provider.Event) []byte {
	return provider.AppendEvent(dst, "", ev.Data)
}

func (chatStream) done(dst []byte) []byte { return append(dst, "data: [DONE]\n\n"...) }

func (chatStream) failed(dst []byte, e *router.StreamError) []byte {
	return provider.AppendEvent(dst, "", chat.NewError(streamFailure(e), "server_error", "stream_interrupted", ""))
}

// decode unmarshals body into v and checks its routing keys: a 400
// invalid_json when it does not fit.
func decode(body []byte, v any, keys ...string) *Error {
	if err := json.Unmarshal(body, v); err != nil {
		param, msg := "", "the request body is not valid JSON"
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			param, msg = typeErr.Field, "the request body must be a JSON object"
			if typeErr.Field != "" {
				msg = fmt.Sprintf("invalid type for '%s': expected %s", typeErr.Field, jsonKind(typeErr))
			}
		}
		return Errorf(http.StatusBadRequest, InvalidJSON, param, "%s", msg)
	}
	if err := jsonbody.CheckKeys(body, keys...); err != nil {
		return Errorf(http.StatusBadRequest, InvalidJSON, "", "%s", err.Error())
	}
	return nil
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

// WriteModels answers GET .../models: the model groups, as OpenAI lists
// models.
func WriteModels(w http.ResponseWriter, names []string) error {
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: make([]model, 0, len(names))}
	for _, n := range names {
		list.Data = append(list.Data, model{ID: n, Object: "model", OwnedBy: "llm_router"})
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(list)
}

// WriteModel answers GET .../models/{id}: one model group, as the SDKs'
// models.retrieve asks; a 404 when there is no such group.
func WriteModel(w http.ResponseWriter, id string, exists bool) error {
	if !exists {
		Chat{}.WriteError(w, Errorf(http.StatusNotFound, ModelNotFound, "model", "the model %q does not exist", truncate(id, 100)))
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(model{ID: id, Object: "model", OwnedBy: "llm_router"})
}

type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}
