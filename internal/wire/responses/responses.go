// Package responses declares OpenAI's Responses API wire format once
// (https://platform.openai.com/docs/api-reference/responses): the request
// and its input items, the response object, the stream's typed events and
// the error body; and translates it to and from Chat Completions, the
// router's canonical format, for providers that do not serve it natively.
//
// Only what a translation reads or writes is declared: a request that
// goes natively to a provider that serves the Responses API keeps
// everything.
package responses

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// Request is a Responses request (the fields a translation reads).
type Request struct {
	Model              string          `json:"model"`
	Input              Input           `json:"input"`
	Instructions       string          `json:"instructions,omitempty"`
	Tools              []Tool          `json:"tools,omitempty"`
	ToolChoice         json.RawMessage `json:"tool_choice,omitempty"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls,omitempty"`
	MaxOutputTokens    *int64          `json:"max_output_tokens,omitempty"`
	Temperature        *float64        `json:"temperature,omitempty"`
	TopP               *float64        `json:"top_p,omitempty"`
	Reasoning          *Reasoning      `json:"reasoning,omitempty"`
	Text               *TextConfig     `json:"text,omitempty"`
	Metadata           json.RawMessage `json:"metadata,omitempty"`
	User               string          `json:"user,omitempty"`
	Stream             bool            `json:"stream,omitempty"`
	PreviousResponseID string          `json:"previous_response_id,omitempty"`
	Conversation       json.RawMessage `json:"conversation,omitempty"`
	Store              *bool           `json:"store,omitempty"`
}

// Input is a request's input: a string (one user message) or a list of
// items.
type Input struct {
	Text  string
	Items []Item
}

// UnmarshalJSON implements json.Unmarshaler.
func (in *Input) UnmarshalJSON(raw []byte) error {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || raw[0] == 'n':
		return nil
	case raw[0] == '"':
		return json.Unmarshal(raw, &in.Text)
	case raw[0] == '[':
		return json.Unmarshal(raw, &in.Items)
	}
	return errors.New("input: must be a string or an array of items")
}

// Item is one input item: a message (type "message", or no type with a
// role), a function_call, a function_call_output, or a reasoning item.
type Item struct {
	Type    string         `json:"type,omitempty"`
	ID      string         `json:"id,omitempty"`
	Role    string         `json:"role,omitempty"`
	Content MessageContent `json:"content,omitempty"`
	// function_call
	CallID    string `json:"call_id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
	// function_call_output: a string, or (newer) an array of content parts.
	Output json.RawMessage `json:"output,omitempty"`
}

// MessageContent is a message item's content: a string or an array of
// parts.
type MessageContent struct {
	Text  string
	Parts []Part
	set   bool
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *MessageContent) UnmarshalJSON(raw []byte) error {
	raw = bytes.TrimSpace(raw)
	c.set = true
	switch {
	case len(raw) == 0 || raw[0] == 'n':
		c.set = false
		return nil
	case raw[0] == '"':
		return json.Unmarshal(raw, &c.Text)
	case raw[0] == '[':
		return json.Unmarshal(raw, &c.Parts)
	}
	return errors.New("content: must be a string or an array of parts")
}

// MarshalJSON implements json.Marshaler.
func (c MessageContent) MarshalJSON() ([]byte, error) {
	if c.Parts != nil {
		return jsonbody.Marshal(c.Parts)
	}
	return jsonbody.Marshal(c.Text)
}

// Part is a content part: input_text, output_text, refusal, input_image
// or input_file.
type Part struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	Refusal  string `json:"refusal,omitempty"`
	ImageURL string `json:"image_url,omitempty"`
	Detail   string `json:"detail,omitempty"`
	FileID   string `json:"file_id,omitempty"`
	FileData string `json:"file_data,omitempty"`
	Filename string `json:"filename,omitempty"`
}

// Tool is a tool of a request: a function tool is {"type":"function",
// "name","description","parameters","strict"}; others (web_search,
// file_search, computer_use...) are OpenAI's own.
type Tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
	// Tools are a namespace tool's functions.
	Tools []Tool `json:"tools,omitempty"`
}

// hostedTools are OpenAI's own tools, which OpenAI runs: a translation
// leaves them out (the model answers without them), as an agent would
// with a model that lacks them.
var hostedTools = map[string]bool{
	"web_search": true, "web_search_preview": true, "web_search_preview_2025_03_11": true,
	"file_search": true, "code_interpreter": true, "image_generation": true,
	"computer_use_preview": true, "mcp": true, "local_shell": true, "custom": true,
}

// Reasoning is reasoning: {"effort":"minimal|low|medium|high","summary"}.
type Reasoning struct {
	Effort  string `json:"effort,omitempty"`
	Summary string `json:"summary,omitempty"`
}

// TextConfig is text: {"format":{...},"verbosity"}.
type TextConfig struct {
	Format *TextFormat `json:"format,omitempty"`
}

// TextFormat is text.format: {"type":"text"}, {"type":"json_object"} or
// {"type":"json_schema","name","schema","strict","description"}.
type TextFormat struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// ErrRequest wraps every error of ToChat: the client's request is not a
// valid Responses request, or asks for what has no Chat Completions form.
var ErrRequest = errors.New("invalid Responses request")

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRequest, fmt.Sprintf(format, args...))
}

// ErrNeedsState is returned by ToChat for a request that continues state
// kept at one provider account (previous_response_id, conversation): only
// a deployment serving the Responses API natively can serve it.
var ErrNeedsState = errors.New("a Responses request with previous_response_id or conversation continues state kept by the provider that answered before; it has no Chat Completions form")

// ToChat translates a Responses request into a Chat Completions body:
// instructions become the first system message; message items messages
// (developer as system; input_text, output_text, input_image and
// input_file parts); function_call items an assistant message's
// tool_calls; function_call_output items tool messages; reasoning items are
// dropped (they are the provider's own). max_output_tokens becomes
// max_completion_tokens, reasoning.effort reasoning_effort, text.format
// response_format; metadata, include, store and prompt_cache_key are
// dropped. Function tools are translated, a namespace's functions too;
// OpenAI's hosted tools (web_search, file_search, code_interpreter,
// image_generation, computer use, mcp, local_shell, custom) are left out,
// since no other provider runs them. A stream asks for usage. Errors wrap
// ErrRequest (invalid JSON, no model, no input, an unknown item or part,
// an unknown tool type), or are ErrNeedsState.
func ToChat(body []byte) ([]byte, error) {
	var r Request
	if err := json.Unmarshal(body, &r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, badRequest("%s: expected %s, got a JSON %s", te.Field, kindOf(te.Type.Kind().String()), te.Value)
		}
		return nil, badRequest("%v", err)
	}
	if r.Model == "" {
		return nil, badRequest("model: field required")
	}
	if r.PreviousResponseID != "" || len(r.Conversation) > 0 && string(r.Conversation) != "null" {
		return nil, ErrNeedsState
	}
	c := chat.Request{
		Model:               r.Model,
		MaxCompletionTokens: r.MaxOutputTokens,
		Temperature:         r.Temperature,
		TopP:                r.TopP,
		ParallelToolCalls:   r.ParallelToolCalls,
		User:                r.User,
		Stream:              r.Stream,
	}
	if r.Stream {
		c.StreamOptions = &chat.StreamOptions{IncludeUsage: true}
	}
	if r.Reasoning != nil {
		c.ReasoningEffort = r.Reasoning.Effort
	}
	if r.Text != nil && r.Text.Format != nil {
		rf, err := responseFormat(r.Text.Format)
		if err != nil {
			return nil, err
		}
		c.ResponseFormat = rf
	}
	if r.Instructions != "" {
		c.Messages = append(c.Messages, chat.Message{Role: "system", Content: chat.Text(r.Instructions)})
	}
	if r.Input.Items == nil {
		if r.Input.Text == "" {
			return nil, badRequest("input: a non-empty string or array of items is required")
		}
		c.Messages = append(c.Messages, chat.Message{Role: "user", Content: chat.Text(r.Input.Text)})
	}
	for i := range r.Input.Items {
		var err error
		if c.Messages, err = addItem(c.Messages, &r.Input.Items[i]); err != nil {
			return nil, badRequest("input[%d]: %v", i, err)
		}
	}
	if len(c.Messages) == 0 {
		return nil, badRequest("input: nothing to answer")
	}
	for i, t := range r.Tools {
		var err error
		if c.Tools, err = addTool(c.Tools, t, fmt.Sprintf("tools[%d]", i)); err != nil {
			return nil, err
		}
	}
	if len(r.ToolChoice) > 0 {
		tc, err := toolChoice(r.ToolChoice)
		if err != nil {
			return nil, err
		}
		c.ToolChoice = tc
	}
	return jsonbody.Marshal(c)
}

// addTool adds a function tool, or a namespace's functions (under their
// own names); OpenAI's hosted tools are left out; any other type is an
// error.
func addTool(tools []chat.Tool, t Tool, at string) ([]chat.Tool, error) {
	switch {
	case t.Type == "function":
		if t.Name == "" {
			return nil, badRequest("%s.name: field required", at)
		}
		return append(tools, chat.Tool{Type: "function",
			Function: chat.Function{Name: t.Name, Description: t.Description, Parameters: t.Parameters}}), nil
	case t.Type == "namespace":
		for j, f := range t.Tools {
			var err error
			if tools, err = addTool(tools, f, fmt.Sprintf("%s.tools[%d]", at, j)); err != nil {
				return nil, err
			}
		}
		return tools, nil
	case hostedTools[t.Type]:
		return tools, nil
	}
	return nil, badRequest("%s: tool type %q cannot be served by this model group's providers (function tools can)", at, t.Type)
}

// responseFormat is text.format as response_format.
func responseFormat(f *TextFormat) (*chat.ResponseFormat, error) {
	switch f.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		return &chat.ResponseFormat{Type: "json_object"}, nil
	case "json_schema":
		if len(f.Schema) == 0 {
			return nil, badRequest("text.format.schema: field required for json_schema")
		}
		rf := &chat.ResponseFormat{Type: "json_schema", JSONSchema: &chat.JSONSchema{
			Name: f.Name, Description: f.Description, Schema: f.Schema, Strict: f.Strict}}
		if rf.JSONSchema.Name == "" {
			rf.JSONSchema.Name = "response"
		}
		return rf, nil
	}
	return nil, badRequest("text.format.type: unknown type %q", f.Type)
}

// toolChoice is tool_choice in the Chat form: "auto", "none", "required",
// or {"type":"function","name"} as a function choice.
func toolChoice(raw json.RawMessage) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if raw[0] == '"' {
		var s string
		_ = json.Unmarshal(raw, &s)
		switch s {
		case "auto", "none", "required":
			return raw, nil
		}
		return nil, badRequest("tool_choice: unknown value %q", s)
	}
	var o struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &o); err != nil || o.Type != "function" || o.Name == "" {
		return nil, badRequest(`tool_choice: must be "auto", "none", "required" or {"type":"function","name":...}`)
	}
	return chat.FunctionChoice(o.Name), nil
}

// addItem adds one input item to msgs.
func addItem(msgs []chat.Message, it *Item) ([]chat.Message, error) {
	typ := it.Type
	if typ == "" && it.Role != "" {
		typ = "message"
	}
	switch typ {
	case "message":
		return addMessage(msgs, it)
	case "function_call":
		if it.CallID == "" || it.Name == "" {
			return nil, errors.New("a function_call needs call_id and name")
		}
		call := chat.ToolCall{ID: it.CallID, Type: "function",
			Function: chat.FunctionCall{Name: it.Name, Arguments: chat.Arguments(cmpOr(it.Arguments, "{}"))}}
		// Calls of one turn go in one assistant message, after its text.
		if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
			msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, call)
			return msgs, nil
		}
		return append(msgs, chat.Message{Role: "assistant", ToolCalls: []chat.ToolCall{call}}), nil
	case "function_call_output":
		if it.CallID == "" {
			return nil, errors.New("a function_call_output needs call_id")
		}
		text, err := outputText(it.Output)
		if err != nil {
			return nil, err
		}
		return append(msgs, chat.Message{Role: "tool", ToolCallID: it.CallID, Content: chat.Text(text)}), nil
	case "reasoning":
		return msgs, nil // the provider's own, encrypted or summarized: no Chat form
	case "item_reference":
		return nil, errors.New("item_reference points at state kept by the provider that answered before; it has no Chat Completions form")
	}
	return nil, fmt.Errorf("item type %q is not supported", typ)
}

// addMessage adds a message item.
func addMessage(msgs []chat.Message, it *Item) ([]chat.Message, error) {
	role := it.Role
	switch role {
	case "user", "assistant", "system":
	case "developer":
		role = "system"
	default:
		return nil, fmt.Errorf("unsupported role %q", it.Role)
	}
	if it.Content.Parts == nil {
		if !it.Content.set {
			return nil, errors.New("content: field required")
		}
		return append(msgs, chat.Message{Role: role, Content: chat.Text(it.Content.Text)}), nil
	}
	var parts []chat.Part
	var texts []string
	for j, p := range it.Content.Parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			parts = append(parts, chat.Part{Type: "text", Text: p.Text})
			texts = append(texts, p.Text)
		case "refusal":
			parts = append(parts, chat.Part{Type: "text", Text: p.Refusal})
			texts = append(texts, p.Refusal)
		case "input_image":
			if role != "user" {
				return nil, fmt.Errorf("content[%d]: an image belongs in a user message", j)
			}
			if p.ImageURL == "" {
				return nil, fmt.Errorf("content[%d]: input_image needs image_url (file ids are OpenAI's)", j)
			}
			parts = append(parts, chat.Part{Type: "image_url", ImageURL: &chat.ImageURL{URL: p.ImageURL, Detail: p.Detail}})
		case "input_file":
			if role != "user" {
				return nil, fmt.Errorf("content[%d]: a file belongs in a user message", j)
			}
			if p.FileData == "" {
				return nil, fmt.Errorf("content[%d]: input_file needs file_data (file ids are OpenAI's)", j)
			}
			data := p.FileData
			if !strings.HasPrefix(data, "data:") {
				data = "data:application/pdf;base64," + data
			}
			parts = append(parts, chat.Part{Type: "file", File: &chat.File{FileData: data, Filename: p.Filename}})
		default:
			return nil, fmt.Errorf("content[%d]: unsupported part type %q", j, p.Type)
		}
	}
	if len(texts) == len(parts) {
		// Text only: one string (what every provider takes, assistant and
		// system turns included).
		return append(msgs, chat.Message{Role: role, Content: chat.Text(strings.Join(texts, ""))}), nil
	}
	return append(msgs, chat.Message{Role: role, Content: chat.Content{Parts: parts}}), nil
}

// outputText is a function_call_output's output as text: the string, or
// the text parts of an array joined.
func outputText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || raw[0] == 'n':
		return "", nil
	case raw[0] == '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case raw[0] == '[':
		var parts []Part
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String(), nil
	}
	return "", errors.New("output: must be a string or an array of parts")
}

// kindOf names a Go kind as JSON does.
func kindOf(k string) string {
	switch k {
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	}
	return "a number"
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
