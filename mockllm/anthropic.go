package mockllm

import (
	"net/http"
	"strconv"
	"time"
)

// The anthropic dialect: Anthropic's Messages API (POST .../messages),
// its SSE events, errors and anthropic-ratelimit-* headers.

// statusOverloaded is Anthropic's 529, sent when its API is overloaded.
const statusOverloaded = 529

// anthropicPing is Anthropic's ping event, its stream keep-alive,
// byte for byte as Anthropic sends it.
var anthropicPing = []byte("event: ping\ndata: {\"type\": \"ping\"}\n\n")

// anthropicMessageObject is a Messages API message: the non-streamed answer,
// and the message of a stream's message_start with empty content and a
// null stop_reason.
type anthropicMessageObject struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []anthropicText `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"` // always null
	Usage        anthropicUsage  `json:"usage"`
}

// anthropicText is a text content block, or a text_delta.
type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicUsage struct {
	InputTokens          int `json:"input_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens,omitempty"`
	OutputTokens         int `json:"output_tokens"`
}

// anthropicUsage is a's usage in Anthropic's form, with output tokens:
// input_tokens counts what was not read from the cache.
func (a answer) anthropicUsage(output int) anthropicUsage {
	return anthropicUsage{InputTokens: a.prompt - a.cached, CacheReadInputTokens: a.cached, OutputTokens: output}
}

// anthropicMessageStart is a stream's message_start event.
type anthropicMessageStart struct {
	Type    string                 `json:"type"`
	Message anthropicMessageObject `json:"message"`
}

// anthropicDelta is a content_block_delta event.
type anthropicDelta struct {
	Type  string        `json:"type"`
	Index int           `json:"index"`
	Delta anthropicText `json:"delta"`
}

// anthropicMessageDelta is a stream's message_delta event.
type anthropicMessageDelta struct {
	Type  string `json:"type"`
	Delta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"` // always null
	} `json:"delta"`
	Usage struct {
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

type anthropicModelList struct {
	Data    [1]anthropicModel `json:"data"`
	HasMore bool              `json:"has_more"`
	FirstID string            `json:"first_id"`
	LastID  string            `json:"last_id"`
}

type anthropicModel struct {
	Type        string `json:"type"`
	ID          string `json:"id"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"`
}

// stopEndTurn is the stop_reason of a finished answer.
var stopEndTurn = "end_turn"

// anthropicMessageID is the id of the nth message.
func anthropicMessageID(n uint64) string { return "msg_mock_" + strconv.FormatUint(n, 10) }

// anthropicMessage is the non-streamed answer of the Messages API.
func (h *Handler) anthropicMessage(a answer) []byte {
	m := anthropicMessageObject{
		ID:         anthropicMessageID(h.st.ids.Add(1)),
		Type:       "message",
		Role:       "assistant",
		Model:      a.model,
		Content:    []anthropicText{{Type: "text", Text: a.text}},
		StopReason: &stopEndTurn,
		Usage:      a.anthropicUsage(a.completion),
	}
	return appendJSON(make([]byte, 0, 256+len(a.text)), &m)
}

// anthropicStream is a Messages API stream: message_start,
// content_block_start and ping, one content_block_delta per chunk,
// then content_block_stop, message_delta and message_stop.
type anthropicStream struct {
	a  answer
	id uint64
}

func (s *anthropicStream) contentType() string { return "text/event-stream" }
func (s *anthropicStream) keepAlive() []byte   { return anthropicPing }

func (s *anthropicStream) head(b []byte) []byte {
	b = append(b, "event: message_start\ndata: "...)
	b = appendJSON(b, &anthropicMessageStart{Type: "message_start", Message: anthropicMessageObject{
		ID:      anthropicMessageID(s.id),
		Type:    "message",
		Role:    "assistant",
		Model:   s.a.model,
		Content: []anthropicText{},
		// Anthropic reports 1 output token in message_start; the count
		// in message_delta is the total, not an increment.
		Usage: s.a.anthropicUsage(1),
	}})
	b = append(b, "\n\n"...)
	b = append(b, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
	return append(b, anthropicPing...)
}

func (s *anthropicStream) chunk(b []byte, _ int, piece string, _ bool) []byte {
	b = append(b, "event: content_block_delta\ndata: "...)
	b = appendJSON(b, &anthropicDelta{Type: "content_block_delta", Delta: anthropicText{Type: "text_delta", Text: piece}})
	return append(b, "\n\n"...)
}

func (s *anthropicStream) end(b []byte) []byte {
	b = append(b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
	md := anthropicMessageDelta{Type: "message_delta"}
	md.Delta.StopReason = stopEndTurn
	md.Usage.OutputTokens = s.a.completion
	b = append(b, "event: message_delta\ndata: "...)
	b = appendJSON(b, &md)
	b = append(b, "\n\n"...)
	return append(b, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
}

func (s *anthropicStream) errorEvent(b, payload []byte) []byte {
	b = append(b, "event: error\ndata: "...)
	b = append(b, payload...)
	return append(b, "\n\n"...)
}

// malformedAnthropicDelta is the data of a content_block_delta cut short.
const malformedAnthropicDelta = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x`

func (s *anthropicStream) malformed(b []byte) []byte {
	b = append(b, "event: content_block_delta\ndata: "...)
	b = append(b, malformedAnthropicDelta...)
	return append(b, "\n\n"...)
}

// anthropicError is an Anthropic error body.
func anthropicError(typ, msg string) []byte {
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e.Type = "error"
	e.Error.Type = typ
	e.Error.Message = msg
	return appendJSON(nil, &e)
}

// anthropicStatusError is the body of a status fault: the error type
// Anthropic documents for the status.
func anthropicStatusError(code int) []byte {
	var typ string
	switch code {
	case http.StatusBadRequest:
		typ = "invalid_request_error"
	case http.StatusUnauthorized:
		typ = "authentication_error"
	case http.StatusPaymentRequired:
		typ = "billing_error"
	case http.StatusForbidden:
		typ = "permission_error"
	case http.StatusNotFound:
		typ = "not_found_error"
	case http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case http.StatusGatewayTimeout:
		typ = "timeout_error"
	case statusOverloaded:
		return anthropicError("overloaded_error", "Overloaded")
	default:
		typ = "api_error"
		if code >= 400 && code < 500 {
			typ = "invalid_request_error"
		}
	}
	return anthropicError(typ, "mock status "+strconv.Itoa(code))
}

// anthropicRateLimitError is the 429 body of a request over the
// RateLimit window.
func anthropicRateLimitError(ls limitState, window time.Duration) []byte {
	limit := ls.requests
	if ls.exceeded == "tokens" {
		limit = ls.tokens
	}
	per := window.String()
	if window == time.Minute {
		per = "minute"
	}
	return anthropicError("rate_limit_error", "This request would exceed your rate limit of "+
		strconv.Itoa(limit)+" "+ls.exceeded+" per "+per+".")
}

// setAnthropicLimitHeaders sets anthropic-ratelimit-* headers; resets
// are RFC 3339 instants in UTC, rounded up to the second so a client
// waiting until then finds the window renewed.
func setAnthropicLimitHeaders(hdr http.Header, ls limitState) {
	end := ls.now.Add(ls.reset)
	at := end.Truncate(time.Second)
	if at.Before(end) {
		at = at.Add(time.Second)
	}
	reset := at.UTC().Format(time.RFC3339)
	if ls.requests > 0 {
		hdr.Set("anthropic-ratelimit-requests-limit", strconv.Itoa(ls.requests))
		hdr.Set("anthropic-ratelimit-requests-remaining", strconv.Itoa(ls.remReq))
		hdr.Set("anthropic-ratelimit-requests-reset", reset)
	}
	if ls.tokens > 0 {
		hdr.Set("anthropic-ratelimit-tokens-limit", strconv.Itoa(ls.tokens))
		hdr.Set("anthropic-ratelimit-tokens-remaining", strconv.Itoa(ls.remTok))
		hdr.Set("anthropic-ratelimit-tokens-reset", reset)
	}
}

// anthropicModels is the model list of the Models API.
func anthropicModels(id string) []byte {
	return appendJSON(nil, &anthropicModelList{
		Data:    [1]anthropicModel{{Type: "model", ID: id, DisplayName: id, CreatedAt: "2025-01-01T00:00:00Z"}},
		FirstID: id,
		LastID:  id,
	})
}
