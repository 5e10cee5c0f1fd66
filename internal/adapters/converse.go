package adapters

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Bedrock's Converse API
// (https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html,
// API_runtime_ConverseStream.html): one request format for every model
// Bedrock hosts, translated from and to Chat Completions.

type cvRequest struct {
	Messages        []cvMessage   `json:"messages"`
	System          []cvBlock     `json:"system,omitempty"`
	InferenceConfig *cvInference  `json:"inferenceConfig,omitempty"`
	ToolConfig      *cvToolConfig `json:"toolConfig,omitempty"`
}

type cvMessage struct {
	Role    string    `json:"role"`
	Content []cvBlock `json:"content"`
}

// cvBlock is a ContentBlock (and a SystemContentBlock: text only).
type cvBlock struct {
	Text       string        `json:"text,omitempty"`
	Image      *cvMedia      `json:"image,omitempty"`
	Document   *cvMedia      `json:"document,omitempty"`
	ToolUse    *cvToolUse    `json:"toolUse,omitempty"`
	ToolResult *cvToolResult `json:"toolResult,omitempty"`
}

type cvMedia struct {
	Format string        `json:"format"`
	Name   string        `json:"name,omitempty"` // documents only
	Source cvMediaSource `json:"source"`
}

type cvMediaSource struct {
	Bytes string `json:"bytes"` // base64
}

type cvToolUse struct {
	ToolUseID string          `json:"toolUseId"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
}

type cvToolResult struct {
	ToolUseID string    `json:"toolUseId"`
	Content   []cvBlock `json:"content"`
}

type cvInference struct {
	MaxTokens     int64    `json:"maxTokens,omitempty"`
	Temperature   *float64 `json:"temperature,omitempty"`
	TopP          *float64 `json:"topP,omitempty"`
	StopSequences []string `json:"stopSequences,omitempty"`
}

type cvToolConfig struct {
	Tools      []cvTool        `json:"tools"`
	ToolChoice json.RawMessage `json:"toolChoice,omitempty"`
}

type cvTool struct {
	ToolSpec cvToolSpec `json:"toolSpec"`
}

type cvToolSpec struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	InputSchema struct {
		JSON json.RawMessage `json:"json"`
	} `json:"inputSchema"`
}

// cvImageFormats are the image formats Converse takes, by media type.
var cvImageFormats = map[string]string{"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/gif": "gif", "image/webp": "webp"}

// chatToConverse translates a Chat Completions request into a Converse
// body. It fails on what Converse cannot express: n > 1, an image that is
// no base64 data URL (Converse takes bytes or S3 locations, not URLs), a
// file that is no PDF, a non-function tool, response_format (Converse
// has no JSON mode), a tool result answering no earlier call. Consecutive
// messages of one role (a user message after tool results) are merged, as
// Converse wants roles to alternate; tool_choice "none" cannot be said and
// leaves the choice to the model. Seed and the penalties have no Converse
// form and are dropped.
func chatToConverse(body []byte) ([]byte, error) {
	r, err := chat.ParseRequest(body, "bedrock converse")
	if err != nil {
		return nil, err
	}
	var out cvRequest
	if err := converseMessages(r, &out); err != nil {
		return nil, err
	}
	if len(out.Messages) == 0 {
		return nil, errors.New("bedrock converse needs at least one user or assistant message")
	}
	if out.Messages[0].Role != "user" {
		return nil, errors.New("bedrock converse needs the conversation to start with a user message")
	}
	if rf := r.ResponseFormat; rf != nil && rf.Type != "" && rf.Type != "text" {
		return nil, fmt.Errorf("response_format %q is not supported by bedrock converse", rf.Type)
	}
	inf := cvInference{MaxTokens: r.MaxOutputTokens(0), Temperature: r.Temperature, TopP: r.TopP}
	if inf.StopSequences, err = chat.StopSequences(r.Stop); err != nil {
		return nil, err
	}
	if inf.MaxTokens > 0 || inf.Temperature != nil || inf.TopP != nil || len(inf.StopSequences) > 0 {
		out.InferenceConfig = &inf
	}
	if len(r.Tools) > 0 {
		if out.ToolConfig, err = converseTools(r); err != nil {
			return nil, err
		}
	}
	return json.Marshal(out)
}

// converseMessages translates r's messages into out's system blocks and
// messages (chatToConverse), merging consecutive messages of one role. It
// fails on a message Converse cannot express, naming it by its index
// (messages[i]).
func converseMessages(r *chat.Request, out *cvRequest) error {
	calls := map[string]bool{}
	add := func(role string, blocks []cvBlock) {
		if len(blocks) == 0 {
			return
		}
		if n := len(out.Messages); n > 0 && out.Messages[n-1].Role == role {
			out.Messages[n-1].Content = append(out.Messages[n-1].Content, blocks...)
			return
		}
		out.Messages = append(out.Messages, cvMessage{Role: role, Content: blocks})
	}
	for i := range r.Messages {
		m := &r.Messages[i]
		switch m.Role {
		case "system", "developer":
			if text := m.Content.String(); text != "" {
				out.System = append(out.System, cvBlock{Text: text})
			}
		case "user":
			blocks, err := converseUserBlocks(m)
			if err != nil {
				return fmt.Errorf("messages[%d]: %w", i, err)
			}
			add("user", blocks)
		case "assistant":
			var blocks []cvBlock
			for _, p := range m.Content.AsParts() {
				if (p.Type == "text" || p.Type == "") && p.Text != "" {
					blocks = append(blocks, cvBlock{Text: p.Text})
				}
			}
			for _, c := range m.ToolCalls {
				if c.ID == "" {
					return fmt.Errorf("messages[%d]: a tool call without an id", i)
				}
				calls[c.ID] = true
				blocks = append(blocks, cvBlock{ToolUse: &cvToolUse{
					ToolUseID: c.ID, Name: c.Function.Name,
					Input: chat.ObjectOr(string(c.Function.Arguments), json.RawMessage("{}")),
				}})
			}
			add("assistant", blocks)
		case "tool":
			if !calls[m.ToolCallID] {
				return fmt.Errorf("messages[%d]: tool result %q answers no earlier tool call", i, m.ToolCallID)
			}
			// Text, images and documents, each a block, as a user's.
			content, err := converseUserBlocks(m)
			if err != nil {
				return fmt.Errorf("messages[%d]: %w", i, err)
			}
			if len(content) == 0 {
				content = []cvBlock{{Text: " "}} // a result must hold content
			}
			add("user", []cvBlock{{ToolResult: &cvToolResult{ToolUseID: m.ToolCallID, Content: content}}})
		default:
			return fmt.Errorf("messages[%d]: unsupported role %q", i, m.Role)
		}
	}
	return nil
}

// converseTools translates r's tools and tool_choice into a Converse
// toolConfig (chatToConverse): function tools only; tool_choice "none"
// has no Converse form and leaves the choice to the model.
func converseTools(r *chat.Request) (*cvToolConfig, error) {
	tc := &cvToolConfig{}
	for _, t := range r.Tools {
		if t.Type != "" && t.Type != "function" {
			return nil, fmt.Errorf("tool type %q is not supported by bedrock converse", t.Type)
		}
		spec := cvToolSpec{Name: t.Function.Name, Description: t.Function.Description}
		spec.InputSchema.JSON = json.RawMessage(`{"type":"object","properties":{}}`)
		if p := bytes.TrimSpace(t.Function.Parameters); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
			spec.InputSchema.JSON = p
		}
		tc.Tools = append(tc.Tools, cvTool{ToolSpec: spec})
	}
	choice, err := chat.ParseToolChoice(r.ToolChoice)
	if err != nil {
		return nil, err
	}
	switch choice.Mode {
	case "auto":
		tc.ToolChoice = json.RawMessage(`{"auto":{}}`)
	case "required":
		tc.ToolChoice = json.RawMessage(`{"any":{}}`)
	case "function":
		name, _ := json.Marshal(choice.Name)
		tc.ToolChoice = json.RawMessage(`{"tool":{"name":` + string(name) + `}}`)
	}
	return tc, nil
}

// converseUserBlocks translates a user message's content.
func converseUserBlocks(m *chat.Message) ([]cvBlock, error) {
	var out []cvBlock
	for _, p := range m.Content.AsParts() {
		switch p.Type {
		case "text", "":
			if p.Text != "" {
				out = append(out, cvBlock{Text: p.Text})
			}
		case "image_url", "file":
			media, err := p.Media()
			if err != nil {
				return nil, err
			}
			if media.URL != "" {
				return nil, errors.New("bedrock converse takes images as base64 data URLs, not links")
			}
			if media.File {
				if media.MediaType != "application/pdf" {
					return nil, fmt.Errorf("bedrock converse: file type %q is not supported (PDF is)", media.MediaType)
				}
				out = append(out, cvBlock{Document: &cvMedia{Format: "pdf", Name: "document", Source: cvMediaSource{Bytes: media.Data}}})
				continue
			}
			format, ok := cvImageFormats[strings.ToLower(media.MediaType)]
			if !ok {
				return nil, fmt.Errorf("bedrock converse: image type %q is not supported", media.MediaType)
			}
			out = append(out, cvBlock{Image: &cvMedia{Format: format, Source: cvMediaSource{Bytes: media.Data}}})
		default:
			return nil, fmt.Errorf("content part type %q is not supported by bedrock converse", p.Type)
		}
	}
	return out, nil
}

// The ConverseResponse.

type cvResponse struct {
	Output struct {
		Message *struct {
			Content []cvRespBlock `json:"content"`
		} `json:"message"`
	} `json:"output"`
	StopReason string   `json:"stopReason"`
	Usage      *cvUsage `json:"usage"`
}

type cvRespBlock struct {
	Text    *string `json:"text"`
	ToolUse *struct {
		ToolUseID string          `json:"toolUseId"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
	} `json:"toolUse"`
}

type cvUsage struct {
	InputTokens           int64 `json:"inputTokens"`
	OutputTokens          int64 `json:"outputTokens"`
	TotalTokens           int64 `json:"totalTokens"`
	CacheReadInputTokens  int64 `json:"cacheReadInputTokens"`
	CacheWriteInputTokens int64 `json:"cacheWriteInputTokens"`
	// CacheDetails splits the writes by lifetime (ttl "5m" or "1h").
	CacheDetails []struct {
		TTL         string `json:"ttl"`
		InputTokens int64  `json:"inputTokens"`
	} `json:"cacheDetails"`
}

// chatUsage is Converse usage as Chat Completions usage: prompt tokens
// count the cached ones too.
func (u *cvUsage) chatUsage() *chat.Usage {
	if u == nil {
		return nil
	}
	in := u.InputTokens + u.CacheReadInputTokens + u.CacheWriteInputTokens
	out := &chat.Usage{PromptTokens: in, CompletionTokens: u.OutputTokens, TotalTokens: in + u.OutputTokens,
		PromptTokensDetails: chat.CacheDetails(u.CacheReadInputTokens, u.CacheWriteInputTokens)}
	for _, d := range u.CacheDetails {
		if out.CacheCreation == nil {
			out.CacheCreation = &chat.CacheCreation{}
		}
		switch d.TTL {
		case "1h":
			out.CacheCreation.Ephemeral1h += max(d.InputTokens, 0)
		case "5m":
			out.CacheCreation.Ephemeral5m += max(d.InputTokens, 0)
		}
	}
	return out
}

// converseFinish maps a Converse stopReason to a finish_reason.
func converseFinish(reason string) string {
	switch reason {
	case "max_tokens", "model_context_window_exceeded":
		return "length"
	case "tool_use":
		return "tool_calls"
	case "guardrail_intervened", "content_filtered":
		return "content_filter"
	}
	return "stop"
}

// converseReader reads Converse answers and ConverseStream event streams
// into Chat.
type converseReader struct{}

func (converseReader) answer(p *plan, body []byte) ([]byte, error) {
	var r cvResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("reading converse answer: %w", err)
	}
	if r.Output.Message == nil || r.StopReason == "" {
		return nil, errors.New("converse answer has no message")
	}
	var text strings.Builder
	var calls []chat.ToolCall
	for _, b := range r.Output.Message.Content {
		switch {
		case b.Text != nil:
			text.WriteString(*b.Text)
		case b.ToolUse != nil:
			calls = append(calls, chat.ToolCall{ID: b.ToolUse.ToolUseID, Type: "function",
				Function: chat.FunctionCall{Name: b.ToolUse.Name, Arguments: chat.ArgumentsOf(b.ToolUse.Input)}})
		}
	}
	return chat.NewCompletion("", p.model, text.String(), calls, converseFinish(r.StopReason), r.Usage.chatUsage())
}

// decoder is never used: Converse streams are event streams (stream).
func (converseReader) decoder(p *plan) provider.EventDecoder { return &converseStream{p: p} }

func (c converseReader) stream(p *plan, body io.Reader) provider.Stream {
	s := &converseStream{p: p}
	return newEventStream(body, s.Complete, s.decode)
}

// converseStream turns ConverseStream's events (messageStart,
// contentBlockStart, contentBlockDelta, contentBlockStop, messageStop,
// metadata) into chunks. messageStop carries the finish; metadata, which
// follows it, the usage: a usage-only chunk (the router counts it, and
// keeps it from a client that did not ask), and the stream is whole once
// it arrived when the client asked for usage.
type converseStream struct {
	p         *plan
	w         chat.ChunkWriter
	id        string
	started   bool
	tools     map[int]int // contentBlockIndex -> tool_calls index
	nTools    int
	finished  bool
	usageSeen bool
}

func (s *converseStream) Complete() bool {
	return s.finished && (s.usageSeen || !s.p.includeUsage)
}

// Decode implements provider.EventDecoder for SSE (not used by Bedrock).
func (s *converseStream) Decode(ev *provider.Event) (provider.Event, provider.EventKind, provider.Observation) {
	return s.decode(ev.Name, ev.Data)
}

func (s *converseStream) start() {
	if !s.started {
		s.id = chat.NewID("chatcmpl-")
		s.w.Start(s.id, s.p.model)
		s.started = true
	}
}

func (s *converseStream) decode(typ string, payload []byte) (provider.Event, provider.EventKind, provider.Observation) {
	none := provider.Observation{}
	var e struct {
		ContentBlockIndex int `json:"contentBlockIndex"`
		Start             *struct {
			ToolUse *struct {
				ToolUseID string `json:"toolUseId"`
				Name      string `json:"name"`
			} `json:"toolUse"`
		} `json:"start"`
		Delta *struct {
			Text    *string `json:"text"`
			ToolUse *struct {
				Input string `json:"input"`
			} `json:"toolUse"`
			ReasoningContent json.RawMessage `json:"reasoningContent"`
		} `json:"delta"`
		StopReason string   `json:"stopReason"`
		Usage      *cvUsage `json:"usage"`
	}
	if err := json.Unmarshal(payload, &e); err != nil {
		return provider.Event{}, provider.EventError, streamBroken("invalid JSON event in stream")
	}
	s.start()
	switch typ {
	case "messageStart", "contentBlockStop":
		return provider.Event{}, provider.EventSkip, none
	case "contentBlockStart":
		if e.Start == nil || e.Start.ToolUse == nil {
			return provider.Event{}, provider.EventSkip, none
		}
		if s.tools == nil {
			s.tools = map[int]int{}
		}
		idx := s.nTools
		s.tools[e.ContentBlockIndex] = idx
		s.nTools++
		d := chat.Delta{ToolCalls: []chat.ToolCall{{Index: &idx, ID: e.Start.ToolUse.ToolUseID, Type: "function",
			Function: chat.FunctionCall{Name: e.Start.ToolUse.Name}}}}
		return provider.Event{Data: s.w.Chunk(d, "", nil)}, provider.EventData, none
	case "contentBlockDelta":
		switch {
		case e.Delta == nil:
			return provider.Event{}, provider.EventSkip, none
		case e.Delta.Text != nil:
			if *e.Delta.Text == "" {
				return provider.Event{}, provider.EventSkip, none
			}
			return provider.Event{Data: s.w.Chunk(chat.Delta{Content: e.Delta.Text}, "", nil)}, provider.EventData, none
		case e.Delta.ToolUse != nil:
			idx, ok := s.tools[e.ContentBlockIndex]
			if !ok {
				return provider.Event{}, provider.EventError, streamBroken("tool input for a block that began no tool call")
			}
			d := chat.Delta{ToolCalls: []chat.ToolCall{{Index: &idx, Function: chat.FunctionCall{Arguments: chat.Arguments(e.Delta.ToolUse.Input)}}}}
			return provider.Event{Data: s.w.Chunk(d, "", nil)}, provider.EventData, none
		case len(e.Delta.ReasoningContent) > 0:
			// Thinking: the model producing, nothing for a Chat client.
			return provider.Event{}, provider.EventData, none
		}
		return provider.Event{}, provider.EventSkip, none
	case "messageStop":
		s.finished = true
		return provider.Event{Data: s.w.Chunk(chat.Delta{}, converseFinish(e.StopReason), nil)}, provider.EventFinal, none
	case "metadata":
		s.usageSeen = true
		if e.Usage == nil {
			return provider.Event{}, provider.EventSkip, none
		}
		// Always relayed: the router counts it, and keeps it from a Chat
		// client that did not ask for it (provider.UsageCounter).
		b, _ := json.Marshal(chat.Chunk{ID: s.id, Object: "chat.completion.chunk", Created: time.Now().Unix(),
			Model: s.p.model, Choices: []chat.ChunkChoice{}, Usage: e.Usage.chatUsage()})
		return provider.Event{Data: b}, provider.EventSkip, none
	}
	return provider.Event{}, provider.EventSkip, none
}
