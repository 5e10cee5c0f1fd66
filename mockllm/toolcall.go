package mockllm

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Scripted tool calls (Handler.ToolCall): a request whose conversation
// does not end with a tool's result is answered with one call of the
// tool, in the dialect's own form, plain or streamed; the request that
// brings the result back gets the Reply. So an agent (Claude Code, Codex
// CLI) pointed at a mock through the router runs one real tool round
// trip. Bedrock's invoke and vertex's rawPredict script calls as the
// anthropic dialect does (their streams wrapped as the dialect wraps
// them); Converse scripts them in its own form (bedrock.go), only for
// requests whose toolConfig offers the tool. Gemini models (the gemini
// dialect, vertex's google publisher) do not script calls.

// ToolCall is a scripted tool call: the tool's name and its arguments (a
// JSON object).
type ToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// wantsToolCall reports whether a request (its body, valid JSON) of
// call c gets the scripted call: its conversation does not end with a
// tool's result.
func (h *Handler) wantsToolCall(c call, body []byte) bool {
	ep := c.ep
	switch {
	case h.ToolCall == nil || c.wire == wireGemini:
		return false
	case c.wire == wireConverse:
		return h.converseWantsToolCall(body)
	}
	var r struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(body, &r) != nil {
		return false
	}
	switch {
	case ep == epResponses:
		var items []struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(r.Input, &items)
		return len(items) == 0 || items[len(items)-1].Type != "function_call_output"
	case len(r.Messages) == 0:
		return true
	}
	last := r.Messages[len(r.Messages)-1]
	if c.wire == wireAnthropic {
		var blocks []struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(last.Content, &blocks)
		for _, b := range blocks {
			if b.Type == "tool_result" {
				return false
			}
		}
		return true
	}
	return last.Role != "tool"
}

// toolCallAnswer is the scripted call as a non-streamed answer.
func (h *Handler) toolCallAnswer(a answer, c call) []byte {
	n := strconv.FormatUint(h.st.ids.Add(1), 10)
	tc := h.ToolCall
	args := string(tc.Arguments)
	switch {
	case c.wire == wireConverse:
		return h.converseToolCall(a, n)
	case c.ep == epResponses:
		id := h.newResponseID()
		r := h.responseObject(a, id, "completed", "", true)
		r.Output = []json.RawMessage{appendJSON(nil, map[string]any{"type": "function_call", "id": "fc_mock" + n,
			"call_id": "call_mock" + n, "name": tc.Name, "arguments": args, "status": "completed"})}
		b := appendJSON(nil, r)
		h.st.responses.keep(id, b)
		return b
	case c.wire == wireAnthropic:
		return appendJSON(nil, map[string]any{"id": anthropicMessageID(h.st.ids.Add(1)), "type": "message", "role": "assistant",
			"model": a.model, "content": []any{map[string]any{"type": "tool_use", "id": "toolu_mock" + n, "name": tc.Name, "input": tc.Arguments}},
			"stop_reason": "tool_use", "stop_sequence": nil, "usage": a.anthropicUsage(a.completion)})
	}
	return appendJSON(nil, map[string]any{"id": "chatcmpl-mock-" + n, "object": "chat.completion", "created": h.now().Unix(),
		"model": a.model, "choices": []any{map[string]any{"index": 0, "finish_reason": "tool_calls",
			"message": map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
				"id": "call_mock" + n, "type": "function", "function": map[string]any{"name": tc.Name, "arguments": args}}}}}},
		"usage": a.usage()})
}

// writeToolCallStream sends the scripted call as a stream: the call's
// start, its arguments in one delta (Converse: two), the end.
func (h *Handler) writeToolCallStream(w http.ResponseWriter, a answer, c call) {
	ep := c.ep
	if c.wire == wireConverse {
		h.writeConverseToolStream(w, a)
		return
	}
	n := strconv.FormatUint(h.st.ids.Add(1), 10)
	tc := h.ToolCall
	args := string(tc.Arguments)
	var b []byte
	ev := func(name string, v any) {
		if name != "" {
			b = append(b, "event: "...)
			b = append(b, name...)
			b = append(b, '\n')
		}
		b = append(b, "data: "...)
		b = appendJSON(b, v)
		b = append(b, "\n\n"...)
	}
	switch {
	case ep == epResponses:
		s := &responsesStream{h: h, a: a, id: h.newResponseID()}
		b = s.head(b)
		item := map[string]any{"type": "function_call", "id": "fc_mock" + n, "call_id": "call_mock" + n, "name": tc.Name, "arguments": "", "status": "in_progress"}
		b = s.event(b, "response.output_item.added", map[string]any{"output_index": 0, "item": item})
		b = s.event(b, "response.function_call_arguments.delta", map[string]any{"item_id": "fc_mock" + n, "output_index": 0, "delta": args})
		b = s.event(b, "response.function_call_arguments.done", map[string]any{"item_id": "fc_mock" + n, "output_index": 0, "arguments": args})
		done := map[string]any{"type": "function_call", "id": "fc_mock" + n, "call_id": "call_mock" + n, "name": tc.Name, "arguments": args, "status": "completed"}
		b = s.event(b, "response.output_item.done", map[string]any{"output_index": 0, "item": done})
		r := h.responseObject(a, s.id, "completed", "", true)
		r.Output = []json.RawMessage{appendJSON(nil, done)}
		b = s.event(b, "response.completed", map[string]any{"response": r})
	case c.wire == wireAnthropic:
		ev("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": anthropicMessageID(h.st.ids.Add(1)),
			"type": "message", "role": "assistant", "model": a.model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil,
			"usage": a.anthropicUsage(1)}})
		ev("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]any{"type": "tool_use", "id": "toolu_mock" + n, "name": tc.Name, "input": map[string]any{}}})
		ev("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": args}})
		ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		ev("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "tool_use", "stop_sequence": nil},
			"usage": map[string]any{"output_tokens": a.completion}})
		ev("message_stop", map[string]any{"type": "message_stop"})
	default:
		head := map[string]any{"id": "chatcmpl-mock-" + n, "object": "chat.completion.chunk", "created": h.now().Unix(), "model": a.model}
		chunk := func(delta map[string]any, finish any, usage any) map[string]any {
			c := map[string]any{"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
			if usage != nil {
				c["usage"] = usage
			}
			for k, v := range head {
				c[k] = v
			}
			return c
		}
		ev("", chunk(map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"index": 0, "id": "call_mock" + n,
			"type": "function", "function": map[string]any{"name": tc.Name, "arguments": ""}}}}, nil, nil))
		ev("", chunk(map[string]any{"tool_calls": []any{map[string]any{"index": 0, "function": map[string]any{"arguments": args}}}}, nil, nil))
		ev("", chunk(map[string]any{}, "tool_calls",
			a.usage()))
		b = append(b, "data: [DONE]\n\n"...)
	}
	if h.dialect == dlBedrock {
		// invoke-with-response-stream: the events as chunk messages.
		s := newInvokeStream(a, nil)
		s.firstByte()
		h.writeFrames(w, s.frames(nil, b))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
