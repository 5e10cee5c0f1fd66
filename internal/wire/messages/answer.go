package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/excerpt"
	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// ChatUsage converts usage to Chat Completions': prompt_tokens count the
// cache reads and writes too, input_tokens only what was neither.
func (u Usage) ChatUsage(output int64) *chat.Usage {
	prompt := max(u.InputTokens, 0) + max(u.CacheCreationInputTokens, 0) + max(u.CacheReadInputTokens, 0)
	out := &chat.Usage{PromptTokens: prompt, CompletionTokens: max(output, 0), TotalTokens: prompt + max(output, 0),
		PromptTokensDetails: chat.CacheDetails(u.CacheReadInputTokens, u.CacheCreationInputTokens), CacheCreation: u.CacheCreation}
	return out
}

// usageFromChat converts Chat Completions usage: input_tokens leave out what
// was read from or written to the cache, prompt_tokens include it.
func usageFromChat(u *chat.Usage) Usage {
	if u == nil {
		return Usage{}
	}
	prompt := max(u.PromptTokens, 0)
	cached := min(max(u.CachedTokens(), 0), prompt)
	written := min(max(u.CacheWriteTokens(), 0), prompt-cached)
	return Usage{InputTokens: prompt - cached - written, OutputTokens: max(u.CompletionTokens, 0), CacheReadInputTokens: cached,
		CacheCreationInputTokens: written, CacheCreation: u.CacheCreation}
}

// FinishReason maps a stop_reason to a finish_reason.
func FinishReason(stop string) string {
	switch stop {
	case "max_tokens", "model_context_window_exceeded":
		return "length"
	case "tool_use":
		return "tool_calls"
	case "refusal":
		return "content_filter"
	}
	return "stop" // end_turn, stop_sequence, pause_turn
}

// StopReason maps a finish_reason back to a stop_reason.
func StopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls", "function_call":
		return "tool_use"
	case "content_filter":
		return "refusal"
	}
	return "end_turn"
}

// ToChatAnswer translates a Messages answer into a chat.completion: text
// blocks become the message content, tool_use blocks tool_calls; thinking
// and server-tool blocks are dropped.
func ToChatAnswer(body []byte) ([]byte, error) {
	var r Response
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("reading anthropic message: %w", err)
	}
	if r.Error != nil {
		return nil, fmt.Errorf("anthropic answered an error: %s: %s", r.Error.Type, excerpt.Of(r.Error.Message, 200))
	}
	if r.Type != "message" || r.Content == nil {
		return nil, errors.New("anthropic answer is not a message")
	}
	var text strings.Builder
	var calls []chat.ToolCall
	for _, b := range r.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.TextOf())
		case "tool_use":
			calls = append(calls, chat.ToolCall{ID: b.ID, Type: "function", Function: chat.FunctionCall{Name: b.Name, Arguments: chat.ArgumentsOf(b.Input)}})
		}
	}
	stop := ""
	if r.StopReason != nil {
		stop = *r.StopReason
	}
	return chat.NewCompletion(r.ID, r.Model, text.String(), calls, FinishReason(stop), r.Usage.ChatUsage(r.Usage.OutputTokens))
}

// toolInput is a call's arguments as the object tool_use.input must be
// (the Messages API's and its SDKs': the Node SDK's stream helper parses
// the input_json_deltas as an object). Arguments are the model's text and
// need not be valid JSON (OpenAI's reference says so); they become:
//   - a JSON object: itself;
//   - empty: {};
//   - a JSON string holding an object (a model's double encoding): that object;
//   - anything else (an array, a scalar, broken JSON): {"_raw": args},
//     the text kept for the client rather than lost, as an object.
func toolInput(args string) json.RawMessage {
	b := bytes.TrimSpace([]byte(args))
	switch {
	case len(b) == 0:
		return json.RawMessage("{}")
	case b[0] == '{' && json.Valid(b):
		return b
	case b[0] == '"':
		var inner string
		if json.Unmarshal(b, &inner) == nil {
			if in := bytes.TrimSpace([]byte(inner)); len(in) > 0 && in[0] == '{' && json.Valid(in) {
				return in
			}
		}
	}
	q, _ := jsonbody.Marshal(map[string]string{"_raw": args}) // a string map always marshals
	return q
}

// messageID is the id of a message translated from an answer or stream
// with id: kept when it is a Messages one ("msg_"), else a fresh "msg_"
// one (a "chatcmpl-" id is no message id).
func messageID(id string) string {
	if strings.HasPrefix(id, "msg_") {
		return id
	}
	return chat.NewID("msg_")
}

// FromChatAnswer translates a chat.completion into a Messages answer: the
// first choice's text as a text block and its tool calls as tool_use
// blocks, the finish_reason as stop_reason (stop end_turn, length
// max_tokens, tool_calls tool_use, content_filter refusal), usage as
// input/output tokens, and the model that answered.
func FromChatAnswer(completion []byte) ([]byte, error) {
	var c chat.Completion
	if err := json.Unmarshal(completion, &c); err != nil {
		return nil, fmt.Errorf("reading chat completion: %w", err)
	}
	if len(c.Choices) == 0 {
		return nil, errors.New("chat completion has no choices")
	}
	ch := c.Choices[0]
	text := ch.Message.Content.String()
	stop := StopReason(ch.FinishReason)
	if text == "" && ch.Message.Refusal != "" {
		text, stop = ch.Message.Refusal, "refusal"
	}
	content := []Block{}
	if text != "" {
		content = append(content, TextBlock(text))
	}
	for _, tc := range ch.Message.ToolCalls {
		content = append(content, Block{Type: "tool_use", ID: callID(tc.ID), Name: tc.Function.Name, Input: toolInput(string(tc.Function.Arguments))})
	}
	return jsonbody.Marshal(Response{
		ID: messageID(c.ID), Type: "message", Role: "assistant", Model: c.Model,
		Content: content, StopReason: &stop, Usage: usageFromChat(c.Usage),
	})
}

// callID is a tool call's tool_use id: ToolID's mapping, or a fresh
// "toolu_" one when the call has none.
func callID(id string) string {
	if id == "" {
		return chat.NewID("toolu_")
	}
	return ToolID(id)
}
