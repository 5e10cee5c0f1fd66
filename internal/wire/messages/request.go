package messages

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
)

// DefaultMaxTokens is sent when a Chat Completions request states no
// max_tokens: the Messages API requires one, Chat Completions does not.
const DefaultMaxTokens = 4096

var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// FromChat translates a Chat Completions body to a Messages request for
// model. It fails when body is not a JSON object or holds what the
// Messages API cannot express (n > 1, an audio part, an image that is
// neither a base64 data URL nor an http(s) URL, a non-function tool, no
// user or assistant message). A
// temperature above 1 (OpenAI allows up to 2) is sent as 1, Anthropic's
// maximum, and a request without max_tokens asks for DefaultMaxTokens.
func FromChat(body []byte, model string, stream bool) ([]byte, error) {
	r, err := chat.ParseRequest(body, "anthropic")
	if err != nil {
		return nil, err
	}
	maxTokens := r.MaxOutputTokens(DefaultMaxTokens)
	out := Request{
		Model:       model,
		MaxTokens:   &maxTokens,
		Temperature: r.Temperature,
		TopP:        r.TopP,
		Stream:      stream,
	}
	if t := out.Temperature; t != nil && *t > 1 {
		// OpenAI's range is 0..2, Anthropic's 0..1: a 400 for 1.5 would
		// make this deployment useless for the request.
		one := 1.0
		out.Temperature = &one
	}
	if r.User != "" {
		out.Metadata = &Metadata{UserID: r.User}
	}
	if out.StopSequences, err = chat.StopSequences(r.Stop); err != nil {
		return nil, err
	}
	out.OutputConfig = outputConfig(r.ResponseFormat)

	if err := turnsFromChat(r, &out); err != nil {
		return nil, err
	}
	if err := toolsFromChat(r, &out); err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// turnsFromChat translates r's messages into out's system prompt (its
// blocks when one of them sets cache_control, else its text) and turns
// (consecutive messages of one role merged, appendTurn; an assistant
// prefill trimmed, trimPrefill). It fails on a message the Messages API
// cannot express, naming it by its index (messages[i]), and when no user
// or assistant message is left.
func turnsFromChat(r *chat.Request, out *Request) error {
	var system []Block
	cached := false
	for i := range r.Messages {
		m := &r.Messages[i]
		switch m.Role {
		case "system", "developer":
			for _, p := range m.Content.AsParts() {
				if p.Text == "" {
					continue
				}
				b := TextBlock(p.Text)
				b.CacheControl = p.CacheControl
				system = append(system, b)
				cached = cached || len(p.CacheControl) > 0
			}
		case "user":
			blocks, err := userBlocks(m)
			if err != nil {
				return fmt.Errorf("messages[%d]: %w", i, err)
			}
			out.Messages = appendTurn(out.Messages, "user", blocks)
		case "assistant":
			out.Messages = appendTurn(out.Messages, "assistant", assistantBlocks(m))
		case "tool":
			b := Block{Type: "tool_result", ToolUseID: ToolID(m.ToolCallID)}
			if text := m.Content.String(); text != "" {
				b.Content, _ = json.Marshal(text)
			}
			out.Messages = appendTurn(out.Messages, "user", []Block{b})
		default:
			return fmt.Errorf("messages[%d]: unsupported role %q", i, m.Role)
		}
	}
	switch {
	case len(system) == 0:
	case cached:
		out.System = system
	default:
		out.System = (&SystemPrompt{Blocks: system}).String()
	}
	trimPrefill(out.Messages)
	if n := len(out.Messages); n > 0 && out.Messages[n-1].Role == "" {
		out.Messages = out.Messages[:n-1]
	}
	if len(out.Messages) == 0 {
		return errors.New("anthropic needs at least one user or assistant message")
	}
	return nil
}

// toolsFromChat translates r's tools (function tools only; a missing
// schema sent as an empty object, input_schema being required), its
// tool_choice and parallel_tool_calls: false (disable_parallel_tool_use)
// into out. A tool_choice that is no valid Chat one fails, tools or not.
func toolsFromChat(r *chat.Request, out *Request) error {
	for _, t := range r.Tools {
		if t.Type != "" && t.Type != "function" {
			return fmt.Errorf("tool type %q is not supported by anthropic", t.Type)
		}
		schema := t.Function.Parameters
		if s := bytes.TrimSpace(schema); len(s) == 0 || bytes.Equal(s, []byte("null")) {
			schema = emptySchema // input_schema is required
		}
		out.Tools = append(out.Tools, Tool{Name: t.Function.Name, Description: t.Function.Description, InputSchema: schema})
	}
	tc, err := chat.ParseToolChoice(r.ToolChoice)
	if err != nil {
		return err
	}
	if len(out.Tools) == 0 {
		return nil
	}
	switch tc.Mode {
	case "auto":
		out.ToolChoice = &ToolChoice{Type: "auto"}
	case "none":
		out.ToolChoice = &ToolChoice{Type: "none"}
	case "required":
		out.ToolChoice = &ToolChoice{Type: "any"}
	case "function":
		out.ToolChoice = &ToolChoice{Type: "tool", Name: tc.Name}
	}
	if r.ParallelToolCalls != nil && !*r.ParallelToolCalls {
		if out.ToolChoice == nil {
			out.ToolChoice = &ToolChoice{Type: "auto"}
		}
		if out.ToolChoice.Type != "none" {
			out.ToolChoice.DisableParallelToolUse = true
		}
	}
	return nil
}

// outputConfig translates response_format to Anthropic's structured
// outputs (https://docs.claude.com/en/docs/build-with-claude/structured-outputs;
// output_config.format in anthropic-sdk-go v2.15.0's MessageNewParams):
// json_schema's schema becomes output_config.format {"type":"json_schema",
// "schema"}; its name, description and strict have no Messages field (the
// format is always enforced). json_object and text have no equivalent: nil.
func outputConfig(f *chat.ResponseFormat) *OutputConfig {
	if f == nil || f.Type != "json_schema" || f.JSONSchema == nil {
		return nil
	}
	schema := bytes.TrimSpace(f.JSONSchema.Schema)
	if len(schema) == 0 || schema[0] != '{' {
		return nil
	}
	return &OutputConfig{Format: &OutputFormat{Type: "json_schema", Schema: schema}}
}

// appendTurn adds blocks as a role's turn, merged into the previous message
// when it has the same role: the Messages API wants user and assistant
// turns to alternate, and a tool result is a user turn.
func appendTurn(msgs []Message, role string, blocks []Block) []Message {
	if len(blocks) == 0 {
		return msgs
	}
	if n := len(msgs); n > 0 && msgs[n-1].Role == role {
		msgs[n-1].Content = append(msgs[n-1].Content, blocks...)
		return msgs
	}
	return append(msgs, Message{Role: role, Content: blocks})
}

// trimPrefill strips trailing white space from a final assistant message
// (a prefill), which the Messages API rejects.
func trimPrefill(msgs []Message) {
	n := len(msgs)
	if n == 0 || msgs[n-1].Role != "assistant" {
		return
	}
	m := &msgs[n-1]
	last := &m.Content[len(m.Content)-1]
	if last.Type != "text" {
		return
	}
	text := strings.TrimRight(last.TextOf(), " \t\r\n")
	last.Text = &text
	if text == "" {
		m.Content = m.Content[:len(m.Content)-1]
		if len(m.Content) == 0 {
			msgs[n-1] = Message{} // caller trims
		}
	}
}

func userBlocks(m *chat.Message) ([]Block, error) {
	parts := m.Content.AsParts()
	blocks := make([]Block, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "text", "":
			if p.Text != "" { // empty text blocks are rejected
				b := TextBlock(p.Text)
				b.CacheControl = p.CacheControl
				blocks = append(blocks, b)
			}
		case "image_url", "file":
			m, err := p.Media()
			if err != nil {
				return nil, err
			}
			switch {
			case m.File:
				blocks = append(blocks, Block{Type: "document", Source: &Source{Type: "base64", MediaType: m.MediaType, Data: m.Data}})
			case m.URL != "":
				blocks = append(blocks, Block{Type: "image", Source: &Source{Type: "url", URL: m.URL}})
			default:
				blocks = append(blocks, Block{Type: "image", Source: &Source{Type: "base64", MediaType: m.MediaType, Data: m.Data}})
			}
		default:
			return nil, fmt.Errorf("content part type %q is not supported by anthropic", p.Type)
		}
	}
	return blocks, nil
}

func assistantBlocks(m *chat.Message) []Block {
	parts := m.Content.AsParts()
	blocks := make([]Block, 0, len(parts)+len(m.ToolCalls))
	for _, p := range parts {
		if (p.Type == "text" || p.Type == "") && p.Text != "" {
			b := TextBlock(p.Text)
			b.CacheControl = p.CacheControl
			blocks = append(blocks, b)
		}
	}
	for _, c := range m.ToolCalls {
		blocks = append(blocks, Block{
			Type:  "tool_use",
			ID:    ToolID(c.ID),
			Name:  c.Function.Name,
			Input: chat.ObjectOr(string(c.Function.Arguments), json.RawMessage("{}")),
		})
	}
	return blocks
}

// ToolID maps a tool call id to one the Messages API accepts
// (^[a-zA-Z0-9_-]+$, the pattern of tool_use.id and tool_result.tool_use_id):
// an id that matches is kept; another (an OpenAI-compatible server's
// "functions.get_weather:0") has each other byte replaced by '_' and
// "_" plus 8 hex digits of the original's FNV-1a hash appended, so that
// ids differing only in replaced bytes stay apart. The mapping is stable:
// the same id maps the same way in an answer, a stream and the next turn's
// tool_use and tool_result, which therefore still pair, whichever
// deployment serves that turn.
func ToolID(id string) string {
	i := strings.IndexFunc(id, func(r rune) bool { return r >= utf8.RuneSelf || !isToolIDByte(byte(r)) })
	if i < 0 {
		return id
	}
	b := []byte(id)
	for j := i; j < len(b); j++ {
		if !isToolIDByte(b[j]) {
			b[j] = '_'
		}
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return fmt.Sprintf("%s_%08x", b, h.Sum32())
}

func isToolIDByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// ErrRequest wraps every error of ToChat: the client's request is not a
// valid Messages request (answer 400 invalid_request_error).
var ErrRequest = errors.New("invalid Messages request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRequest, fmt.Sprintf(format, args...))
}

// ToChat translates a Messages request into a Chat Completions body. A
// stream asks for usage (stream_options.include_usage), which the Messages
// stream reports at its end. top_k and thinking have no Chat Completions
// equivalent and are dropped. Errors wrap ErrRequest: invalid JSON, no
// model, no messages, no or a non-positive max_tokens (checked here too, so
// that ToChat stands on its own), an unknown role or block, or a server
// tool (web search, bash...) the router cannot run.
func ToChat(body []byte) (out []byte, err error) {
	var sys SystemPrompt
	r := Request{System: &sys}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, badRequest("%v", err)
	}
	switch {
	case r.Model == "":
		return nil, badRequest("model: field required")
	case len(r.Messages) == 0:
		return nil, badRequest("messages: at least one message is required")
	case r.MaxTokens == nil:
		return nil, badRequest("max_tokens: field required")
	case *r.MaxTokens < 1:
		return nil, badRequest("max_tokens: must be at least 1")
	}
	c := chat.Request{
		Model:       r.Model,
		MaxTokens:   r.MaxTokens,
		Temperature: r.Temperature,
		TopP:        r.TopP,
		Stream:      r.Stream,
	}
	if len(r.StopSequences) > 0 {
		c.Stop, _ = json.Marshal(r.StopSequences)
	}
	if r.Stream {
		c.StreamOptions = &chat.StreamOptions{IncludeUsage: true}
	}
	if r.Metadata != nil {
		c.User = r.Metadata.UserID
	}
	if text := sys.String(); text != "" {
		c.Messages = append(c.Messages, chat.Message{Role: "system", Content: chat.Text(text)})
	}
	for i, m := range r.Messages {
		switch m.Role {
		case "user":
			c.Messages, err = addUser(c.Messages, m.Content)
		case "assistant":
			c.Messages, err = addAssistant(c.Messages, m.Content)
		case "system":
			c.Messages, err = addSystem(c.Messages, m.Content)
		default:
			err = fmt.Errorf("unsupported role %q", m.Role)
		}
		if err != nil {
			return nil, badRequest("messages[%d]: %v", i, err)
		}
	}
	for i, t := range r.Tools {
		if t.Type != "" && t.Type != "custom" {
			return nil, badRequest("tools[%d]: tool type %q is not supported", i, t.Type)
		}
		c.Tools = append(c.Tools, chat.Tool{Type: "function",
			Function: chat.Function{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
	}
	if tc := r.ToolChoice; tc != nil && len(c.Tools) > 0 {
		switch tc.Type {
		case "auto", "":
			c.ToolChoice = json.RawMessage(`"auto"`)
		case "any":
			c.ToolChoice = json.RawMessage(`"required"`)
		case "none":
			c.ToolChoice = json.RawMessage(`"none"`)
		case "tool":
			c.ToolChoice = chat.FunctionChoice(tc.Name)
		default:
			return nil, badRequest("tool_choice: unsupported type %q", tc.Type)
		}
		if tc.DisableParallelToolUse {
			f := false
			c.ParallelToolCalls = &f
		}
	}
	out, err = json.Marshal(c)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return out, nil
}

// addSystem adds a system message from the middle of a conversation (Claude
// Code sends them, as of version 2.1): its text blocks, joined as the
// top-level system prompt's are. Other blocks have no Chat form.
func addSystem(msgs []chat.Message, content Content) ([]chat.Message, error) {
	texts := make([]string, 0, len(content))
	for _, b := range content {
		if b.Type != "text" {
			return nil, fmt.Errorf("a system message holds text only, not %q", b.Type)
		}
		if t := b.TextOf(); t != "" {
			texts = append(texts, t)
		}
	}
	if len(texts) == 0 {
		return msgs, nil
	}
	return append(msgs, chat.Message{Role: "system", Content: chat.Text(strings.Join(texts, "\n\n"))}), nil
}

// addUser adds a user turn: its tool results become tool messages first
// (Chat Completions answers a call with a message of role tool), then the
// rest as one user message.
func addUser(msgs []chat.Message, content Content) ([]chat.Message, error) {
	var parts []chat.Part
	for _, b := range content {
		if b.Type == "tool_result" {
			text, images, err := toolResultContent(b.Content)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, chat.Message{Role: "tool", ToolCallID: b.ToolUseID, Content: chat.Text(text)})
			// A tool message holds text only: images go with the user turn.
			parts = append(parts, images...)
			continue
		}
		p, ok, err := userPart(b)
		if err != nil {
			return nil, err
		}
		if ok {
			parts = append(parts, p)
		}
	}
	switch {
	case len(parts) == 0:
	case len(parts) == 1 && parts[0].Type == "text":
		msgs = append(msgs, chat.Message{Role: "user", Content: chat.Text(parts[0].Text)})
	default:
		msgs = append(msgs, chat.Message{Role: "user", Content: chat.Content{Parts: parts}})
	}
	return msgs, nil
}

// userPart translates one user block; ok is false for a block with nothing
// to send (empty text).
func userPart(b Block) (chat.Part, bool, error) {
	switch b.Type {
	case "text":
		return chat.Part{Type: "text", Text: b.TextOf()}, b.TextOf() != "", nil
	case "image":
		if b.Source == nil {
			return chat.Part{}, false, errors.New("image block without source")
		}
		switch b.Source.Type {
		case "base64":
			return chat.Part{Type: "image_url", ImageURL: &chat.ImageURL{URL: "data:" + b.Source.MediaType + ";base64," + b.Source.Data}}, true, nil
		case "url":
			return chat.Part{Type: "image_url", ImageURL: &chat.ImageURL{URL: b.Source.URL}}, true, nil
		}
		return chat.Part{}, false, fmt.Errorf("image source type %q is not supported", b.Source.Type)
	case "document":
		if b.Source == nil {
			return chat.Part{}, false, errors.New("document block without source")
		}
		switch b.Source.Type {
		case "text":
			return chat.Part{Type: "text", Text: b.Source.Data}, b.Source.Data != "", nil
		case "base64":
			return chat.Part{Type: "file", File: &chat.File{
				FileData: "data:" + b.Source.MediaType + ";base64," + b.Source.Data, Filename: b.Title}}, true, nil
		}
		return chat.Part{}, false, fmt.Errorf("document source type %q is not supported", b.Source.Type)
	}
	return chat.Part{}, false, fmt.Errorf("content block type %q is not supported in a user turn", b.Type)
}

// toolResultContent reads a tool_result's content: its text, and its
// images as user parts.
func toolResultContent(raw json.RawMessage) (string, []chat.Part, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil, nil
	}
	var blocks Content
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", nil, fmt.Errorf("tool_result: %w", err)
	}
	var texts []string
	var images []chat.Part
	for _, b := range blocks {
		if b.Type == "text" {
			texts = append(texts, b.TextOf())
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
func addAssistant(msgs []chat.Message, content Content) ([]chat.Message, error) {
	var text strings.Builder
	var calls []chat.ToolCall
	for _, b := range content {
		switch b.Type {
		case "text":
			text.WriteString(b.TextOf())
		case "tool_use":
			calls = append(calls, chat.ToolCall{ID: b.ID, Type: "function",
				Function: chat.FunctionCall{Name: b.Name, Arguments: chat.Arguments(compactJSON(b.Input, "{}"))}})
		case "thinking", "redacted_thinking":
		default:
			return nil, fmt.Errorf("content block type %q is not supported in an assistant turn", b.Type)
		}
	}
	m := chat.Message{Role: "assistant", ToolCalls: calls}
	switch {
	case text.Len() > 0:
		m.Content = chat.Text(text.String())
	case len(calls) == 0:
		return msgs, nil // nothing said (a thinking-only turn)
	}
	return append(msgs, m), nil
}

// compactJSON returns raw compacted, or def when it is empty or invalid.
func compactJSON(raw json.RawMessage, def string) string {
	var b bytes.Buffer
	if len(bytes.TrimSpace(raw)) == 0 || json.Compact(&b, raw) != nil || b.String() == "null" {
		return def
	}
	return b.String()
}
