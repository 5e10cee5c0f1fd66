package adapters

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The OpenAI Chat Completions wire types the translating adapters
// (anthropic.go, gemini.go, anthropic_ingress.go) read and write. Only the
// fields a translation uses are declared; the rest of a client's body is
// dropped by the translation, not relayed.

// chatRequest is a client's Chat Completions request.
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Tools               []chatTool      `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	Stop                json.RawMessage `json:"stop"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	User                string          `json:"user"`
	N                   *int            `json:"n"`
	Seed                *int64          `json:"seed"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	ResponseFormat      *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	} `json:"response_format"`
}

// maxOutputTokens is max_completion_tokens, else max_tokens, else def.
func (r *chatRequest) maxOutputTokens(def int64) int64 {
	switch {
	case r.MaxCompletionTokens != nil && *r.MaxCompletionTokens > 0:
		return *r.MaxCompletionTokens
	case r.MaxTokens != nil && *r.MaxTokens > 0:
		return *r.MaxTokens
	}
	return def
}

// chatMessage is one message of a Chat Completions request.
type chatMessage struct {
	Role string `json:"role"`
	// Content is a string, an array of content parts, or null.
	Content    json.RawMessage `json:"content"`
	ToolCalls  []chatToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
	Name       string          `json:"name"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name string `json:"name"`
		// Arguments is a JSON string holding JSON text; a few clients send
		// the object itself, which is accepted too.
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// arguments returns the call's arguments as JSON text, "" when absent.
func (c *chatToolCall) arguments() string {
	raw := bytes.TrimSpace(c.Function.Arguments)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// chatPart is one content part: text, image_url or file.
type chatPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
	// ImageURL is {"url","detail"}, or (some clients) a bare URL string.
	ImageURL json.RawMessage `json:"image_url"`
	File     *struct {
		FileData string `json:"file_data"`
		Filename string `json:"filename"`
	} `json:"file"`
	// CacheControl is Anthropic's prompt-caching marker, which clients of
	// OpenAI-compatible gateways put on text parts; passed on to Anthropic.
	CacheControl json.RawMessage `json:"cache_control"`
}

// imageURL returns the part's image URL.
func (p *chatPart) imageURL() string {
	var obj struct {
		URL string `json:"url"`
	}
	if json.Unmarshal(p.ImageURL, &obj) == nil && obj.URL != "" {
		return obj.URL
	}
	var s string
	_ = json.Unmarshal(p.ImageURL, &s)
	return s
}

// parts returns a message's content as parts: a string is one text part,
// null or absent is none.
func (m *chatMessage) parts() ([]chatPart, error) {
	raw := bytes.TrimSpace(m.Content)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		return []chatPart{{Type: "text", Text: s}}, nil
	}
	var parts []chatPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, fmt.Errorf("message content is neither a string nor an array of parts: %w", err)
	}
	return parts, nil
}

// text returns a message's text parts joined (tool results, system prompts).
func (m *chatMessage) text() (string, error) {
	parts, err := m.parts()
	if err != nil {
		return "", err
	}
	if len(parts) == 1 {
		return parts[0].Text, nil
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" || p.Type == "" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// parseChatRequest decodes a client's body for translation to provider,
// which answers one choice only: n > 1 is refused rather than silently
// answered with one.
func parseChatRequest(body []byte, provider string) (*chatRequest, error) {
	if _, _, err := findMember(body, "model"); err != nil {
		return nil, err
	}
	var r chatRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("reading chat request: %w", err)
	}
	if r.N != nil && *r.N > 1 {
		return nil, fmt.Errorf("n > 1 is not supported by %s", provider)
	}
	return &r, nil
}

// toolChoice is a decoded tool_choice: mode "auto", "none", "required", or
// "function" with the function's name.
type toolChoice struct {
	mode, name string
}

func parseToolChoice(raw json.RawMessage) (toolChoice, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return toolChoice{}, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return toolChoice{mode: s}, nil
		}
		return toolChoice{}, fmt.Errorf("unsupported tool_choice %q", s)
	}
	var obj struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Function.Name == "" {
		return toolChoice{}, errors.New("tool_choice must be auto, none, required or a function")
	}
	return toolChoice{mode: "function", name: obj.Function.Name}, nil
}

// stopSequences decodes stop: a string or an array of strings.
func stopSequences(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, nil
		}
		return []string{s}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("stop must be a string or an array of strings")
	}
	return list, nil
}

// parseDataURL splits "data:image/png;base64,AAAA" into its media type and
// base64 data; ok is false for anything else (a URL, or data not in base64).
func parseDataURL(u string) (mediaType, data string, ok bool) {
	rest, found := strings.CutPrefix(u, "data:")
	if !found {
		return "", "", false
	}
	meta, data, found := strings.Cut(rest, ",")
	if !found {
		return "", "", false
	}
	meta, isBase64 := strings.CutSuffix(meta, ";base64")
	if !isBase64 {
		return "", "", false
	}
	if i := strings.IndexByte(meta, ';'); i >= 0 {
		meta = meta[:i] // parameters such as charset
	}
	return meta, data, true
}

func isHTTPURL(u string) bool {
	return strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://")
}

// jsonObjectOr returns args when it is a JSON object, else def; tool
// inputs must be objects for Anthropic and Gemini.
func jsonObjectOr(args string, def json.RawMessage) json.RawMessage {
	b := bytes.TrimSpace([]byte(args))
	if len(b) > 0 && b[0] == '{' && json.Valid(b) {
		return b
	}
	return def
}

// newID returns a fresh random identifier with prefix ("chatcmpl-",
// "call_"): 26 base32 characters, so a call id stays within the 40
// characters OpenAI accepts when the client sends it back.
func newID(prefix string) string { return prefix + rand.Text() }

// The Chat Completions answer a translating adapter writes.

// completionBody is a translated answer as a one-choice chat.completion:
// the text (null when the answer is only tool calls), the tool calls, the
// mapped finish_reason and usage; an empty id gets a fresh one.
func completionBody(id, model, text string, calls []outToolCall, finish string, usage *chatUsage) ([]byte, error) {
	msg := chatOutMessage{Role: "assistant", ToolCalls: calls}
	if text != "" || len(calls) == 0 {
		msg.Content = &text
	}
	if id == "" {
		id = newID("chatcmpl-")
	}
	return json.Marshal(chatCompletion{
		ID:      id,
		Object:  "chat.completion",
		Created: time.Now().Unix(),
		Model:   model,
		Choices: []chatChoice{{Message: msg, FinishReason: finish}},
		Usage:   usage,
	})
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *chatUsage   `json:"usage,omitempty"`
}

type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatOutMessage `json:"message"`
	Logprobs     *struct{}      `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
}

type chatOutMessage struct {
	Role string `json:"role"`
	// Content is null when the answer is only tool calls, as OpenAI sends it.
	Content   *string       `json:"content"`
	ToolCalls []outToolCall `json:"tool_calls,omitempty"`
}

type outToolCall struct {
	// Index is set in stream deltas only.
	Index    *int        `json:"index,omitempty"`
	ID       string      `json:"id,omitempty"`
	Type     string      `json:"type,omitempty"`
	Function outFunction `json:"function"`
}

type outFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

type chatUsage struct {
	PromptTokens            int64         `json:"prompt_tokens"`
	CompletionTokens        int64         `json:"completion_tokens"`
	TotalTokens             int64         `json:"total_tokens"`
	PromptTokensDetails     *cachedTokens `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *reasonTokens `json:"completion_tokens_details,omitempty"`
}

type cachedTokens struct {
	CachedTokens int64 `json:"cached_tokens"`
}

type reasonTokens struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// chunkDelta is the delta of one chat.completion.chunk choice.
type chunkDelta struct {
	Role      string        `json:"role,omitempty"`
	Content   *string       `json:"content,omitempty"`
	ToolCalls []outToolCall `json:"tool_calls,omitempty"`
}

// chunkWriter builds the chat.completion.chunk events of one stream. The
// part before the delta is the same for every chunk and built once; the
// role is put in the first chunk written.
type chunkWriter struct {
	head     []byte
	buf      []byte
	roleSent bool
}

// start fixes the stream's id and model (the first event naming them).
func (w *chunkWriter) start(id, model string) {
	w.head = append(w.head[:0], `{"id":`...)
	w.head = appendJSONString(w.head, id)
	w.head = append(w.head, `,"object":"chat.completion.chunk","created":`...)
	w.head = strconv.AppendInt(w.head, time.Now().Unix(), 10)
	w.head = append(w.head, `,"model":`...)
	w.head = appendJSONString(w.head, model)
	w.head = append(w.head, `,"choices":[{"index":0,"delta":`...)
}

// chunk returns one chunk; finish "" is a null finish_reason and usage nil
// leaves usage out. The result is valid until the next call.
func (w *chunkWriter) chunk(d chunkDelta, finish string, usage *chatUsage) []byte {
	if !w.roleSent {
		d.Role, w.roleSent = "assistant", true
	}
	if len(w.head) == 0 {
		w.start(newID("chatcmpl-"), "")
	}
	delta, _ := json.Marshal(d) // plain structs: cannot fail
	w.buf = append(append(w.buf[:0], w.head...), delta...)
	w.buf = append(w.buf, `,"logprobs":null,"finish_reason":`...)
	if finish == "" {
		w.buf = append(w.buf, "null"...)
	} else {
		w.buf = appendJSONString(w.buf, finish)
	}
	w.buf = append(w.buf, "}]"...)
	if usage != nil {
		u, _ := json.Marshal(usage)
		w.buf = append(append(w.buf, `,"usage":`...), u...)
	}
	return append(w.buf, '}')
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// decodeJSON unmarshals data into v, tolerating fields of an unexpected
// type (they are left zero): a provider's odd field must not lose the rest
// of an error body. Only a syntax error is returned.
func decodeJSON(data []byte, v any) error {
	err := json.Unmarshal(data, v)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return nil
	}
	return err
}
