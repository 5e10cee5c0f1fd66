// Package chat declares OpenAI's Chat Completions wire format once
// (https://platform.openai.com/docs/api-reference/chat): the request, the
// answer, the stream chunk, usage and the error body. The chat client API,
// the translating provider types (anthropic, gemini, bedrock's Converse,
// vertex) and the Messages and Responses translations read and write these
// same types, in both directions.
//
// Only the fields a translation reads or writes are declared: a body that
// goes through untranslated (an OpenAI client to an OpenAI-compatible
// provider) keeps everything, a translated one keeps what is declared.
package chat

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// Request is a Chat Completions request.
type Request struct {
	Model               string          `json:"model"`
	Messages            []Message       `json:"messages"`
	MaxTokens           *int64          `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens,omitempty"`
	Temperature         *float64        `json:"temperature,omitempty"`
	TopP                *float64        `json:"top_p,omitempty"`
	Stop                json.RawMessage `json:"stop,omitempty"` // a string or an array of strings
	Tools               []Tool          `json:"tools,omitempty"`
	ToolChoice          json.RawMessage `json:"tool_choice,omitempty"` // "auto", "none", "required" or a function
	ParallelToolCalls   *bool           `json:"parallel_tool_calls,omitempty"`
	User                string          `json:"user,omitempty"`
	N                   *int            `json:"n,omitempty"`
	Seed                *int64          `json:"seed,omitempty"`
	PresencePenalty     *float64        `json:"presence_penalty,omitempty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty,omitempty"`
	ResponseFormat      *ResponseFormat `json:"response_format,omitempty"`
	ReasoningEffort     string          `json:"reasoning_effort,omitempty"`
	Stream              bool            `json:"stream,omitempty"`
	StreamOptions       *StreamOptions  `json:"stream_options,omitempty"`
}

// MaxOutputTokens is max_completion_tokens, else max_tokens, else def.
func (r *Request) MaxOutputTokens(def int64) int64 {
	switch {
	case r.MaxCompletionTokens != nil && *r.MaxCompletionTokens > 0:
		return *r.MaxCompletionTokens
	case r.MaxTokens != nil && *r.MaxTokens > 0:
		return *r.MaxTokens
	}
	return def
}

// ParseRequest decodes a request for translation to provider, which
// answers one choice only: n > 1 is refused rather than silently answered
// with one.
//
// body must be valid JSON: the chat client API validated it (or
// json.Marshal wrote it), so it is decoded by a scan of its members rather
// than by json.Unmarshal, which would validate its 4 KB again and rescan
// every message: a translation's largest cost. The small members go through
// encoding/json; keys are matched as providers match them, exactly.
func ParseRequest(body []byte, provider string) (*Request, error) {
	var r Request
	var err error
	walkErr := jsonbody.EachMember(body, func(key []byte, start, end int) bool {
		v := body[start:end]
		if string(key) == "messages" {
			r.Messages, err = parseMessages(v)
		} else if dst := r.member(key); dst != nil {
			err = json.Unmarshal(v, dst)
		}
		if err != nil {
			err = fmt.Errorf("reading chat request: %s: %w", key, err)
		}
		return err == nil
	})
	if walkErr != nil {
		return nil, walkErr
	}
	if err != nil {
		return nil, err
	}
	if r.N != nil && *r.N > 1 {
		return nil, fmt.Errorf("n > 1 is not supported by %s", provider)
	}
	return &r, nil
}

// member returns the field of the member key, nil for one not declared.
func (r *Request) member(key []byte) any {
	switch string(key) {
	case "model":
		return &r.Model
	case "max_tokens":
		return &r.MaxTokens
	case "max_completion_tokens":
		return &r.MaxCompletionTokens
	case "temperature":
		return &r.Temperature
	case "top_p":
		return &r.TopP
	case "stop":
		return &r.Stop
	case "tools":
		return &r.Tools
	case "tool_choice":
		return &r.ToolChoice
	case "parallel_tool_calls":
		return &r.ParallelToolCalls
	case "user":
		return &r.User
	case "n":
		return &r.N
	case "seed":
		return &r.Seed
	case "presence_penalty":
		return &r.PresencePenalty
	case "frequency_penalty":
		return &r.FrequencyPenalty
	case "response_format":
		return &r.ResponseFormat
	case "stream":
		return &r.Stream
	case "stream_options":
		return &r.StreamOptions
	}
	return nil
}

// parseMessages decodes messages member by member, content by
// Content.UnmarshalJSON (a string without a second pass).
func parseMessages(v []byte) ([]Message, error) {
	if string(v) == "null" {
		return nil, nil
	}
	var msgs []Message
	var err error
	walkErr := jsonbody.EachElement(v, func(start, end int) bool {
		raw := v[start:end]
		var m Message
		switch raw[0] {
		case 'n': // null: a zero message, as encoding/json reads it
		case '{':
			walk := jsonbody.EachMember(raw, func(key []byte, s, e int) bool {
				err = m.member(key, raw[s:e])
				return err == nil
			})
			if err == nil {
				err = walk
			}
		default:
			err = fmt.Errorf("messages[%d] is not an object", len(msgs))
		}
		msgs = append(msgs, m)
		return err == nil
	})
	if err == nil {
		err = walkErr
	}
	if err != nil {
		return nil, err
	}
	if msgs == nil {
		msgs = []Message{}
	}
	return msgs, nil
}

func (m *Message) member(key []byte, v []byte) error {
	var dst *string
	switch string(key) {
	case "content":
		return m.Content.UnmarshalJSON(v)
	case "tool_calls":
		return json.Unmarshal(v, &m.ToolCalls)
	case "role":
		dst = &m.Role
	case "refusal":
		dst = &m.Refusal
	case "tool_call_id":
		dst = &m.ToolCallID
	case "name":
		dst = &m.Name
	default:
		return nil
	}
	if string(v) == "null" {
		return nil
	}
	s, ok := jsonbody.String(v)
	if !ok {
		return fmt.Errorf("%s must be a string", key)
	}
	*dst = s
	return nil
}

// ResponseFormat is response_format: text, json_object or json_schema.
type ResponseFormat struct {
	Type       string      `json:"type"`
	JSONSchema *JSONSchema `json:"json_schema,omitempty"`
}

// JSONSchema is response_format.json_schema.
type JSONSchema struct {
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Schema      json.RawMessage `json:"schema"`
	Strict      *bool           `json:"strict,omitempty"`
}

// StreamOptions is stream_options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Message is one message of a request, or the message of an answer.
type Message struct {
	Role       string     `json:"role"`
	Content    Content    `json:"content"`
	Refusal    string     `json:"refusal,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Name       string     `json:"name,omitempty"`
}

// Content is a message's content: a string, an array of content parts, or
// null (the zero value).
type Content struct {
	// Text is the content when it is a string.
	Text string
	// Parts is the content when it is an array.
	Parts  []Part
	isText bool
}

// Text returns string content.
func Text(s string) Content { return Content{Text: s, isText: true} }

// IsNull reports whether the content is null (or absent).
func (c Content) IsNull() bool { return !c.isText && c.Parts == nil }

// UnmarshalJSON implements json.Unmarshaler. A string is decoded without
// validating it a second time (the document it is part of was validated).
func (c *Content) UnmarshalJSON(raw []byte) error {
	*c = Content{}
	switch {
	case len(raw) == 0 || raw[0] == 'n':
		return nil
	case raw[0] == '"':
		s, ok := jsonbody.String(raw)
		if !ok {
			return errors.New("message content is not a valid string")
		}
		*c = Text(s)
		return nil
	case raw[0] == '[':
		var parts []Part
		if err := json.Unmarshal(raw, &parts); err != nil {
			return fmt.Errorf("message content is neither a string nor an array of parts: %w", err)
		}
		if parts == nil {
			parts = []Part{}
		}
		c.Parts = parts
		return nil
	}
	return errors.New("message content is neither a string nor an array of parts")
}

// MarshalJSON implements json.Marshaler.
func (c Content) MarshalJSON() ([]byte, error) {
	switch {
	case c.Parts != nil:
		return json.Marshal(c.Parts)
	case c.isText:
		return json.Marshal(c.Text)
	}
	return []byte("null"), nil
}

// AsParts returns the content as parts: a string is one text part, null
// none.
func (c Content) AsParts() []Part {
	if c.Parts != nil {
		return c.Parts
	}
	if c.isText {
		return []Part{{Type: "text", Text: c.Text}}
	}
	return nil
}

// String returns the content's text: the string, or the text parts joined
// by a newline (tool results, system prompts: parts are separate pieces of
// text, which run together would read as one word across the seam).
func (c Content) String() string {
	if c.Parts == nil {
		return c.Text
	}
	if len(c.Parts) == 1 {
		return c.Parts[0].Text
	}
	var b strings.Builder
	for _, p := range c.Parts {
		if p.Type == "text" || p.Type == "" {
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// Part is one content part: text, image_url or file.
type Part struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *ImageURL `json:"image_url,omitempty"`
	File     *File     `json:"file,omitempty"`
	// CacheControl is Anthropic's prompt-caching marker, which clients of
	// OpenAI-compatible gateways put on text parts; passed on to Anthropic.
	CacheControl json.RawMessage `json:"cache_control,omitempty"`
}

// ImageURL is an image_url part's {"url","detail"}; some clients send the
// URL as a bare string, which is read too.
type ImageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

// UnmarshalJSON implements json.Unmarshaler.
func (u *ImageURL) UnmarshalJSON(raw []byte) error {
	if len(raw) > 0 && raw[0] == '"' {
		return json.Unmarshal(raw, &u.URL)
	}
	type plain ImageURL
	return json.Unmarshal(raw, (*plain)(u))
}

// URLOf returns an image part's URL, "" when it has none.
func (p *Part) URLOf() string {
	if p.ImageURL == nil {
		return ""
	}
	return p.ImageURL.URL
}

// Media is what an image_url or file part carries, as translations to
// other formats need it: inline base64 Data of MediaType, or (images only)
// a URL to fetch.
type Media struct {
	MediaType, Data, URL string
	// File is true for a file part (a document), false for an image.
	File bool
}

// Media reads an image_url or file part. Errors: an image that is neither
// a base64 data URL nor an http(s) URL, a file part without file_data as a
// base64 data URL (file ids are OpenAI's).
func (p *Part) Media() (Media, error) {
	if p.Type == "file" {
		if p.File == nil {
			return Media{}, errors.New("file part without file")
		}
		mt, data, ok := ParseDataURL(p.File.FileData)
		if !ok {
			return Media{}, errors.New("file parts must carry file_data as a base64 data URL (file ids are OpenAI's)")
		}
		return Media{MediaType: mt, Data: data, File: true}, nil
	}
	u := p.URLOf()
	if mt, data, ok := ParseDataURL(u); ok {
		return Media{MediaType: mt, Data: data}, nil
	}
	if IsHTTPURL(u) {
		return Media{URL: u}, nil
	}
	return Media{}, errors.New("image_url must be a base64 data URL or an http(s) URL")
}

// File is a file part's file: its data as a data URL.
type File struct {
	FileData string `json:"file_data"`
	Filename string `json:"filename,omitempty"`
}

// ToolCall is a function call of an answer (or of an assistant message of
// a request); in stream deltas Index numbers the calls.
type ToolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is a tool call's function.
type FunctionCall struct {
	Name      string    `json:"name,omitempty"`
	Arguments Arguments `json:"arguments"`
}

// Arguments is a call's arguments: JSON text in a JSON string. A few
// clients send the object itself, which is read as its text.
type Arguments string

// ArgumentsOf is the arguments of a call whose input is the JSON value raw
// (a Messages tool_use input, a Gemini functionCall's args): its text, or
// "{}" when it is absent or null.
func ArgumentsOf(raw json.RawMessage) Arguments {
	args := bytes.TrimSpace(raw)
	if len(args) == 0 || string(args) == "null" {
		return "{}"
	}
	return Arguments(args)
}

// UnmarshalJSON implements json.Unmarshaler.
func (a *Arguments) UnmarshalJSON(raw []byte) error {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
		*a = ""
	case raw[0] == '"':
		s, ok := jsonbody.String(raw)
		if !ok {
			return errors.New("arguments: not a string")
		}
		*a = Arguments(s)
	default:
		*a = Arguments(raw)
	}
	return nil
}

// Tool is a function tool.
type Tool struct {
	Type     string   `json:"type"`
	Function Function `json:"function"`
}

// Function is a tool's function declaration.
type Function struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// ToolChoice is a decoded tool_choice: Mode "auto", "none", "required", or
// "function" with the function's Name; Mode "" when none was given.
type ToolChoice struct {
	Mode, Name string
}

// ParseToolChoice decodes tool_choice.
func ParseToolChoice(raw json.RawMessage) (ToolChoice, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return ToolChoice{}, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return ToolChoice{Mode: s}, nil
		}
		return ToolChoice{}, fmt.Errorf("unsupported tool_choice %q", s)
	}
	var obj struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Function.Name == "" {
		return ToolChoice{}, errors.New("tool_choice must be auto, none, required or a function")
	}
	return ToolChoice{Mode: "function", Name: obj.Function.Name}, nil
}

// FunctionChoice is the tool_choice that names one function.
func FunctionChoice(name string) json.RawMessage {
	b, _ := json.Marshal(struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}{Type: "function", Function: struct {
		Name string `json:"name"`
	}{name}})
	return b
}

// StopSequences decodes stop: a string or an array of strings.
func StopSequences(raw json.RawMessage) ([]string, error) {
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

// ParseDataURL splits "data:image/png;base64,AAAA" into its media type and
// base64 data; ok is false for anything else (a URL, or data not in base64).
func ParseDataURL(u string) (mediaType, data string, ok bool) {
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

// IsHTTPURL reports whether u is an http(s) URL.
func IsHTTPURL(u string) bool {
	return strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "http://")
}

// ObjectOr returns args when it is a JSON object, else def: tool inputs
// must be objects for Anthropic and Gemini.
func ObjectOr(args string, def json.RawMessage) json.RawMessage {
	b := bytes.TrimSpace([]byte(args))
	if len(b) > 0 && b[0] == '{' && json.Valid(b) {
		return b
	}
	return def
}

// NewID returns a fresh random identifier with prefix ("chatcmpl-",
// "call_"): 26 base32 characters, so a call id stays within the 40
// characters OpenAI accepts when the client sends it back.
func NewID(prefix string) string { return prefix + rand.Text() }

// ErrorBody is the error format, {"error":{"message","type","param","code"}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is an error body's error; Param and Code are null when empty.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// NewError returns an error body; an empty param or code is null.
func NewError(message, typ, code, param string) []byte {
	e := ErrorBody{Error: ErrorDetail{Message: message, Type: typ}}
	if param != "" {
		e.Error.Param = &param
	}
	if code != "" {
		e.Error.Code = &code
	}
	b, _ := json.Marshal(e) // plain struct: cannot fail
	return b
}
