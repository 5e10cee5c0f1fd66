package api

import (
	"fmt"
	"io"
	"net/http"
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

// chatKeys are the body keys the router reads: each must appear at most
// once and spelled exactly so, or the provider might read another value.
var chatKeys = []string{"model", "messages", "stream", "n", "max_tokens", "max_completion_tokens", "stream_options"}

// Format implements API.
func (Chat) Format() provider.Format { return provider.Chat }

// Parse implements API: a JSON object with a model and a non-empty
// messages array of objects with a role, n within 1..128. Only the routing
// keys are read, by a scan of the validated body (the body goes upstream
// as it came, or is translated by a provider type, which decodes it then).
func (Chat) Parse(body []byte, _ http.Header) (*router.Request, string, *Error) {
	c := chatScan{noRole: -1}
	if e := scanBody(body, chatKeys, &c.scan, c.member); e != nil {
		return nil, "", e
	}
	switch {
	case c.model == "":
		return nil, "", missingModel()
	case c.messages == 0:
		return nil, "", Errorf(http.StatusBadRequest, MissingParameter, "messages", "'messages' must be a non-empty array")
	case c.noRole >= 0:
		return nil, "", Errorf(http.StatusBadRequest, InvalidValue, fmt.Sprintf("messages[%d]", c.noRole),
			"messages[%d] must be an object with a role", c.noRole)
	case c.n != nil && (*c.n < 1 || *c.n > 128):
		return nil, "", Errorf(http.StatusBadRequest, InvalidValue, "n", "'n' must be between 1 and 128")
	}
	pr := &provider.Request{Format: provider.Chat, Body: body, Stream: c.stream, Choices: 1, IncludeUsage: c.includeUsage}
	if c.n != nil {
		pr.Choices = int(*c.n)
	}
	maxTokens := c.maxCompletionTokens
	if maxTokens <= 0 {
		maxTokens = max(c.maxTokens, 0)
	}
	return c.sized(pr, maxTokens), c.model, nil
}

// chatScan is what routing reads of a Chat Completions body, member by
// member; null reads as absent, as it does for encoding/json.
type chatScan struct {
	model                          string
	messages                       int // how many
	noRole                         int // the first message without a role, -1 none
	stream, includeUsage           bool
	n                              *int64
	maxTokens, maxCompletionTokens int64
	scan
}

func (c *chatScan) member(name []byte, v []byte) {
	switch key := string(name); key {
	case "model":
		c.model = c.str(key, v)
	case "stream":
		c.stream = c.boolean(key, v)
	case "n":
		n := c.integer(key, v)
		c.n = &n
	case "max_tokens":
		c.maxTokens = c.integer(key, v)
	case "max_completion_tokens":
		c.maxCompletionTokens = c.integer(key, v)
	case "stream_options":
		if v[0] != '{' {
			c.typeError(key, "an object")
			return
		}
		_ = jsonbody.EachMember(v, func(k []byte, start, end int) bool {
			if string(k) == "include_usage" && string(v[start:end]) != "null" {
				c.includeUsage = c.boolean("stream_options.include_usage", v[start:end])
			}
			return c.err == nil
		})
	case "messages":
		if v[0] != '[' {
			c.typeError(key, "an array")
			return
		}
		_ = jsonbody.EachElement(v, func(start, end int) bool {
			c.message(v[start:end])
			return c.err == nil
		})
	}
}

// message reads one element of messages: an object with a role.
func (c *chatScan) message(m []byte) {
	role := ""
	switch m[0] {
	case '{':
		_ = jsonbody.EachMember(m, func(k []byte, start, end int) bool {
			if string(k) == "role" && string(m[start:end]) != "null" {
				role = c.str("messages.role", m[start:end])
			}
			return c.err == nil
		})
	case 'n': // null: an empty message
	default:
		c.typeError("messages", "an object")
		return
	}
	if role == "" && c.noRole < 0 {
		c.noRole = c.messages
	}
	c.messages++
}

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
	UnsupportedMedia:    {"invalid_request_error", "unsupported_content_type"}, // OpenAI's own code (with a 400)
	ModelNotFound:       {"invalid_request_error", "model_not_found"},
	ModelNotSupported:   {"invalid_request_error", "model_not_supported"},
	NotFound:            {"invalid_request_error", "unknown_url"},
	ResponseNotFound:    {"invalid_request_error", ""},
	PreviousNotFound:    {"invalid_request_error", "previous_response_not_found"},
	CrossOrigin:         {"invalid_request_error", "cross_origin_request"},
	WebSocketRefused:    {"invalid_request_error", "websocket_not_supported"},
	Unauthorized:        {"invalid_request_error", "invalid_api_key"}, // OpenAI's own (openai-401-invalid-key.http)
	Forbidden:           {"invalid_request_error", "permission_denied"},
	Unsupported:         {"invalid_request_error", "unsupported_request"},
	ContextTooLong:      {"invalid_request_error", "context_length_exceeded"},
	RateLimited:         {"rate_limit_error", "rate_limit_exceeded"},
	Unavailable:         {"server_error", "upstream_unavailable"},
	Deadline:            {"timeout", "deadline_exceeded"},
	Untranslatable:      {"server_error", "upstream_unavailable"},
}

func (Chat) errorBody(e *Error) []byte {
	t := chatErrors[e.Code]
	return chat.NewError(e.Message, t[0], t[1], e.Param)
}

// isError implements format: {"error":{"message":"...",...}}.
func (Chat) isError(body []byte) bool {
	start, end, _ := jsonbody.FindMember(body, "error")
	if start < 0 || body[start] != '{' {
		return false
	}
	_, ok := jsonbody.GetString(body[start:end], "message")
	return ok
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
		code = snakeCase(said.Code)
	}
	return chat.NewError(said.Message, typ, code, "")
}

func (Chat) fromChat(body []byte) ([]byte, error) { return body, nil }

func (Chat) newStream(provider.Format) streamWriter { return chatStream{} }

// chatStream writes chunks as "data: <chunk>" events, then "data: [DONE]".
type chatStream struct{}

func (chatStream) event(w io.Writer, ev provider.Event) error {
	return provider.WriteEvent(w, "", ev.Data)
}

func (chatStream) done(w io.Writer) error { return provider.WriteEvent(w, "", []byte("[DONE]")) }

func (chatStream) failed(w io.Writer, e *router.StreamError) error {
	return provider.WriteEvent(w, "", chat.NewError(streamFailure(e), "server_error", "stream_interrupted", ""))
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
	return jsonbody.NewEncoder(w).Encode(list)
}

// WriteModel answers GET .../models/{id}: one model group, as the SDKs'
// models.retrieve asks; a 404 when there is no such group.
func WriteModel(w http.ResponseWriter, id string, exists bool) error {
	if !exists {
		Chat{}.WriteError(w, ModelNotFoundError(id))
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	return jsonbody.NewEncoder(w).Encode(model{ID: id, Object: "model", OwnedBy: "llm_router"})
}

type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// snakeCase is a provider's error code in the snake case of OpenAI's
// codes: "INVALID_ARGUMENT" is "invalid_argument", Bedrock's
// "ValidationException" "validation_exception".
func snakeCase(code string) string {
	if strings.ToUpper(code) == code {
		return strings.ToLower(code)
	}
	var b strings.Builder
	for i, r := range code {
		if 'A' <= r && r <= 'Z' {
			if i > 0 && code[i-1] != '_' && code[i-1] != '-' {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
