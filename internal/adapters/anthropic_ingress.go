package adapters

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Anthropic Messages API ingress: for clients that speak Anthropic's
// Messages API (https://docs.anthropic.com/en/api/messages) to the router.
// The router turns their request into the canonical Chat Completions body
// (MessagesToChat), routes it like any other, and turns the answer back
// (ChatToMessages, MessagesStreamEncoder) or the error (AnthropicError).

// ErrMessagesRequest wraps every error of MessagesToChat: the client's
// request is not a valid Messages request (answer 400 invalid_request_error).
var ErrMessagesRequest = errors.New("invalid Messages request")

func badMessages(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMessagesRequest, fmt.Sprintf(format, args...))
}

type msgRequest struct {
	Model         string          `json:"model"`
	MaxTokens     *int64          `json:"max_tokens"`
	System        json.RawMessage `json:"system"`
	Messages      []msgMessage    `json:"messages"`
	Tools         []msgTool       `json:"tools"`
	ToolChoice    *msgToolChoice  `json:"tool_choice"`
	StopSequences []string        `json:"stop_sequences"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	Stream        bool            `json:"stream"`
	Metadata      *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

type msgMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"` // a string or blocks
}

type msgBlock struct {
	Type   string `json:"type"`
	Text   string `json:"text"`
	Source *struct {
		Type      string `json:"type"` // base64, url, text
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
	// tool_use
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
	// tool_result: content is a string or blocks
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	// document
	Title string `json:"title"`
}

type msgTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type msgToolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
}

// The Chat Completions request MessagesToChat writes.

type chatOutRequest struct {
	Model             string          `json:"model"`
	Messages          []chatOutReqMsg `json:"messages"`
	MaxTokens         int64           `json:"max_tokens"`
	Temperature       *float64        `json:"temperature,omitempty"`
	TopP              *float64        `json:"top_p,omitempty"`
	Stop              []string        `json:"stop,omitempty"`
	Tools             []chatOutTool   `json:"tools,omitempty"`
	ToolChoice        any             `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
	User              string          `json:"user,omitempty"`
	Stream            bool            `json:"stream,omitempty"`
	StreamOptions     *chatStreamOpts `json:"stream_options,omitempty"`
}

type chatStreamOpts struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatOutReqMsg struct {
	Role string `json:"role"`
	// Content is a string, []chatOutReqPart, or nil (null: tool calls only).
	Content    any                  `json:"content"`
	ToolCalls  []chatOutReqToolCall `json:"tool_calls,omitempty"`
	ToolCallID string               `json:"tool_call_id,omitempty"`
}

type chatOutReqPart struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url,omitempty"`
	File *struct {
		FileData string `json:"file_data"`
		Filename string `json:"filename,omitempty"`
	} `json:"file,omitempty"`
}

type chatOutReqToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatOutTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	} `json:"function"`
}

// MessagesToChat translates an Anthropic Messages request into a Chat
// Completions body, returning also its model (the client-facing model
// group) and stream flag. A stream asks for usage
// (stream_options.include_usage), which the Messages stream reports at its
// end. top_k and thinking have no Chat Completions equivalent and are
// dropped. Errors wrap ErrMessagesRequest: invalid JSON, no model, no
// messages, no or a non-positive max_tokens, an unknown role or block, or
// a server tool (web search, bash...) the router cannot run.
func MessagesToChat(body []byte) (chat []byte, model string, stream bool, err error) {
	var r msgRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, "", false, badMessages("%v", err)
	}
	switch {
	case r.Model == "":
		return nil, "", false, badMessages("model: field required")
	case len(r.Messages) == 0:
		return nil, "", false, badMessages("messages: at least one message is required")
	case r.MaxTokens == nil:
		return nil, "", false, badMessages("max_tokens: field required")
	case *r.MaxTokens < 1:
		return nil, "", false, badMessages("max_tokens: must be at least 1")
	}
	out := chatOutRequest{
		Model:       r.Model,
		MaxTokens:   *r.MaxTokens,
		Temperature: r.Temperature,
		TopP:        r.TopP,
		Stop:        r.StopSequences,
		Stream:      r.Stream,
	}
	if r.Stream {
		out.StreamOptions = &chatStreamOpts{IncludeUsage: true}
	}
	if r.Metadata != nil {
		out.User = r.Metadata.UserID
	}
	if sys, err := systemText(r.System); err != nil {
		return nil, "", false, err
	} else if sys != "" {
		out.Messages = append(out.Messages, chatOutReqMsg{Role: "system", Content: sys})
	}
	for i, m := range r.Messages {
		var err error
		switch m.Role {
		case "user":
			err = out.addUser(m.Content)
		case "assistant":
			err = out.addAssistant(m.Content)
		default:
			err = fmt.Errorf("unsupported role %q", m.Role)
		}
		if err != nil {
			return nil, "", false, badMessages("messages[%d]: %v", i, err)
		}
	}
	for i, t := range r.Tools {
		if t.Type != "" && t.Type != "custom" {
			return nil, "", false, badMessages("tools[%d]: tool type %q is not supported", i, t.Type)
		}
		var ct chatOutTool
		ct.Type = "function"
		ct.Function.Name, ct.Function.Description, ct.Function.Parameters = t.Name, t.Description, t.InputSchema
		out.Tools = append(out.Tools, ct)
	}
	if tc := r.ToolChoice; tc != nil && len(out.Tools) > 0 {
		switch tc.Type {
		case "auto", "":
			out.ToolChoice = "auto"
		case "any":
			out.ToolChoice = "required"
		case "none":
			out.ToolChoice = "none"
		case "tool":
			out.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
		default:
			return nil, "", false, badMessages("tool_choice: unsupported type %q", tc.Type)
		}
		if tc.DisableParallelToolUse {
			f := false
			out.ParallelToolCalls = &f
		}
	}
	chat, err = json.Marshal(out)
	if err != nil {
		return nil, "", false, badMessages("%v", err)
	}
	return chat, r.Model, r.Stream, nil
}

// systemText reads system: a string or text blocks (joined by a blank line).
func systemText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []msgBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", badMessages("system: must be a string or text blocks")
	}
	texts := make([]string, 0, len(blocks))
	for _, b := range blocks {
		if b.Text != "" {
			texts = append(texts, b.Text)
		}
	}
	return strings.Join(texts, "\n\n"), nil
}

// contentBlocks reads a message's content: a string is one text block.
func contentBlocks(raw json.RawMessage) ([]msgBlock, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []msgBlock{{Type: "text", Text: s}}, nil
	}
	var blocks []msgBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, errors.New("content must be a string or an array of content blocks")
	}
	return blocks, nil
}

// addUser adds a user turn: its tool results become tool messages first
// (Chat Completions answers a call with a message of role tool), then the
// rest as one user message.
func (out *chatOutRequest) addUser(content json.RawMessage) error {
	blocks, err := contentBlocks(content)
	if err != nil {
		return err
	}
	var parts []chatOutReqPart
	for _, b := range blocks {
		switch b.Type {
		case "tool_result":
			text, images, err := toolResultContent(b.Content)
			if err != nil {
				return err
			}
			out.Messages = append(out.Messages, chatOutReqMsg{Role: "tool", ToolCallID: b.ToolUseID, Content: text})
			// A tool message holds text only: images go with the user turn.
			parts = append(parts, images...)
		default:
			p, ok, err := userPart(b)
			if err != nil {
				return err
			}
			if ok {
				parts = append(parts, p)
			}
		}
	}
	switch {
	case len(parts) == 0:
	case len(parts) == 1 && parts[0].Type == "text":
		out.Messages = append(out.Messages, chatOutReqMsg{Role: "user", Content: parts[0].Text})
	default:
		out.Messages = append(out.Messages, chatOutReqMsg{Role: "user", Content: parts})
	}
	return nil
}

// userPart translates one user block; ok is false for a block with nothing
// to send (empty text).
func userPart(b msgBlock) (chatOutReqPart, bool, error) {
	switch b.Type {
	case "text":
		return chatOutReqPart{Type: "text", Text: b.Text}, b.Text != "", nil
	case "image":
		if b.Source == nil {
			return chatOutReqPart{}, false, errors.New("image block without source")
		}
		p := chatOutReqPart{Type: "image_url", ImageURL: &struct {
			URL string `json:"url"`
		}{}}
		switch b.Source.Type {
		case "base64":
			p.ImageURL.URL = "data:" + b.Source.MediaType + ";base64," + b.Source.Data
		case "url":
			p.ImageURL.URL = b.Source.URL
		default:
			return chatOutReqPart{}, false, fmt.Errorf("image source type %q is not supported", b.Source.Type)
		}
		return p, true, nil
	case "document":
		if b.Source == nil {
			return chatOutReqPart{}, false, errors.New("document block without source")
		}
		switch b.Source.Type {
		case "text":
			return chatOutReqPart{Type: "text", Text: b.Source.Data}, b.Source.Data != "", nil
		case "base64":
			p := chatOutReqPart{Type: "file", File: &struct {
				FileData string `json:"file_data"`
				Filename string `json:"filename,omitempty"`
			}{FileData: "data:" + b.Source.MediaType + ";base64," + b.Source.Data, Filename: b.Title}}
			return p, true, nil
		}
		return chatOutReqPart{}, false, fmt.Errorf("document source type %q is not supported", b.Source.Type)
	}
	return chatOutReqPart{}, false, fmt.Errorf("content block type %q is not supported in a user turn", b.Type)
}

// toolResultContent reads a tool_result's content: its text, and its
// images as user parts.
func toolResultContent(raw json.RawMessage) (string, []chatOutReqPart, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil, nil
	}
	blocks, err := contentBlocks(raw)
	if err != nil {
		return "", nil, fmt.Errorf("tool_result: %w", err)
	}
	var texts []string
	var images []chatOutReqPart
	for _, b := range blocks {
		if b.Type == "text" {
			texts = append(texts, b.Text)
			continue
		}
		p, ok, err := userPart(b)
		if err != nil {
			return "", nil, fmt.Errorf("tool_result: %w", err)
		}
		if ok {
			images = append(images, p)
		}
	}
	return strings.Join(texts, "\n"), images, nil
}

// addAssistant adds an assistant turn: text blocks as content, tool_use
// blocks as tool_calls; thinking blocks are dropped (their signatures mean
// nothing to another provider).
func (out *chatOutRequest) addAssistant(content json.RawMessage) error {
	blocks, err := contentBlocks(content)
	if err != nil {
		return err
	}
	var text strings.Builder
	var calls []chatOutReqToolCall
	for _, b := range blocks {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			var c chatOutReqToolCall
			c.ID, c.Type, c.Function.Name = b.ID, "function", b.Name
			c.Function.Arguments = compactJSON(b.Input, "{}")
			calls = append(calls, c)
		case "thinking", "redacted_thinking":
		default:
			return fmt.Errorf("content block type %q is not supported in an assistant turn", b.Type)
		}
	}
	m := chatOutReqMsg{Role: "assistant", ToolCalls: calls}
	switch {
	case text.Len() > 0:
		m.Content = text.String()
	case len(calls) == 0:
		return nil // nothing said (a thinking-only turn)
	}
	out.Messages = append(out.Messages, m)
	return nil
}

// compactJSON returns raw compacted, or def when it is empty or invalid.
func compactJSON(raw json.RawMessage, def string) string {
	var b bytes.Buffer
	if len(bytes.TrimSpace(raw)) == 0 || json.Compact(&b, raw) != nil || b.String() == "null" {
		return def
	}
	return b.String()
}

// The Messages API answer ChatToMessages and the stream encoder write.

type msgResponse struct {
	ID           string        `json:"id"`
	Type         string        `json:"type"`
	Role         string        `json:"role"`
	Model        string        `json:"model"`
	Content      []msgOutBlock `json:"content"`
	StopReason   *string       `json:"stop_reason"`
	StopSequence *string       `json:"stop_sequence"`
	Usage        msgUsage      `json:"usage"`
}

type msgOutBlock struct {
	Type  string          `json:"type"`
	Text  *string         `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

type msgUsage struct {
	InputTokens          int64 `json:"input_tokens"`
	OutputTokens         int64 `json:"output_tokens"`
	CacheReadInputTokens int64 `json:"cache_read_input_tokens,omitempty"`
}

type chatUsageIn struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// msgUsage converts usage: Anthropic's input_tokens leave out what was
// read from the cache, OpenAI's prompt_tokens include it.
func (u *chatUsageIn) msgUsage() msgUsage {
	if u == nil {
		return msgUsage{}
	}
	var cached int64
	if u.PromptTokensDetails != nil {
		cached = min(max(u.PromptTokensDetails.CachedTokens, 0), max(u.PromptTokens, 0))
	}
	return msgUsage{InputTokens: max(u.PromptTokens, 0) - cached, OutputTokens: max(u.CompletionTokens, 0), CacheReadInputTokens: cached}
}

// messagesStop maps a finish_reason back to a stop_reason.
func messagesStop(finish string) string {
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

// ChatToMessages translates a Chat Completions answer into an Anthropic
// message: the first choice's text as a text block and its tool calls as
// tool_use blocks, the finish_reason as stop_reason (stop end_turn, length
// max_tokens, tool_calls tool_use, content_filter refusal), usage as
// input/output tokens, and the model that answered.
func ChatToMessages(chatCompletion []byte) ([]byte, error) {
	var c struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Choices []struct {
			Index   int `json:"index"`
			Message struct {
				Content   json.RawMessage `json:"content"`
				Refusal   string          `json:"refusal"`
				ToolCalls []chatToolCall  `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage *chatUsageIn `json:"usage"`
	}
	if err := json.Unmarshal(chatCompletion, &c); err != nil {
		return nil, fmt.Errorf("reading chat completion: %w", err)
	}
	if len(c.Choices) == 0 {
		return nil, errors.New("chat completion has no choices")
	}
	ch := c.Choices[0]
	text, err := (&chatMessage{Content: ch.Message.Content}).text()
	if err != nil {
		return nil, err
	}
	stop := messagesStop(ch.FinishReason)
	if text == "" && ch.Message.Refusal != "" {
		text, stop = ch.Message.Refusal, "refusal"
	}
	content := []msgOutBlock{}
	if text != "" {
		content = append(content, msgOutBlock{Type: "text", Text: &text})
	}
	for _, tc := range ch.Message.ToolCalls {
		id := tc.ID
		if id == "" {
			id = newID("toolu_")
		}
		content = append(content, msgOutBlock{Type: "tool_use", ID: id, Name: tc.Function.Name, Input: toolInput(tc.arguments())})
	}
	id := c.ID
	if id == "" {
		id = newID("msg_")
	}
	return json.Marshal(msgResponse{
		ID: id, Type: "message", Role: "assistant", Model: c.Model,
		Content: content, StopReason: &stop, Usage: c.Usage.msgUsage(),
	})
}

// MessagesStreamEncoder turns a Chat Completions stream, chunk by chunk,
// into an Anthropic Messages stream
// (https://docs.anthropic.com/en/docs/build-with-claude/streaming):
// message_start, then for each text run or tool call a content block
// (content_block_start, deltas, content_block_stop), then message_delta
// with the stop_reason and usage, and message_stop. It is not safe for
// concurrent use; one per stream.
type MessagesStreamEncoder struct {
	started   bool
	deltaSent bool
	stopped   bool
	open      int  // index of the open content block, -1 when none
	openText  bool // the open block is text (else tool_use)
	next      int  // index of the next content block
	tools     map[int]toolBlock
	stop      string // stop_reason once a finish_reason arrived
	usage     *msgUsage
}

type toolBlock struct {
	block int
	id    string
}

// NewMessagesStreamEncoder returns an encoder for one stream.
func NewMessagesStreamEncoder() *MessagesStreamEncoder {
	return &MessagesStreamEncoder{open: -1, tools: map[int]toolBlock{}}
}

type chatChunkIn struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content   *string `json:"content"`
			Refusal   *string `json:"refusal"`
			ToolCalls []struct {
				Index    *int   `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsageIn `json:"usage"`
}

// Chunk takes one chat.completion.chunk JSON and returns the Anthropic SSE
// frames it makes ("event: <type>\ndata: <json>\n\n" each), possibly none.
// A chunk that is not valid JSON, or arrives after the message ended, makes
// none. Only the first choice is relayed: a message has one answer.
func (e *MessagesStreamEncoder) Chunk(chunk []byte) []byte {
	if e.stopped {
		return nil
	}
	var c chatChunkIn
	if json.Unmarshal(chunk, &c) != nil {
		return nil
	}
	var out []byte
	if !e.started {
		out = e.messageStart(out, c.ID, c.Model)
	}
	if e.deltaSent {
		return out
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		if d := ch.Delta.Content; d != nil && *d != "" {
			out = e.text(out, *d)
		}
		if d := ch.Delta.Refusal; d != nil && *d != "" {
			out = e.text(out, *d)
		}
		for _, tc := range ch.Delta.ToolCalls {
			idx := 0
			if tc.Index != nil {
				idx = *tc.Index
			}
			t, known := e.tools[idx]
			if !known || tc.ID != "" && tc.ID != t.id {
				// A new call (some providers reuse index 0 for every call).
				id := tc.ID
				if id == "" {
					id = newID("toolu_")
				}
				out = e.closeBlock(out)
				t = toolBlock{block: e.next, id: id}
				e.tools[idx] = t
				e.open, e.openText = e.next, false
				e.next++
				out = frame(out, "content_block_start", sseBlock{Type: "content_block_start", Index: t.block,
					ContentBlock: toolUseStart{Type: "tool_use", ID: id, Name: tc.Function.Name, Input: struct{}{}}})
			}
			if tc.Function.Arguments != "" {
				// Arguments of an earlier call arriving late go to its own
				// block: SDKs accumulate deltas by index.
				out = frame(out, "content_block_delta", sseBlock{Type: "content_block_delta", Index: t.block,
					Delta: jsonDelta{Type: "input_json_delta", PartialJSON: tc.Function.Arguments}})
			}
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			out = e.closeBlock(out)
			e.stop = messagesStop(*ch.FinishReason)
		}
	}
	if c.Usage != nil {
		u := c.Usage.msgUsage()
		e.usage = &u
	}
	if e.stop != "" && e.usage != nil {
		out = e.messageDelta(out)
	}
	return out
}

// Done ends the stream: it closes an open block, sends message_delta if no
// usage came (stop_reason end_turn if no finish_reason came either), and
// message_stop. Only the first call returns frames.
func (e *MessagesStreamEncoder) Done() []byte {
	if e.stopped {
		return nil
	}
	var out []byte
	if !e.started {
		out = e.messageStart(out, "", "")
	}
	out = e.closeBlock(out)
	if !e.deltaSent {
		if e.stop == "" {
			e.stop = "end_turn"
		}
		out = e.messageDelta(out)
	}
	e.stopped = true
	return frame(out, "message_stop", sseBlock{Type: "message_stop", Index: -1})
}

func (e *MessagesStreamEncoder) messageStart(out []byte, id, model string) []byte {
	e.started = true
	if id == "" {
		id = newID("msg_")
	}
	return frame(out, "message_start", sseBlock{Type: "message_start", Index: -1, Message: &msgResponse{
		ID: id, Type: "message", Role: "assistant", Model: model, Content: []msgOutBlock{},
	}})
}

func (e *MessagesStreamEncoder) text(out []byte, s string) []byte {
	if e.open < 0 || !e.openText {
		out = e.closeBlock(out)
		e.open, e.openText = e.next, true
		e.next++
		out = frame(out, "content_block_start", sseBlock{Type: "content_block_start", Index: e.open,
			ContentBlock: textDelta{Type: "text", Text: ""}})
	}
	return frame(out, "content_block_delta", sseBlock{Type: "content_block_delta", Index: e.open,
		Delta: textDelta{Type: "text_delta", Text: s}})
}

func (e *MessagesStreamEncoder) closeBlock(out []byte) []byte {
	if e.open < 0 {
		return out
	}
	out = frame(out, "content_block_stop", sseBlock{Type: "content_block_stop", Index: e.open})
	e.open = -1
	return out
}

func (e *MessagesStreamEncoder) messageDelta(out []byte) []byte {
	e.deltaSent = true
	u := msgUsage{}
	if e.usage != nil {
		u = *e.usage
	}
	return frame(out, "message_delta", sseBlock{Type: "message_delta", Index: -1,
		Delta: stopDelta{StopReason: e.stop}, Usage: &u})
}

// sseBlock is the data of one Messages stream event; Index -1 leaves the
// index out (message events have none).
type sseBlock struct {
	Type         string
	Index        int
	Message      *msgResponse
	ContentBlock any
	Delta        any
	Usage        *msgUsage
}

// MarshalJSON writes the fields in the order Anthropic sends them, type
// first, leaving out what the event has not.
func (b sseBlock) MarshalJSON() ([]byte, error) {
	out := append([]byte(`{"type":`), appendJSONString(nil, b.Type)...)
	add := func(name string, v any) {
		data, _ := json.Marshal(v)
		out = append(append(append(out, `,"`...), name...), `":`...)
		out = append(out, data...)
	}
	if b.Message != nil {
		add("message", b.Message)
	}
	if b.Index >= 0 {
		add("index", b.Index)
	}
	if b.ContentBlock != nil {
		add("content_block", b.ContentBlock)
	}
	if b.Delta != nil {
		add("delta", b.Delta)
	}
	if b.Usage != nil {
		add("usage", b.Usage)
	}
	return append(out, '}'), nil
}

type textDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type jsonDelta struct {
	Type        string `json:"type"`
	PartialJSON string `json:"partial_json"`
}

type toolUseStart struct {
	Type  string   `json:"type"`
	ID    string   `json:"id"`
	Name  string   `json:"name"`
	Input struct{} `json:"input"`
}

type stopDelta struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

// frame appends one SSE frame "event: <name>\ndata: <json>\n\n".
func frame(out []byte, name string, v sseBlock) []byte {
	data, _ := v.MarshalJSON()
	out = append(out, "event: "...)
	out = append(out, name...)
	out = append(out, "\ndata: "...)
	out = append(out, data...)
	return append(out, "\n\n"...)
}

// MessagesStreamError returns the in-band error frame that ends a Messages
// stream that failed after it began: "event: error\ndata: {...}\n\n".
func MessagesStreamError(typ, msg string) []byte {
	out := append([]byte("event: error\ndata: "), AnthropicError(typ, msg)...)
	return append(out, "\n\n"...)
}

// AnthropicError returns an Anthropic error body:
// {"type":"error","error":{"type":typ,"message":msg}}.
func AnthropicError(typ, msg string) []byte {
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e.Type, e.Error.Type, e.Error.Message = "error", typ, msg
	b, _ := json.Marshal(e) // plain struct: cannot fail
	return b
}

// AnthropicErrorType is the Anthropic error type for an HTTP status
// (https://docs.anthropic.com/en/api/errors): 400 invalid_request_error,
// 401 authentication_error, 402 billing_error, 403 permission_error, 404
// not_found_error, 413 request_too_large, 429 rate_limit_error, 500
// api_error, 503 and 529 overloaded_error, 504 api_error (a timeout); other
// 4xx invalid_request_error, other 5xx api_error.
func AnthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error" // https://docs.anthropic.com/en/api/errors
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}
