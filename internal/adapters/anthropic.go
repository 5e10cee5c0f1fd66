package adapters

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

func init() { Register(Anthropic{}) }

// anthropicVersion is the Messages API version requested, unless the
// provider's `header` lines set anthropic-version themselves.
const anthropicVersion = "2023-06-01"

// anthropicDefaultMaxTokens is sent when the client states no max_tokens:
// Anthropic requires one, OpenAI does not.
const anthropicDefaultMaxTokens = 4096

// Anthropic speaks Anthropic's Messages API
// (https://docs.anthropic.com/en/api/messages): requests go to BaseURL +
// "/messages" (BaseURL such as "https://api.anthropic.com/v1") with
// "x-api-key: <key>" and "anthropic-version: 2023-06-01". Chat Completions
// bodies are translated to Messages requests, and answers and streams back.
//
// Capacity (https://docs.anthropic.com/en/api/rate-limits):
// anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset},
// resets as RFC 3339 instants read against the Date header; the token
// window reported is the tightest of the three token windows (by the share
// left; the combined tokens window on a tie, which the docs say is already
// the most restrictive limit in effect), and retry-after in seconds.
//
// Error classes (https://docs.anthropic.com/en/api/errors): 429
// rate_limit_error is rate_limited, unless it is the monthly spend limit
// (error_code enforced_spend_limit_reached); 529 overloaded_error
// overloaded; 401 authentication_error and 403 permission_error auth;
// 402 billing_error, "credit balance is too low" and spend limits
// quota_exhausted; 400 "prompt is too long" context_length; other 4xx
// client_error; 404 not_found_error (this deployment's model or base_url
// is wrong), 500 api_error, 504 timeout_error and other 5xx server.
// Errors inside a stream (which began with a 200) are classified by their
// type alone.
type Anthropic struct{}

// Name implements Adapter.
func (Anthropic) Name() string { return "anthropic" }

// ChatRequest implements Adapter. It fails when body is not a JSON object
// or holds what the Messages API cannot express (n > 1, an audio part, an
// image that is neither a base64 data URL nor an http(s) URL, a
// non-function tool). A temperature above 1 (OpenAI allows up to 2) is
// sent as 1, Anthropic's maximum.
func (Anthropic) ChatRequest(ctx context.Context, ep *Endpoint, model string, body []byte, stream bool) (*http.Request, error) {
	out, err := chatToAnthropic(body, model, stream)
	if err != nil {
		return nil, err
	}
	return anthropicPost(ctx, ep, out, stream)
}

// The Messages API request.

type antRequest struct {
	Model string `json:"model"`
	// System is a string, or text blocks when a part carries cache_control.
	System        any            `json:"system,omitempty"`
	Messages      []antMessage   `json:"messages"`
	MaxTokens     int64          `json:"max_tokens"`
	Tools         []antTool      `json:"tools,omitempty"`
	ToolChoice    *antToolChoice `json:"tool_choice,omitempty"`
	StopSequences []string       `json:"stop_sequences,omitempty"`
	Temperature   *float64       `json:"temperature,omitempty"`
	TopP          *float64       `json:"top_p,omitempty"`
	Stream        bool           `json:"stream,omitempty"`
	Metadata      *antMetadata   `json:"metadata,omitempty"`
}

type antMessage struct {
	Role    string     `json:"role"`
	Content []antBlock `json:"content"`
}

type antBlock struct {
	Type   string     `json:"type"`
	Text   string     `json:"text,omitempty"`
	Source *antSource `json:"source,omitempty"`
	// tool_use
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// tool_result
	ToolUseID string `json:"tool_use_id,omitempty"`
	Content   string `json:"content,omitempty"`

	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

type antSource struct {
	Type      string `json:"type"` // base64 or url
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type antTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type antToolChoice struct {
	Type                   string `json:"type"` // auto, any, tool, none
	Name                   string `json:"name,omitempty"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use,omitempty"`
}

type antMetadata struct {
	UserID string `json:"user_id"`
}

var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// chatToAnthropic translates a Chat Completions body to a Messages request
// for model.
func chatToAnthropic(body []byte, model string, stream bool) ([]byte, error) {
	r, err := parseChatRequest(body, "anthropic")
	if err != nil {
		return nil, err
	}
	out := antRequest{
		Model:       model,
		MaxTokens:   r.maxOutputTokens(anthropicDefaultMaxTokens),
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
		out.Metadata = &antMetadata{UserID: r.User}
	}
	if out.StopSequences, err = stopSequences(r.Stop); err != nil {
		return nil, err
	}

	var system []antBlock
	cached := false
	for i := range r.Messages {
		m := &r.Messages[i]
		switch m.Role {
		case "system", "developer":
			parts, err := m.parts()
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			for _, p := range parts {
				if p.Text == "" {
					continue
				}
				system = append(system, antBlock{Type: "text", Text: p.Text, CacheControl: p.CacheControl})
				cached = cached || len(p.CacheControl) > 0
			}
		case "user":
			blocks, err := anthropicUserBlocks(m)
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			out.Messages = appendAntMessage(out.Messages, "user", blocks)
		case "assistant":
			blocks, err := anthropicAssistantBlocks(m)
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			out.Messages = appendAntMessage(out.Messages, "assistant", blocks)
		case "tool":
			text, err := m.text()
			if err != nil {
				return nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			out.Messages = appendAntMessage(out.Messages, "user", []antBlock{{
				Type: "tool_result", ToolUseID: anthropicToolID(m.ToolCallID), Content: text,
			}})
		default:
			return nil, fmt.Errorf("messages[%d]: unsupported role %q", i, m.Role)
		}
	}
	switch {
	case len(system) == 0:
	case cached:
		out.System = system
	default:
		texts := make([]string, len(system))
		for i, b := range system {
			texts[i] = b.Text
		}
		out.System = strings.Join(texts, "\n\n")
	}
	trimPrefill(out.Messages)
	if n := len(out.Messages); n > 0 && out.Messages[n-1].Role == "" {
		out.Messages = out.Messages[:n-1]
	}

	for _, t := range r.Tools {
		if t.Type != "" && t.Type != "function" {
			return nil, fmt.Errorf("tool type %q is not supported by anthropic", t.Type)
		}
		schema := t.Function.Parameters
		if len(bytes.TrimSpace(schema)) == 0 || bytes.Equal(bytes.TrimSpace(schema), []byte("null")) {
			schema = emptySchema // input_schema is required
		}
		out.Tools = append(out.Tools, antTool{Name: t.Function.Name, Description: t.Function.Description, InputSchema: schema})
	}
	tc, err := parseToolChoice(r.ToolChoice)
	if err != nil {
		return nil, err
	}
	if len(out.Tools) > 0 {
		switch tc.mode {
		case "auto":
			out.ToolChoice = &antToolChoice{Type: "auto"}
		case "none":
			out.ToolChoice = &antToolChoice{Type: "none"}
		case "required":
			out.ToolChoice = &antToolChoice{Type: "any"}
		case "function":
			out.ToolChoice = &antToolChoice{Type: "tool", Name: tc.name}
		}
		if r.ParallelToolCalls != nil && !*r.ParallelToolCalls {
			if out.ToolChoice == nil {
				out.ToolChoice = &antToolChoice{Type: "auto"}
			}
			if out.ToolChoice.Type != "none" {
				out.ToolChoice.DisableParallelToolUse = true
			}
		}
	}
	return json.Marshal(out)
}

// appendAntMessage adds blocks as a role's turn, merged into the previous
// message when it has the same role: the Messages API wants user and
// assistant turns to alternate, and a tool result is a user turn.
func appendAntMessage(msgs []antMessage, role string, blocks []antBlock) []antMessage {
	if len(blocks) == 0 {
		return msgs
	}
	if n := len(msgs); n > 0 && msgs[n-1].Role == role {
		msgs[n-1].Content = append(msgs[n-1].Content, blocks...)
		return msgs
	}
	return append(msgs, antMessage{Role: role, Content: blocks})
}

// trimPrefill strips trailing white space from a final assistant message
// (a prefill), which the Messages API rejects.
func trimPrefill(msgs []antMessage) {
	n := len(msgs)
	if n == 0 || msgs[n-1].Role != "assistant" {
		return
	}
	m := &msgs[n-1]
	last := &m.Content[len(m.Content)-1]
	if last.Type != "text" {
		return
	}
	if last.Text = strings.TrimRight(last.Text, " \t\r\n"); last.Text == "" {
		m.Content = m.Content[:len(m.Content)-1]
		if len(m.Content) == 0 {
			msgs[n-1] = antMessage{} // caller trims
		}
	}
}

func anthropicUserBlocks(m *chatMessage) ([]antBlock, error) {
	parts, err := m.parts()
	if err != nil {
		return nil, err
	}
	blocks := make([]antBlock, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "text", "":
			if p.Text != "" { // empty text blocks are rejected
				blocks = append(blocks, antBlock{Type: "text", Text: p.Text, CacheControl: p.CacheControl})
			}
		case "image_url":
			u := p.imageURL()
			if mt, data, ok := parseDataURL(u); ok {
				blocks = append(blocks, antBlock{Type: "image", Source: &antSource{Type: "base64", MediaType: mt, Data: data}})
			} else if isHTTPURL(u) {
				blocks = append(blocks, antBlock{Type: "image", Source: &antSource{Type: "url", URL: u}})
			} else {
				return nil, errors.New("image_url must be a base64 data URL or an http(s) URL")
			}
		case "file":
			if p.File == nil {
				return nil, errors.New("file part without file")
			}
			mt, data, ok := parseDataURL(p.File.FileData)
			if !ok {
				return nil, errors.New("file parts must carry file_data as a base64 data URL (file ids are OpenAI's)")
			}
			blocks = append(blocks, antBlock{Type: "document", Source: &antSource{Type: "base64", MediaType: mt, Data: data}})
		default:
			return nil, fmt.Errorf("content part type %q is not supported by anthropic", p.Type)
		}
	}
	return blocks, nil
}

func anthropicAssistantBlocks(m *chatMessage) ([]antBlock, error) {
	parts, err := m.parts()
	if err != nil {
		return nil, err
	}
	blocks := make([]antBlock, 0, len(parts)+len(m.ToolCalls))
	for _, p := range parts {
		if (p.Type == "text" || p.Type == "") && p.Text != "" {
			blocks = append(blocks, antBlock{Type: "text", Text: p.Text, CacheControl: p.CacheControl})
		}
	}
	for _, c := range m.ToolCalls {
		blocks = append(blocks, antBlock{
			Type:  "tool_use",
			ID:    anthropicToolID(c.ID),
			Name:  c.Function.Name,
			Input: jsonObjectOr(c.arguments(), json.RawMessage("{}")),
		})
	}
	return blocks, nil
}

// anthropicToolID makes a tool call id acceptable to the Messages API
// (^[a-zA-Z0-9_-]+$); other providers' ids, such as "functions.get:0",
// would be rejected. The same id maps the same way in the tool_use and in
// its tool_result, so they still pair.
func anthropicToolID(id string) string {
	for i := 0; i < len(id); i++ {
		if !isToolIDByte(id[i]) {
			b := []byte(id)
			for j := i; j < len(b); j++ {
				if !isToolIDByte(b[j]) {
					b[j] = '_'
				}
			}
			return string(b)
		}
	}
	return id
}

func isToolIDByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// The Messages API answer.

type antResponse struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Model      string          `json:"model"`
	Content    []antRespBlock  `json:"content"`
	StopReason string          `json:"stop_reason"`
	Usage      antUsage        `json:"usage"`
	Error      *antErrorDetail `json:"error"`
}

type antRespBlock struct {
	Type  string          `json:"type"`
	Text  string          `json:"text"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

type antUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// chatUsage converts usage: OpenAI's prompt_tokens count cached tokens too,
// Anthropic's input_tokens only what was neither read from nor written to
// the cache.
func (u antUsage) chatUsage(output int64) *chatUsage {
	prompt := max(u.InputTokens, 0) + max(u.CacheCreationInputTokens, 0) + max(u.CacheReadInputTokens, 0)
	out := &chatUsage{PromptTokens: prompt, CompletionTokens: max(output, 0), TotalTokens: prompt + max(output, 0)}
	if u.CacheReadInputTokens > 0 {
		out.PromptTokensDetails = &cachedTokens{CachedTokens: u.CacheReadInputTokens}
	}
	return out
}

type antErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Details struct {
		ErrorCode string `json:"error_code"`
	} `json:"details"`
}

// anthropicFinish maps a stop_reason to a finish_reason.
func anthropicFinish(stop string) string {
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

// ChatResponse implements Adapter: text blocks become the message content,
// tool_use blocks tool_calls; thinking and server-tool blocks are dropped.
func (Anthropic) ChatResponse(body []byte) ([]byte, error) {
	var r antResponse
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
	var calls []outToolCall
	for _, b := range r.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			args := string(bytes.TrimSpace(b.Input))
			if args == "" || args == "null" {
				args = "{}"
			}
			calls = append(calls, outToolCall{ID: b.ID, Type: "function", Function: outFunction{Name: b.Name, Arguments: args}})
		}
	}
	return completionBody(r.ID, r.Model, text.String(), calls, anthropicFinish(r.StopReason), r.Usage.chatUsage(r.Usage.OutputTokens))
}

// Observe implements Adapter.
func (Anthropic) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	ref := provider.RefTime(h, now)
	o := provider.NewObservation(provider.OK)
	o.Requests = anthropicWindow(h, "requests", ref)
	o.Tokens = tightestShare(
		anthropicWindow(h, "tokens", ref),
		anthropicWindow(h, "input-tokens", ref),
		anthropicWindow(h, "output-tokens", ref),
	)
	o.RetryAfter = provider.RetryAfter(h, ref)
	if status >= 200 && status < 300 {
		return o
	}
	e := parseAnthropicError(body)
	o.Message = e.Message
	o.Class = classifyAnthropic(status, e)
	if o.RetryAfter < 0 && o.Class.Transient() {
		o.RetryAfter = provider.MessageHint(e.Message)
	}
	return o
}

// anthropicWindow reads anthropic-ratelimit-<kind>-{limit,remaining,reset}.
func anthropicWindow(h http.Header, kind string, ref time.Time) provider.Window {
	w := provider.UnknownWindow
	prefix := "Anthropic-Ratelimit-" + kind + "-"
	if v := h.Get(prefix + "Limit"); v != "" {
		w.Limit = provider.ParseCount(v)
	}
	if v := h.Get(prefix + "Remaining"); v != "" {
		w.Remaining = provider.ParseCount(v)
	}
	if v := h.Get(prefix + "Reset"); v != "" {
		w.Reset = provider.ParseReset(v, ref)
	}
	return w
}

// tightestShare returns the window with the smallest share left
// (remaining/limit): an exhausted one first (the later reset among
// several), the first one on a tie.
func tightestShare(ws ...provider.Window) provider.Window {
	best, bestShare := provider.UnknownWindow, 4.0
	for _, w := range ws {
		var share float64
		switch {
		case w == provider.UnknownWindow:
			share = 3
		case w.Remaining < 0:
			share = 2 // a limit or reset without the count left
		case w.Remaining == 0:
			share = 0
		case w.Limit > 0:
			share = min(float64(w.Remaining)/float64(w.Limit), 1)
		default:
			share = 1
		}
		if share < bestShare || share == 0 && bestShare == 0 && w.Reset > best.Reset {
			best, bestShare = w, share
		}
	}
	return best
}

// parseAnthropicError reads {"type":"error","error":{"type","message"}};
// anything else (a proxy's HTML page) keeps its start as the message.
func parseAnthropicError(body []byte) antErrorDetail {
	var top struct {
		Error json.RawMessage `json:"error"`
	}
	if decodeJSON(body, &top) != nil || len(top.Error) == 0 {
		return antErrorDetail{Message: truncate(string(body), 200)}
	}
	var e antErrorDetail
	if decodeJSON(top.Error, &e) != nil || e.Type == "" && e.Message == "" {
		var s string
		if json.Unmarshal(top.Error, &s) == nil {
			return antErrorDetail{Message: truncate(s, 500)}
		}
		return antErrorDetail{Message: truncate(string(top.Error), 200)}
	}
	e.Message = truncate(e.Message, 500)
	return e
}

// classifyAnthropic maps a status (0 inside a stream) and an error to a
// class. The error type wins over the status: a 200 stream's error event
// is an overload, not a success.
func classifyAnthropic(status int, e antErrorDetail) provider.Class {
	typ, msg := e.Type, strings.ToLower(e.Message)
	switch {
	case typ == "billing_error" || status == http.StatusPaymentRequired ||
		e.Details.ErrorCode == "enforced_spend_limit_reached" ||
		strings.Contains(msg, "credit balance") || strings.Contains(msg, "spend limit"):
		return provider.QuotaExhausted
	case typ == "rate_limit_error" || status == http.StatusTooManyRequests:
		return provider.RateLimited
	case typ == "overloaded_error" || status == 529 || status == http.StatusServiceUnavailable:
		return provider.Overloaded
	case typ == "authentication_error" || typ == "permission_error" ||
		status == http.StatusUnauthorized || status == http.StatusForbidden:
		return provider.Auth
	case (typ == "invalid_request_error" || status >= 400 && status < 500) &&
		(isContextLength("", msg) || strings.Contains(msg, "exceed context limit")):
		return provider.ContextLength
	case typ == "api_error" || typ == "timeout_error" || typ == "not_found_error" ||
		status >= 500 || status == http.StatusRequestTimeout || status == http.StatusNotFound:
		// A 404 names this deployment's model or base_url wrong (a retired
		// model, a typo): its failure, not the client's, as for openai.
		return provider.Server
	case typ == "invalid_request_error" || typ == "request_too_large" || status >= 400 && status < 500:
		return provider.ClientError
	}
	return provider.Server
}

// ChatError implements ErrorTranslator: an Anthropic error body as an
// OpenAI error body.
func (Anthropic) ChatError(status int, body []byte) []byte {
	e := parseAnthropicError(body)
	typ := e.Type
	if typ == "" {
		typ = "api_error"
	}
	return openAIErrorBody(e.Message, typ, classCode(classifyAnthropic(status, e)))
}

// NewStreamDecoder implements Adapter.
func (Anthropic) NewStreamDecoder() StreamDecoder {
	return &anthropicStream{tools: map[int]int{}}
}

// anthropicStream turns Messages API stream events into chunks. The role
// goes in the first chunk with content, not in one for message_start, so
// an error right after message_start can still fail over (message_start
// is not a first token).
type anthropicStream struct {
	w      chunkWriter
	usage  antUsage
	tools  map[int]int // content block index -> tool_calls index
	nTools int
}

type antStreamEvent struct {
	Type    string `json:"type"`
	Message *struct {
		ID    string   `json:"id"`
		Model string   `json:"model"`
		Usage antUsage `json:"usage"`
	} `json:"message"`
	Index        int `json:"index"`
	ContentBlock *struct {
		Type string `json:"type"`
		Text string `json:"text"`
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"content_block"`
	Delta *struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		StopReason  string `json:"stop_reason"`
	} `json:"delta"`
	Usage *antUsage       `json:"usage"`
	Error *antErrorDetail `json:"error"`
}

// provider.Event implements StreamDecoder
// (https://docs.anthropic.com/en/docs/build-with-claude/streaming).
func (s *anthropicStream) Event(ev *provider.Event) ([]byte, provider.EventKind, provider.Observation) {
	none := provider.Observation{}
	var e antStreamEvent
	if kind, obs, ok := decodeEvent(ev, &e); !ok {
		return nil, kind, obs
	}
	typ := e.Type
	if typ == "" {
		typ = ev.Name
	}
	if typ == "" {
		return nil, provider.EventError, streamBroken("stream event without a type")
	}
	switch typ {
	case "message_start":
		if e.Message != nil {
			s.w.start(e.Message.ID, e.Message.Model)
			s.usage = e.Message.Usage
		}
		return nil, provider.EventSkip, none
	case "content_block_start":
		cb := e.ContentBlock
		switch {
		case cb == nil:
		case cb.Type == "tool_use":
			i := s.nTools
			s.nTools++
			s.tools[e.Index] = i
			return s.w.chunk(chunkDelta{ToolCalls: []outToolCall{{
				Index: &i, ID: cb.ID, Type: "function", Function: outFunction{Name: cb.Name},
			}}}, "", nil), provider.EventData, none
		case cb.Type == "text" && cb.Text != "":
			return s.w.chunk(chunkDelta{Content: &cb.Text}, "", nil), provider.EventData, none
		}
		return nil, provider.EventSkip, none
	case "content_block_delta":
		d := e.Delta
		switch {
		case d == nil:
		case d.Type == "text_delta" && d.Text != "":
			return s.w.chunk(chunkDelta{Content: &d.Text}, "", nil), provider.EventData, none
		case d.Type == "input_json_delta" && d.PartialJSON != "":
			i, ok := s.tools[e.Index]
			if !ok {
				return nil, provider.EventData, none // a server tool's input: progress, nothing to relay
			}
			return s.w.chunk(chunkDelta{ToolCalls: []outToolCall{{
				Index: &i, Function: outFunction{Arguments: d.PartialJSON},
			}}}, "", nil), provider.EventData, none
		}
		// Thinking, signature and citations deltas: the model is producing
		// (a first token for ttft_timeout, and for a native relay), but a
		// Chat Completions client has nothing to receive.
		return nil, provider.EventData, none
	case "message_delta":
		if e.Delta == nil {
			return nil, provider.EventError, streamBroken("message_delta without a delta")
		}
		stop := e.Delta.StopReason
		u := s.usage
		var output int64
		if e.Usage != nil {
			output = e.Usage.OutputTokens
			// Newer API versions repeat the input counts here.
			u.InputTokens = max(u.InputTokens, e.Usage.InputTokens)
			u.CacheReadInputTokens = max(u.CacheReadInputTokens, e.Usage.CacheReadInputTokens)
			u.CacheCreationInputTokens = max(u.CacheCreationInputTokens, e.Usage.CacheCreationInputTokens)
		}
		return s.w.chunk(chunkDelta{}, anthropicFinish(stop), u.chatUsage(output)), provider.EventFinal, none
	case "message_stop":
		return nil, provider.EventDone, none
	case "error":
		var d antErrorDetail
		if e.Error != nil {
			d = *e.Error
		}
		o := provider.NewObservation(classifyAnthropic(0, d))
		o.Message = truncate(d.Message, 500)
		if o.Message == "" {
			o.Message = d.Type
		}
		return nil, provider.EventError, o
	}
	// ping, content_block_stop, and event types added later.
	return nil, provider.EventSkip, none
}
