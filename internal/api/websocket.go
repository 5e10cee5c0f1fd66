package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/excerpt"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
)

// The Responses API's WebSocket mode's messages
// (https://developers.openai.com/api/docs/guides/websocket-mode): what a
// client message holds, what a socket keeps between turns, and the events
// the router sends itself. The socket (its handshake, framing and turns as
// the handler's own POSTs) is the root's (websocket.go); this file knows
// only the format.

// WSCreate is the only client event type served on a socket.
const WSCreate = "response.create"

// WSTurnBody is the POST .../responses body of a client message msg
// (text: whether it came as a text message): a JSON object of type
// response.create, without its type and with stream true (a turn is
// always streamed). Errors (400, in the Responses API's format): not a
// text message holding a JSON object (invalid_json), another type, or
// background true (OpenAI refuses it on a socket).
func WSTurnBody(text bool, msg []byte) ([]byte, *Error) {
	if !text || !json.Valid(msg) || msg[jsonbody.SkipSpace(msg, 0)] != '{' {
		return nil, Errorf(http.StatusBadRequest, InvalidJSON, "",
			"a WebSocket mode message is a text message holding a JSON object")
	}
	if t, _ := jsonbody.GetString(msg, "type"); t != WSCreate {
		return nil, Errorf(http.StatusBadRequest, InvalidValue, "type",
			"unsupported client event type %q: this router serves %q", excerpt.Of(t, 64), WSCreate)
	}
	if start, end, _ := jsonbody.FindMember(msg, "background"); start >= 0 && string(msg[start:end]) == "true" {
		return nil, Errorf(http.StatusBadRequest, InvalidValue, "background",
			"background is not supported in WebSocket mode: use POST .../responses")
	}
	body, _ := jsonbody.Without(msg, "type")
	body, err := jsonbody.SetRaw(body, "stream", []byte("true"))
	if err != nil {
		return nil, Errorf(http.StatusBadRequest, InvalidJSON, "", "%v", err)
	}
	return body, nil
}

// WSSession is what one socket keeps between its turns, as OpenAI's
// WebSocket mode keeps it: the last response it gave, so that the next
// response.create may name it as previous_response_id and send only the
// new input items, even with store false. Codex CLI does so on every turn
// after the first, and warms the socket up with a generate false turn
// first.
//
// No provider keeps a store false response, and the next turn may be
// served by another deployment, so the router sends each turn whole: the
// items the last response continued from, its output, then the new
// items, without previous_response_id. A previous_response_id that is not
// the socket's last response is left as it is (the provider's state).
// The zero value is a socket before its first turn.
type WSSession struct {
	id    string            // the last response's id; "" before the first
	items []json.RawMessage // its input items, then its output items
}

// Expand returns body, a turn, with the socket's items before its input
// when it continues the socket's last response. Error: an input that is
// neither a string nor an array of items (400 invalid_value).
func (s *WSSession) Expand(body []byte) ([]byte, *Error) {
	prev, _ := jsonbody.GetString(body, "previous_response_id")
	if prev == "" || prev != s.id {
		return body, nil
	}
	items, e := inputItems(body)
	if e != nil {
		return nil, e
	}
	input, err := jsonbody.Marshal(append(append([]json.RawMessage{}, s.items...), items...))
	if err == nil {
		body, err = jsonbody.SetRaw(body, "input", input)
	}
	if err != nil {
		return nil, Errorf(http.StatusBadRequest, InvalidJSON, "input", "%v", err)
	}
	body, _ = jsonbody.Without(body, "previous_response_id")
	return body, nil
}

// inputItems is a Responses body's input as items: a string is one user
// message; none is no items.
func inputItems(body []byte) ([]json.RawMessage, *Error) {
	start, end, _ := jsonbody.FindMember(body, "input")
	if start < 0 {
		return nil, nil
	}
	raw := body[start:end]
	if raw[0] == '"' {
		msg, _ := jsonbody.Marshal(map[string]json.RawMessage{"type": json.RawMessage(`"message"`), "role": json.RawMessage(`"user"`), "content": raw})
		return []json.RawMessage{msg}, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, Errorf(http.StatusBadRequest, InvalidValue, "input", "'input' must be a string or an array of items")
	}
	return items, nil
}

// Remember keeps a completed turn: completed is its response.completed
// event (nil: the turn failed or was cut), body its request (expanded).
// It keeps the response's id, and body's input items then the response's
// output items. A turn that continued a response the socket did not hold
// (the provider's state) leaves nothing to expand from: the socket holds
// only part of that conversation. Anything else (a failed or cut turn)
// leaves the last response as it was.
func (s *WSSession) Remember(body, completed []byte) {
	if prev, _ := jsonbody.GetString(body, "previous_response_id"); prev != "" && completed != nil {
		s.id, s.items = "", nil
		return
	}
	var ev struct {
		Response struct {
			ID     string            `json:"id"`
			Output []json.RawMessage `json:"output"`
		} `json:"response"`
	}
	if completed == nil || json.Unmarshal(completed, &ev) != nil || ev.Response.ID == "" {
		return
	}
	items, e := inputItems(body)
	if e != nil {
		return
	}
	s.id, s.items = ev.Response.ID, append(items, ev.Response.Output...)
}

// WSPostBody is a turn's body as the POST .../responses that serves it:
// without generate, the socket's own field.
func WSPostBody(body []byte) []byte {
	body, _ = jsonbody.Without(body, "generate")
	return body
}

// IsWarmup reports a turn with generate false: the socket is prepared
// (its input kept), and nothing is generated.
func IsWarmup(body []byte) bool {
	start, end, _ := jsonbody.FindMember(body, "generate")
	return start >= 0 && string(body[start:end]) == "false"
}

// WarmupEvents are the two events OpenAI answers a generate false turn
// with, asking no provider: a response.created and a response.completed
// of a response with no output and zero usage, created at now (Unix
// seconds), of body's model.
func WarmupEvents(body []byte, now time.Time) (created, completed []byte) {
	model, _ := jsonbody.GetString(body, "model")
	response := map[string]any{"id": chat.NewID("resp_"), "object": "response", "created_at": now.Unix(),
		"status": "in_progress", "model": model, "output": []any{}}
	created, _ = jsonbody.Marshal(map[string]any{"type": "response.created", "sequence_number": 0, "response": response})
	response["status"] = "completed"
	response["usage"] = map[string]any{"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
		"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}
	completed, _ = jsonbody.Marshal(map[string]any{"type": "response.completed", "sequence_number": 1, "response": response})
	return created, completed
}

// IsCompletedEvent reports whether data, a stream event's JSON, is a
// response.completed.
func IsCompletedEvent(data []byte) bool {
	t, _ := jsonbody.GetString(data, "type")
	return t == "response.completed"
}

// WSCompleted is a whole answer (a response object, where a stream was
// asked for) as the response.completed event that carries it; ok is false
// when the answer is not JSON.
func WSCompleted(answer []byte) (event []byte, ok bool) {
	if !json.Valid(answer) {
		return nil, false
	}
	event, err := jsonbody.Marshal(map[string]any{"type": "response.completed", "response": json.RawMessage(answer)})
	return event, err == nil
}

// WSError is an HTTP error answer of the given status (the Responses
// API's {"error":{...}}) as OpenAI's WebSocket error event:
// {"type":"error","status":...,"error":{...}}. A body that holds no error
// object is stated as the router's 502 (server_error,
// upstream_unavailable).
func WSError(status int, body []byte) []byte {
	var answer struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &answer) != nil || len(answer.Error) == 0 || answer.Error[0] != '{' {
		status = http.StatusBadGateway
		answer.Error = json.RawMessage(`{"type":"server_error","code":"upstream_unavailable","message":"the deployment's answer was not a Responses stream","param":null}`)
	}
	msg, _ := jsonbody.Marshal(struct {
		Type   string          `json:"type"`
		Status int             `json:"status"`
		Error  json.RawMessage `json:"error"`
	}{"error", status, answer.Error})
	return msg
}
