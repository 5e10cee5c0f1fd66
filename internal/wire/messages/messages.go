// Package messages declares Anthropic's Messages API wire format once
// (https://docs.anthropic.com/en/api/messages): the request, the answer,
// the stream events and the error body, and translates each to and from
// the Chat Completions format (package chat) in both directions. The
// Messages client API (a client speaking Messages to the router) and the
// anthropic provider type (the router speaking Messages to Anthropic)
// both use it:
//
//	client -> router:    ToChat (request), FromChatAnswer, ChatEncoder (answers and streams back)
//	router -> provider:  FromChat (request), ToChatAnswer, ChatDecoder (answers and streams back)
package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
)

// Version is the Messages API version the router sends unless the client
// (on a native pass) or the provider's `header` lines set another.
const Version = "2023-06-01"

// Request is a Messages request.
type Request struct {
	Model     string `json:"model"`
	MaxTokens *int64 `json:"max_tokens,omitempty"`
	// System is the system prompt: written as a string or []Block (text
	// blocks with cache_control); read into a *SystemPrompt put there
	// before decoding (encoding/json fills a pointer an interface holds).
	// Not a json.Marshaler: encoding/json re-validates what those write,
	// and a system prompt is most of a request's bytes.
	System        any         `json:"system,omitempty"`
	Messages      []Message   `json:"messages"`
	Tools         []Tool      `json:"tools,omitempty"`
	ToolChoice    *ToolChoice `json:"tool_choice,omitempty"`
	StopSequences []string    `json:"stop_sequences,omitempty"`
	Temperature   *float64    `json:"temperature,omitempty"`
	TopP          *float64    `json:"top_p,omitempty"`
	Stream        bool        `json:"stream,omitempty"`
	Metadata      *Metadata   `json:"metadata,omitempty"`
	// OutputConfig is structured outputs: the answer's JSON schema.
	OutputConfig *OutputConfig `json:"output_config,omitempty"`
}

// OutputConfig is a request's output_config: Format, when set, constrains
// the answer's text to a JSON schema.
type OutputConfig struct {
	Format *OutputFormat `json:"format,omitempty"`
}

// OutputFormat is output_config.format: Type "json_schema" and the Schema.
type OutputFormat struct {
	Type   string          `json:"type"`
	Schema json.RawMessage `json:"schema"`
}

// SystemPrompt is a system prompt as read: a string, or text blocks.
type SystemPrompt struct {
	Text   string
	Blocks []Block
}

// UnmarshalJSON implements json.Unmarshaler.
func (p *SystemPrompt) UnmarshalJSON(raw []byte) error {
	*p = SystemPrompt{}
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || raw[0] == 'n':
		return nil
	case raw[0] == '"':
		s, ok := jsonbody.String(raw)
		if !ok {
			return errors.New("system: not a string")
		}
		p.Text = s
		return nil
	}
	if err := json.Unmarshal(raw, &p.Blocks); err != nil {
		return errors.New("system: must be a string or text blocks")
	}
	return nil
}

// String returns the prompt's text: the string, or the blocks' texts
// joined by a blank line.
func (p *SystemPrompt) String() string {
	if p.Blocks == nil {
		return p.Text
	}
	texts := make([]string, 0, len(p.Blocks))
	for _, b := range p.Blocks {
		if t := b.TextOf(); t != "" {
			texts = append(texts, t)
		}
	}
	return strings.Join(texts, "\n\n")
}

// Message is one turn: user or assistant.
type Message struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
}

// Content is a turn's blocks; a string is read as one text block.
type Content []Block

// UnmarshalJSON implements json.Unmarshaler.
func (c *Content) UnmarshalJSON(raw []byte) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		s, ok := jsonbody.String(raw)
		if !ok {
			return errors.New("content: not a string")
		}
		*c = Content{{Type: "text", Text: &s}}
		return nil
	}
	var blocks []Block
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return errors.New("content must be a string or an array of content blocks")
	}
	*c = blocks
	return nil
}

// Block is a content block: text, image, document, tool_use, tool_result,
// thinking.
type Block struct {
	Type string `json:"type"`
	// Text is set for text blocks, "" included (a content_block_start).
	Text   *string `json:"text,omitempty"`
	Source *Source `json:"source,omitempty"`
	// tool_use
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// tool_result: Content is a string or blocks.
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	// document
	Title string `json:"title,omitempty"`

	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

// TextOf returns a block's text, "" when it has none.
func (b *Block) TextOf() string {
	if b.Text == nil {
		return ""
	}
	return *b.Text
}

// TextBlock returns a text block.
func TextBlock(s string) Block { return Block{Type: "text", Text: &s} }

// Source is an image's or document's source: base64, url or text.
type Source struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

// Tool is a tool the model may call; Type is empty or "custom" for client
// tools, a versioned name for server tools (web search, bash...).
type Tool struct {
	Type        string          `json:"type,omitempty"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
}

// ToolChoice is tool_choice: auto, any, tool (with Name) or none.
type ToolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name,omitempty"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use,omitempty"`
}

// Metadata is a request's metadata.
type Metadata struct {
	UserID string `json:"user_id"`
}

// Response is a Messages answer (also the message of message_start).
type Response struct {
	ID           string  `json:"id"`
	Type         string  `json:"type"`
	Role         string  `json:"role"`
	Model        string  `json:"model"`
	Content      []Block `json:"content"`
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        Usage   `json:"usage"`
	// Error is set when a server answers an error with a 200.
	Error *ErrorDetail `json:"error,omitempty"`
}

// Usage is token usage: InputTokens leaves out what was read from or
// written to the prompt cache.
type Usage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens,omitempty"`
	// CacheCreation splits CacheCreationInputTokens by lifetime.
	CacheCreation *chat.CacheCreation `json:"cache_creation,omitempty"`
}

// MarshalJSON implements json.Marshaler: usage as the router writes it in
// an answer, message_start or message_delta it builds, with every field
// the Messages API's Usage and MessageDeltaUsage require (anthropic-sdk-go
// v2.15.0's api:"required" fields): input_tokens, output_tokens,
// cache_creation_input_tokens and cache_read_input_tokens (0 when none),
// cache_creation, server_tool_use and service_tier (null when unknown: a
// translated answer used no server tool the router can count).
func (u Usage) MarshalJSON() ([]byte, error) {
	return jsonbody.Marshal(struct {
		InputTokens              int64               `json:"input_tokens"`
		CacheCreationInputTokens int64               `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int64               `json:"cache_read_input_tokens"`
		CacheCreation            *chat.CacheCreation `json:"cache_creation"`
		OutputTokens             int64               `json:"output_tokens"`
		ServerToolUse            *struct{}           `json:"server_tool_use"`
		ServiceTier              *string             `json:"service_tier"`
	}{InputTokens: u.InputTokens, CacheCreationInputTokens: u.CacheCreationInputTokens,
		CacheReadInputTokens: u.CacheReadInputTokens, CacheCreation: u.CacheCreation, OutputTokens: u.OutputTokens})
}

// Event is one stream event's data
// (https://docs.anthropic.com/en/docs/build-with-claude/streaming); the
// fields are in the order Anthropic sends them.
type Event struct {
	Type         string       `json:"type"`
	Message      *Response    `json:"message,omitempty"`
	Index        *int         `json:"index,omitempty"`
	ContentBlock *Block       `json:"content_block,omitempty"`
	Delta        *Delta       `json:"delta,omitempty"`
	Usage        *Usage       `json:"usage,omitempty"`
	Error        *ErrorDetail `json:"error,omitempty"`
}

// Delta is a content_block_delta's or message_delta's delta.
type Delta struct {
	Type        string `json:"type,omitempty"`
	Text        string `json:"text,omitempty"`
	PartialJSON string `json:"partial_json,omitempty"`
	Thinking    string `json:"thinking,omitempty"`
	Signature   string `json:"signature,omitempty"`
	StopReason  string `json:"stop_reason,omitempty"`
}

// ErrorBody is the error format,
// {"type":"error","error":{"type","message"},"request_id"}.
type ErrorBody struct {
	Type  string      `json:"type"`
	Error ErrorDetail `json:"error"`
	// RequestID is required in the errors the API answers (ErrorResponse);
	// the router's own errors get a fresh "req_" one.
	RequestID string `json:"request_id,omitempty"`
}

// ErrorDetail is an error's type and message, with the error_code some
// errors carry (enforced_spend_limit_reached).
type ErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Details *struct {
		ErrorCode string `json:"error_code"`
	} `json:"details,omitempty"`
}

// Code returns details.error_code, "" when absent.
func (e *ErrorDetail) Code() string {
	if e == nil || e.Details == nil {
		return ""
	}
	return e.Details.ErrorCode
}

// NewError returns an error body with a fresh request_id.
func NewError(typ, msg string) []byte {
	b, _ := jsonbody.Marshal(ErrorBody{Type: "error", Error: ErrorDetail{Type: typ, Message: msg}, RequestID: chat.NewID("req_")}) // plain struct: cannot fail
	return b
}

// ErrorType is the error type for an HTTP status
// (https://docs.anthropic.com/en/api/errors): 400 invalid_request_error,
// 401 authentication_error, 402 billing_error, 403 permission_error, 404
// not_found_error, 413 request_too_large, 429 rate_limit_error, 500
// api_error, 503 and 529 overloaded_error, 504 timeout_error; other 4xx
// invalid_request_error, other 5xx api_error.
func ErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}
