package llmrouter

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
)

// wsSession is what one socket keeps between its turns, as OpenAI's
// WebSocket mode keeps it (https://developers.openai.com/api/docs/guides/websocket-mode):
// the last response it gave, so that the next response.create may name it
// as previous_response_id and send only the new input items, even with
// store false. Codex CLI does so on every turn after the first, and
// warms the socket up with a generate false turn first.
//
// No provider keeps a store false response, and the next turn may be
// served by another deployment, so the router sends each turn whole: the
// items the last response continued from, its output, then the new
// items, without previous_response_id. A previous_response_id that is not
// the socket's last response is left as it is (the provider's state: see
// Handler.pin).
type wsSession struct {
	id    string            // the last response's id; "" before the first
	items []json.RawMessage // its input items, then its output items
}

// expand returns body, a turn, with the socket's items before its input
// when it continues the socket's last response.
func (s *wsSession) expand(body []byte) ([]byte, *api.Error) {
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
		return nil, api.Errorf(http.StatusBadRequest, api.InvalidJSON, "input", "%v", err)
	}
	body, _ = jsonbody.Without(body, "previous_response_id")
	return body, nil
}

// inputItems is a Responses body's input as items: a string is one user
// message; none is no items.
func inputItems(body []byte) ([]json.RawMessage, *api.Error) {
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
		return nil, api.Errorf(http.StatusBadRequest, api.InvalidValue, "input", "'input' must be a string or an array of items")
	}
	return items, nil
}

// remember keeps a completed turn: its response's id, and body's input
// items (expanded) then the response's output items. A turn that
// continued a response the socket did not hold (the provider's state)
// leaves nothing to expand from: the socket holds only part of that
// conversation. Anything else (a failed or cut turn) leaves the last
// response as it was.
func (s *wsSession) remember(body, completed []byte) {
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

// isWarmup reports a turn with generate false: the socket is prepared
// (its input kept), and nothing is generated.
func isWarmup(body []byte) bool {
	start, end, _ := jsonbody.FindMember(body, "generate")
	return start >= 0 && string(body[start:end]) == "false"
}

// warmup answers a generate false turn itself, as OpenAI does: a
// response.created and a response.completed of a response with no output
// and no usage; no provider is asked. It returns the completed event.
func warmup(ctx context.Context, c *websocket.Conn, body []byte, now time.Time) ([]byte, error) {
	model, _ := jsonbody.GetString(body, "model")
	response := map[string]any{"id": chat.NewID("resp_"), "object": "response", "created_at": now.Unix(),
		"status": "in_progress", "model": model, "output": []any{}}
	created, _ := jsonbody.Marshal(map[string]any{"type": "response.created", "sequence_number": 0, "response": response})
	response["status"] = "completed"
	response["usage"] = map[string]any{"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
		"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}
	completed, _ := jsonbody.Marshal(map[string]any{"type": "response.completed", "sequence_number": 1, "response": response})
	if err := c.Write(ctx, websocket.MessageText, created); err != nil {
		return nil, err
	}
	return completed, c.Write(ctx, websocket.MessageText, completed)
}
