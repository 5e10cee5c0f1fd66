package resume

import (
	"encoding/json"
	"errors"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Body returns a client's request body (in format f: Chat, Messages or
// Responses) with text at its end as the assistant's: the body of a
// continuation's request, which asks the provider to go on from there. A
// final assistant message the client wrote itself (its own prefill, which
// the answer does not repeat) is extended; else a new assistant message is
// added. Nothing else of the body changes.
func Body(f provider.Format, body []byte, text string) ([]byte, error) {
	key := "messages"
	if f == provider.Responses {
		key = "input"
	}
	start, end, err := jsonbody.FindMember(body, key)
	if err != nil {
		return nil, err
	}
	if start < 0 {
		return nil, errors.New("the request has no " + key)
	}
	var items []json.RawMessage
	if f == provider.Responses && body[start] == '"' {
		// input as a string: the user's one message.
		var s string
		if err := json.Unmarshal(body[start:end], &s); err != nil {
			return nil, err
		}
		user, _ := jsonbody.Marshal(map[string]string{"role": "user", "content": s})
		items = []json.RawMessage{user}
	} else if err := json.Unmarshal(body[start:end], &items); err != nil || len(items) == 0 {
		return nil, errors.New("the request's " + key + " is not a non-empty array")
	}
	last := items[len(items)-1]
	if joined, ok := extend(f, last, text); ok {
		items[len(items)-1] = joined
	} else {
		items = append(items, assistant(f, text))
	}
	v, err := jsonbody.Marshal(items)
	if err != nil {
		return nil, err
	}
	return jsonbody.SetRaw(body, key, v)
}

// assistant is a new assistant message holding text, in format f.
func assistant(f provider.Format, text string) json.RawMessage {
	var v any
	switch f {
	case provider.Messages:
		v = map[string]any{"role": "assistant", "content": []map[string]string{{"type": "text", "text": text}}}
	case provider.Responses:
		v = map[string]any{"type": "message", "role": "assistant",
			"content": []map[string]string{{"type": "output_text", "text": text}}}
	default:
		v = map[string]string{"role": "assistant", "content": text}
	}
	b, _ := jsonbody.Marshal(v)
	return b
}

// extend returns msg, when it is an assistant message with a text
// content (a string, or parts or blocks of which the last is text), with
// text added to its end.
func extend(f provider.Format, msg json.RawMessage, text string) (json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil {
		return nil, false
	}
	var role string
	if json.Unmarshal(m["role"], &role) != nil || role != "assistant" {
		return nil, false
	}
	var s string
	if json.Unmarshal(m["content"], &s) == nil {
		m["content"], _ = jsonbody.Marshal(s + text)
	} else {
		var parts []map[string]json.RawMessage
		if json.Unmarshal(m["content"], &parts) != nil || len(parts) == 0 {
			return nil, false
		}
		p := parts[len(parts)-1]
		var typ, prev string
		if json.Unmarshal(p["type"], &typ) != nil || typ != "text" && typ != "output_text" ||
			json.Unmarshal(p["text"], &prev) != nil {
			return nil, false
		}
		p["text"], _ = jsonbody.Marshal(prev + text)
		m["content"], _ = jsonbody.Marshal(parts)
	}
	b, err := jsonbody.Marshal(m)
	return b, err == nil
}
