package chat

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// Completion is a chat.completion answer.
type Completion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`
	// Error is set by servers that answer an error with a 200.
	Error json.RawMessage `json:"error,omitempty"`
}

// Choice is one choice of a Completion.
type Choice struct {
	Index        int       `json:"index"`
	Message      Message   `json:"message"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason string    `json:"finish_reason"`
}

// Usage is an answer's token usage. PromptTokens counts cached tokens too;
// CompletionTokens counts reasoning tokens too.
type Usage struct {
	PromptTokens            int64              `json:"prompt_tokens"`
	CompletionTokens        int64              `json:"completion_tokens"`
	TotalTokens             int64              `json:"total_tokens"`
	PromptTokensDetails     *PromptDetails     `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *CompletionDetails `json:"completion_tokens_details,omitempty"`
	// CacheCreation splits the cache writes by lifetime where the
	// provider says (an Anthropic or Bedrock answer translated), under
	// Anthropic's name: no Chat Completions field says it.
	CacheCreation *CacheCreation `json:"cache_creation,omitempty"`
}

// PromptDetails is usage.prompt_tokens_details: CachedTokens were read
// from the prompt cache, CacheWriteTokens written to it (OpenRouter's
// name for Anthropic's cache_creation_input_tokens); both are part of
// prompt_tokens.
type PromptDetails struct {
	CachedTokens     int64 `json:"cached_tokens"`
	CacheWriteTokens int64 `json:"cache_write_tokens,omitempty"`
}

// CacheCreation is Anthropic's usage.cache_creation: the cache writes of
// each lifetime.
type CacheCreation struct {
	Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
	Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
}

// CacheDetails returns the prompt_tokens_details of cached tokens read
// and written (nil when both are 0).
func CacheDetails(read, write int64) *PromptDetails {
	if read <= 0 && write <= 0 {
		return nil
	}
	return &PromptDetails{CachedTokens: max(read, 0), CacheWriteTokens: max(write, 0)}
}

// CompletionDetails is usage.completion_tokens_details.
type CompletionDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// CachedTokens returns the cached prompt tokens, 0 when not stated.
func (u *Usage) CachedTokens() int64 {
	if u == nil || u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// CacheWriteTokens returns the prompt tokens written to the cache, 0 when
// not stated.
func (u *Usage) CacheWriteTokens() int64 {
	if u == nil || u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CacheWriteTokens
}

// NewCompletion returns a translated answer as a one-choice
// chat.completion: the text (null when the answer is only tool calls), the
// tool calls, the finish_reason and usage; an empty id gets a fresh one.
func NewCompletion(id, model, text string, calls []ToolCall, finish string, usage *Usage) ([]byte, error) {
	msg := answerMessage{Role: "assistant", ToolCalls: calls}
	if text != "" || len(calls) == 0 {
		msg.Content = Text(text)
	}
	if id == "" {
		id = NewID("chatcmpl-")
	}
	return jsonbody.Marshal(struct {
		Completion
		Choices []answerChoice `json:"choices"`
	}{Completion{ID: id, Object: "chat.completion", Created: time.Now().Unix(), Model: model, Usage: usage},
		[]answerChoice{{Message: msg, FinishReason: finish}}})
}

// answerChoice and answerMessage are a choice as the router writes it:
// message.refusal is required (ChatCompletionResponseMessage in OpenAI's
// spec), null when there is none; Message, which requests use too, leaves
// it out when empty.
type answerChoice struct {
	Index        int           `json:"index"`
	Message      answerMessage `json:"message"`
	Logprobs     *struct{}     `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
}

type answerMessage struct {
	Role      string     `json:"role"`
	Content   Content    `json:"content"`
	Refusal   *string    `json:"refusal"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// Chunk is a chat.completion.chunk, one event of a streamed answer.
type Chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []ChunkChoice `json:"choices"`
	Usage   *Usage        `json:"usage,omitempty"`
}

// ChunkChoice is one choice of a Chunk.
type ChunkChoice struct {
	Index        int       `json:"index"`
	Delta        Delta     `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

// Delta is what a chunk adds to a choice.
type Delta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	Refusal   *string    `json:"refusal,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ChunkWriter writes the chunks of one translated stream. The part before
// the delta is the same for every chunk and built once; the role goes in
// the first chunk written.
type ChunkWriter struct {
	head     []byte
	buf      []byte
	roleSent bool
}

// Start fixes the stream's id and model (from the first event naming them).
func (w *ChunkWriter) Start(id, model string) {
	w.head = append(w.head[:0], `{"id":`...)
	w.head = appendString(w.head, id)
	w.head = append(w.head, `,"object":"chat.completion.chunk","created":`...)
	w.head = strconv.AppendInt(w.head, time.Now().Unix(), 10)
	w.head = append(w.head, `,"model":`...)
	w.head = appendString(w.head, model)
	w.head = append(w.head, `,"choices":[{"index":0,"delta":`...)
}

// Chunk returns one chunk; finish "" is a null finish_reason and usage nil
// leaves usage out. The result is valid until the next call.
func (w *ChunkWriter) Chunk(d Delta, finish string, usage *Usage) []byte {
	if !w.roleSent {
		d.Role, w.roleSent = "assistant", true
	}
	if len(w.head) == 0 {
		w.Start(NewID("chatcmpl-"), "")
	}
	delta, _ := jsonbody.Marshal(d) // plain structs: cannot fail
	w.buf = append(append(w.buf[:0], w.head...), delta...)
	w.buf = append(w.buf, `,"logprobs":null,"finish_reason":`...)
	if finish == "" {
		w.buf = append(w.buf, "null"...)
	} else {
		w.buf = appendString(w.buf, finish)
	}
	w.buf = append(w.buf, "}]"...)
	if usage != nil {
		u, _ := jsonbody.Marshal(usage)
		w.buf = append(append(w.buf, `,"usage":`...), u...)
	}
	return append(w.buf, '}')
}

func appendString(b []byte, s string) []byte {
	q, _ := jsonbody.Marshal(s) // a string always marshals
	return append(b, q...)
}
