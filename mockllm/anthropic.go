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

// anthropicMessage is the non-streamed answer of the Messages API.
func (h *Handler) anthropicMessage(a answer) []byte {
	b := make([]byte, 0, 256+len(h.reply))
	b = append(b, `{"id":"msg_mock_`...)
	b = strconv.AppendUint(b, h.st.ids.Add(1), 10)
	b = append(b, `","type":"message","role":"assistant","model":`...)
	b = appendJSONString(b, a.model)
	b = append(b, `,"content":[{"type":"text","text":`...)
	b = append(b, h.reply...)
	b = append(b, `}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(a.prompt), 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, int64(a.completion), 10)
	return append(b, "}}"...)
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
	b = append(b, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_mock_"...)
	b = strconv.AppendUint(b, s.id, 10)
	b = append(b, `","type":"message","role":"assistant","model":`...)
	b = appendJSONString(b, s.a.model)
	b = append(b, `,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(s.a.prompt), 10)
	// Anthropic reports 1 output token in message_start; the count in
	// message_delta is the total, not an increment.
	b = append(b, ",\"output_tokens\":1}}}\n\n"...)
	b = append(b, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
	return append(b, anthropicPing...)
}

func (s *anthropicStream) chunk(b []byte, _ int, piece []byte, _ bool) []byte {
	b = append(b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"...)
	b = append(b, piece...)
	return append(b, "}}\n\n"...)
}

func (s *anthropicStream) end(b []byte) []byte {
	b = append(b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
	b = append(b, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":"...)
	b = strconv.AppendInt(b, int64(s.a.completion), 10)
	b = append(b, "}}\n\n"...)
	return append(b, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
}

func (s *anthropicStream) errorEvent(b, payload []byte) []byte {
	b = append(b, "event: error\ndata: "...)
	b = append(b, payload...)
	return append(b, "\n\n"...)
}

// anthropicError is an Anthropic error body.
func anthropicError(typ, msg string) []byte {
	b := append([]byte(`{"type":"error","error":{"type":`), appendJSONString(nil, typ)...)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, msg)
	return append(b, "}}"...)
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
	j := appendJSONString(nil, id)
	b := append([]byte(`{"data":[{"type":"model","id":`), j...)
	b = append(b, `,"display_name":`...)
	b = append(b, j...)
	b = append(b, `,"created_at":"2025-01-01T00:00:00Z"}],"has_more":false,"first_id":`...)
	b = append(b, j...)
	b = append(b, `,"last_id":`...)
	b = append(b, j...)
	return append(b, '}')
}
