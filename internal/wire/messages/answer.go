package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
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
		return nil, fmt.Errorf("anthropic answered an error: %s: %s", r.Error.Type, truncate(r.Error.Message, 200))
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

// toolInput is a call's arguments as the object tool_use.input wants; the
// rare arguments that are not JSON (a model's slip) travel as a string
// rather than being lost.
func toolInput(args string) json.RawMessage {
	b := bytes.TrimSpace([]byte(args))
	if len(b) == 0 {
		return json.RawMessage("{}")
	}
	if json.Valid(b) {
		return b
	}
	q, _ := json.Marshal(args)
	return q
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
		id := tc.ID
		if id == "" {
			id = chat.NewID("toolu_")
		}
		content = append(content, Block{Type: "tool_use", ID: id, Name: tc.Function.Name, Input: toolInput(string(tc.Function.Arguments))})
	}
	id := c.ID
	if id == "" {
		id = chat.NewID("msg_")
	}
	return json.Marshal(Response{
		ID: id, Type: "message", Role: "assistant", Model: c.Model,
		Content: content, StopReason: &stop, Usage: usageFromChat(c.Usage),
	})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
