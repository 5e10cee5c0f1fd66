package adapters

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/excerpt"
	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Gemini speaks the Gemini API's generateContent
// (https://ai.google.dev/api/generate-content): requests go to
// BaseURL + "/models/{model}:generateContent", or
// ":streamGenerateContent?alt=sse" for a stream (BaseURL such as
// "https://generativelanguage.googleapis.com/v1beta"), with
// "x-goog-api-key: <key>". Chat Completions bodies are translated to
// GenerateContentRequest, and answers and streams back.
//
// Gemini sends no rate-limit headers: capacity comes from errors only,
// google.rpc.Status bodies (https://ai.google.dev/gemini-api/docs/troubleshooting,
// https://ai.google.dev/gemini-api/docs/rate-limits). RESOURCE_EXHAUSTED
// (429) is rate_limited with the wait of the RetryInfo detail's retryDelay,
// except when a QuotaFailure violation names a per-day quota
// ("GenerateRequestsPerDayPerProjectPerModel-FreeTier"): that is
// quota_exhausted, and the retryDelay of seconds it carries is ignored, as
// retrying then cannot succeed before the daily reset. UNAVAILABLE (503) is
// overloaded; INTERNAL (500) and other 5xx server; UNAUTHENTICATED,
// PERMISSION_DENIED and a 400 API_KEY_INVALID auth; an INVALID_ARGUMENT
// saying the input exceeds the maximum number of tokens context_length;
// NOT_FOUND (this deployment's model is wrong) server; other 4xx
// client_error.
type Gemini struct {
	Endpoint provider.Endpoint
}

// Serves implements provider.Provider: Chat, and Messages and Responses
// (natively or through their Chat form: chatFormats); no embeddings, no
// legacy completions.
func (*Gemini) Serves(f provider.Format) bool { return slices.Contains(chatFormats, f) }

// Plan implements provider.Provider. model is a model name
// ("gemini-2.5-flash", "models/..." accepted) or a tuned model
// ("tunedModels/x"). It fails when the request holds what Gemini cannot
// express (n > 1, an image that is neither a base64 data URL nor an
// http(s) URL, a tool result answering no earlier tool call, a
// non-function tool).
func (p *Gemini) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	if r.Format == provider.Embeddings {
		return nil, errNoEmbeddings
	}
	if r.Continues {
		return nil, provider.ErrNoContinuation // Gemini answers a final model turn afresh
	}
	chatBody, err := r.Chat()
	if err != nil {
		return nil, err
	}
	model = strings.TrimPrefix(model, "models/")
	out, err := chatToGemini(chatBody, model)
	if err != nil {
		return nil, err
	}
	target := "models/" + url.PathEscape(model)
	if strings.Contains(model, "/") { // tunedModels/...
		target = model
	}
	if r.Stream {
		target += ":streamGenerateContent?alt=sse"
	} else {
		target += ":generateContent"
	}
	req, err := p.Endpoint.NewRequest(ctx, p.Endpoint.BaseURL+"/"+target, out, r.Stream, geminiKey.name, geminiKey.prefix)
	if err != nil {
		return nil, err
	}
	return chatPlan(req, model, r, false, geminiReader{}), nil
}

// The GenerateContentRequest.

type gemRequest struct {
	Contents          []gemContent   `json:"contents"`
	SystemInstruction *gemContent    `json:"systemInstruction,omitempty"`
	Tools             []gemTool      `json:"tools,omitempty"`
	ToolConfig        *gemToolConfig `json:"toolConfig,omitempty"`
	GenerationConfig  *gemGenConfig  `json:"generationConfig,omitempty"`
}

type gemContent struct {
	Role  string    `json:"role,omitempty"`
	Parts []gemPart `json:"parts"`
}

type gemPart struct {
	Text             string               `json:"text,omitempty"`
	InlineData       *gemBlob             `json:"inlineData,omitempty"`
	FileData         *gemFileData         `json:"fileData,omitempty"`
	FunctionCall     *gemFunctionCall     `json:"functionCall,omitempty"`
	FunctionResponse *gemFunctionResponse `json:"functionResponse,omitempty"`
	Thought          bool                 `json:"thought,omitempty"`
	ThoughtSignature string               `json:"thoughtSignature,omitempty"`
}

type gemBlob struct {
	MimeType string `json:"mimeType"`
	Data     string `json:"data"`
}

type gemFileData struct {
	MimeType string `json:"mimeType,omitempty"`
	FileURI  string `json:"fileUri"`
}

type gemFunctionCall struct {
	ID   string          `json:"id,omitempty"`
	Name string          `json:"name"`
	Args json.RawMessage `json:"args,omitempty"`
}

type gemFunctionResponse struct {
	Name     string          `json:"name"`
	Response json.RawMessage `json:"response"`
}

type gemTool struct {
	FunctionDeclarations []gemFunctionDecl `json:"functionDeclarations"`
}

// gemFunctionDecl sends the parameters as parametersJsonSchema, which takes
// JSON Schema as OpenAI clients write it; "parameters" takes an OpenAPI
// subset that rejects common keys such as additionalProperties.
type gemFunctionDecl struct {
	Name                 string          `json:"name"`
	Description          string          `json:"description,omitempty"`
	ParametersJSONSchema json.RawMessage `json:"parametersJsonSchema,omitempty"`
}

type gemToolConfig struct {
	FunctionCallingConfig gemFunctionCallingConfig `json:"functionCallingConfig"`
}

type gemFunctionCallingConfig struct {
	Mode                 string   `json:"mode"` // AUTO, ANY, NONE
	AllowedFunctionNames []string `json:"allowedFunctionNames,omitempty"`
}

type gemGenConfig struct {
	Temperature        *float64        `json:"temperature,omitempty"`
	TopP               *float64        `json:"topP,omitempty"`
	MaxOutputTokens    int64           `json:"maxOutputTokens,omitempty"`
	StopSequences      []string        `json:"stopSequences,omitempty"`
	Seed               *int64          `json:"seed,omitempty"`
	PresencePenalty    *float64        `json:"presencePenalty,omitempty"`
	FrequencyPenalty   *float64        `json:"frequencyPenalty,omitempty"`
	ResponseMimeType   string          `json:"responseMimeType,omitempty"`
	ResponseJSONSchema json.RawMessage `json:"responseJsonSchema,omitempty"`
}

// skipThoughtSignature is the sentinel Google documents for function calls
// replayed without the thoughtSignature Gemini 3 models returned with them
// (https://ai.google.dev/gemini-api/docs/thought-signatures): Chat
// Completions has no field to carry signatures through the client.
const skipThoughtSignature = "skip_thought_signature_validator"

// chatToGemini translates a Chat Completions body to a
// GenerateContentRequest for model: its messages (geminiContents), its
// tools (geminiTools) and its sampling and output options
// (geminiGenConfig). It fails on what Gemini cannot express, as each of
// those does, and on a conversation without a user or assistant message.
func chatToGemini(body []byte, model string) ([]byte, error) {
	r, err := chat.ParseRequest(body, "gemini")
	if err != nil {
		return nil, err
	}
	var out gemRequest
	var system []gemPart
	if out.Contents, system, err = geminiContents(r); err != nil {
		return nil, err
	}
	if len(out.Contents) == 0 {
		return nil, errors.New("gemini needs at least one user or assistant message")
	}
	if len(system) > 0 {
		out.SystemInstruction = &gemContent{Parts: system}
	}
	if geminiMajor(model) >= 3 {
		skipThoughtSignatures(out.Contents)
	}
	if err := geminiTools(r, &out); err != nil {
		return nil, err
	}
	if out.GenerationConfig, err = geminiGenConfig(r); err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// geminiContents translates r's messages into Gemini contents (a role's
// consecutive messages merged, appendGemContent) and the system
// instruction's parts. A tool result names its function by the earlier
// call it answers, else by its own name; it fails on one that has
// neither, or an unknown role, naming the message by its index
// (messages[i]).
func geminiContents(r *chat.Request) (contents []gemContent, system []gemPart, err error) {
	callNames := map[string]string{} // tool call id -> function name
	for i := range r.Messages {
		m := &r.Messages[i]
		switch m.Role {
		case "system", "developer":
			if text := m.Content.String(); text != "" {
				system = append(system, gemPart{Text: text})
			}
		case "user":
			parts, err := geminiUserParts(m)
			if err != nil {
				return nil, nil, fmt.Errorf("messages[%d]: %w", i, err)
			}
			contents = appendGemContent(contents, "user", parts)
		case "assistant":
			var gp []gemPart
			for _, p := range m.Content.AsParts() {
				if (p.Type == "text" || p.Type == "") && p.Text != "" {
					gp = append(gp, gemPart{Text: p.Text})
				}
			}
			for _, c := range m.ToolCalls {
				callNames[c.ID] = c.Function.Name
				gp = append(gp, gemPart{FunctionCall: &gemFunctionCall{
					Name: c.Function.Name,
					Args: chat.ObjectOr(string(c.Function.Arguments), json.RawMessage("{}")),
				}})
			}
			contents = appendGemContent(contents, "model", gp)
		case "tool":
			name, ok := callNames[m.ToolCallID]
			if !ok {
				if name = m.Name; name == "" {
					return nil, nil, fmt.Errorf("messages[%d]: tool result %q answers no earlier tool call", i, m.ToolCallID)
				}
			}
			contents = appendGemContent(contents, "user", []gemPart{{
				FunctionResponse: &gemFunctionResponse{Name: name, Response: functionResponse(m.Content.String())},
			}})
		default:
			return nil, nil, fmt.Errorf("messages[%d]: unsupported role %q", i, m.Role)
		}
	}
	return contents, system, nil
}

// skipThoughtSignatures marks the first function call of each model turn
// with skipThoughtSignature, as Gemini 3 models want of a call replayed
// without its signature.
func skipThoughtSignatures(contents []gemContent) {
	for i := range contents {
		c := &contents[i]
		if c.Role != "model" {
			continue
		}
		for j := range c.Parts {
			if c.Parts[j].FunctionCall != nil {
				c.Parts[j].ThoughtSignature = skipThoughtSignature
				break // only a step's first call carries one
			}
		}
	}
}

// geminiTools translates r's tools into out's function declarations and
// its tool_choice into out's function calling mode: function tools only.
func geminiTools(r *chat.Request, out *gemRequest) error {
	var decls []gemFunctionDecl
	for _, t := range r.Tools {
		if t.Type != "" && t.Type != "function" {
			return fmt.Errorf("tool type %q is not supported by gemini", t.Type)
		}
		d := gemFunctionDecl{Name: t.Function.Name, Description: t.Function.Description}
		if p := bytes.TrimSpace(t.Function.Parameters); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
			d.ParametersJSONSchema = p
		}
		decls = append(decls, d)
	}
	if len(decls) == 0 {
		return nil
	}
	out.Tools = []gemTool{{FunctionDeclarations: decls}}
	tc, err := chat.ParseToolChoice(r.ToolChoice)
	if err != nil {
		return err
	}
	switch tc.Mode {
	case "auto":
		out.ToolConfig = &gemToolConfig{FunctionCallingConfig: gemFunctionCallingConfig{Mode: "AUTO"}}
	case "none":
		out.ToolConfig = &gemToolConfig{FunctionCallingConfig: gemFunctionCallingConfig{Mode: "NONE"}}
	case "required":
		out.ToolConfig = &gemToolConfig{FunctionCallingConfig: gemFunctionCallingConfig{Mode: "ANY"}}
	case "function":
		out.ToolConfig = &gemToolConfig{FunctionCallingConfig: gemFunctionCallingConfig{
			Mode: "ANY", AllowedFunctionNames: []string{tc.Name},
		}}
	}
	return nil
}

// geminiGenConfig translates r's sampling and output options into a
// generationConfig: nil when r sets none of them. response_format
// json_object and json_schema ask for JSON (its schema, for json_schema).
func geminiGenConfig(r *chat.Request) (*gemGenConfig, error) {
	gc := gemGenConfig{
		Temperature:      r.Temperature,
		TopP:             r.TopP,
		MaxOutputTokens:  r.MaxOutputTokens(0),
		Seed:             r.Seed,
		PresencePenalty:  r.PresencePenalty,
		FrequencyPenalty: r.FrequencyPenalty,
	}
	var err error
	if gc.StopSequences, err = chat.StopSequences(r.Stop); err != nil {
		return nil, err
	}
	if rf := r.ResponseFormat; rf != nil {
		switch rf.Type {
		case "json_object":
			gc.ResponseMimeType = "application/json"
		case "json_schema":
			gc.ResponseMimeType = "application/json"
			if rf.JSONSchema != nil {
				gc.ResponseJSONSchema = rf.JSONSchema.Schema
			}
		}
	}
	if gc.Temperature != nil || gc.TopP != nil || gc.MaxOutputTokens > 0 || len(gc.StopSequences) > 0 ||
		gc.Seed != nil || gc.PresencePenalty != nil || gc.FrequencyPenalty != nil || gc.ResponseMimeType != "" {
		return &gc, nil
	}
	return nil, nil
}

// geminiMajor is the major version in a model name ("gemini-3-pro" is 3),
// 0 when there is none.
func geminiMajor(model string) int {
	rest, ok := strings.CutPrefix(model, "gemini-")
	if !ok {
		return 0
	}
	n := 0
	for i := 0; i < len(rest) && rest[i] >= '0' && rest[i] <= '9' && n < 1000; i++ {
		n = n*10 + int(rest[i]-'0')
	}
	return n
}

// functionResponse is a tool's output as the object Gemini wants: a JSON
// object as it is, anything else under "result".
func functionResponse(text string) json.RawMessage {
	if obj := chat.ObjectOr(text, nil); obj != nil {
		return obj
	}
	b, _ := json.Marshal(map[string]string{"result": text})
	return b
}

// appendGemContent adds parts as a role's turn, merged into the previous
// content of the same role (function responses answering one turn's calls
// must be one turn).
func appendGemContent(cs []gemContent, role string, parts []gemPart) []gemContent {
	if len(parts) == 0 {
		return cs
	}
	if n := len(cs); n > 0 && cs[n-1].Role == role {
		cs[n-1].Parts = append(cs[n-1].Parts, parts...)
		return cs
	}
	return append(cs, gemContent{Role: role, Parts: parts})
}

func geminiUserParts(m *chat.Message) ([]gemPart, error) {
	parts := m.Content.AsParts()
	out := make([]gemPart, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case "text", "":
			if p.Text != "" { // a part must hold data
				out = append(out, gemPart{Text: p.Text})
			}
		case "image_url", "file":
			m, err := p.Media()
			if err != nil {
				return nil, err
			}
			if m.URL != "" {
				out = append(out, gemPart{FileData: &gemFileData{MimeType: mimeFromURL(m.URL), FileURI: m.URL}})
			} else {
				out = append(out, gemPart{InlineData: &gemBlob{MimeType: m.MediaType, Data: m.Data}})
			}
		default:
			return nil, fmt.Errorf("content part type %q is not supported by gemini", p.Type)
		}
	}
	return out, nil
}

// mimeFromURL guesses a media type from a URL's extension, "" when unknown.
func mimeFromURL(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return ""
	}
	t := mime.TypeByExtension(strings.ToLower(path.Ext(pu.Path)))
	if i := strings.IndexByte(t, ';'); i >= 0 {
		t = t[:i]
	}
	return t
}

// The GenerateContentResponse.

type gemResponse struct {
	Candidates []struct {
		Content struct {
			Parts []gemRespPart `json:"parts"`
		} `json:"content"`
		FinishReason string `json:"finishReason"`
	} `json:"candidates"`
	PromptFeedback *struct {
		BlockReason string `json:"blockReason"`
	} `json:"promptFeedback"`
	UsageMetadata *gemUsage     `json:"usageMetadata"`
	ModelVersion  string        `json:"modelVersion"`
	ResponseID    string        `json:"responseId"`
	Error         *gemErrorBody `json:"error"`
}

type gemRespPart struct {
	Text         string `json:"text"`
	Thought      bool   `json:"thought"`
	FunctionCall *struct {
		ID   string          `json:"id"`
		Name string          `json:"name"`
		Args json.RawMessage `json:"args"`
	} `json:"functionCall"`
}

type gemUsage struct {
	PromptTokenCount        int64 `json:"promptTokenCount"`
	CandidatesTokenCount    int64 `json:"candidatesTokenCount"`
	ThoughtsTokenCount      int64 `json:"thoughtsTokenCount"`
	ToolUsePromptTokenCount int64 `json:"toolUsePromptTokenCount"`
	CachedContentTokenCount int64 `json:"cachedContentTokenCount"`
	TotalTokenCount         int64 `json:"totalTokenCount"`
}

// chatUsage converts usage: OpenAI counts reasoning in completion_tokens.
func (u *gemUsage) chatUsage() *chat.Usage {
	if u == nil {
		return nil
	}
	prompt := max(u.PromptTokenCount, 0) + max(u.ToolUsePromptTokenCount, 0)
	completion := max(u.CandidatesTokenCount, 0) + max(u.ThoughtsTokenCount, 0)
	out := &chat.Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	if u.CachedContentTokenCount > 0 {
		out.PromptTokensDetails = &chat.PromptDetails{CachedTokens: u.CachedContentTokenCount}
	}
	if u.ThoughtsTokenCount > 0 {
		out.CompletionTokensDetails = &chat.CompletionDetails{ReasoningTokens: u.ThoughtsTokenCount}
	}
	return out
}

// geminiFinish maps a finishReason (https://ai.google.dev/api/generate-content#FinishReason);
// Gemini says STOP after function calls too.
func geminiFinish(reason string, calls bool) string {
	switch reason {
	case "MAX_TOKENS":
		return "length"
	case "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE":
		return "content_filter"
	}
	if calls {
		return "tool_calls"
	}
	return "stop"
}

// geminiDelta collects a candidate's text (thought summaries left out) and
// function calls, numbering calls from next.
func geminiDelta(parts []gemRespPart, next int) (text string, calls []chat.ToolCall) {
	var b strings.Builder
	for _, p := range parts {
		switch {
		case p.FunctionCall != nil:
			id := p.FunctionCall.ID
			if id == "" {
				id = chat.NewID("call_")
			}
			i := next + len(calls)
			calls = append(calls, chat.ToolCall{Index: &i, ID: id, Type: "function",
				Function: chat.FunctionCall{Name: p.FunctionCall.Name, Arguments: chat.ArgumentsOf(p.FunctionCall.Args)}})
		case !p.Thought:
			b.WriteString(p.Text)
		}
	}
	return b.String(), calls
}

// geminiReader reads GenerateContentResponses and their streams into Chat.
type geminiReader struct{}

func (geminiReader) decoder(*plan) provider.EventDecoder { return &geminiStream{} }

// answer: the first candidate's text parts joined, its function calls as
// tool_calls (with fresh ids: Gemini sends none).
func (geminiReader) answer(p *plan, body []byte) ([]byte, error) {
	out, err := geminiAnswer(body)
	if err != nil {
		return nil, err
	}
	return withModel(out, p.model), nil
}

func geminiAnswer(body []byte) ([]byte, error) {
	var r gemResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("reading gemini answer: %w", err)
	}
	if r.Error != nil {
		return nil, fmt.Errorf("gemini answered an error: %s: %s", r.Error.Status, excerpt.Of(r.Error.Message, 200))
	}
	var text, finish string
	var calls []chat.ToolCall
	switch {
	case len(r.Candidates) > 0:
		c := r.Candidates[0]
		text, calls = geminiDelta(c.Content.Parts, 0)
		finish = geminiFinish(c.FinishReason, len(calls) > 0)
	case r.PromptFeedback != nil && r.PromptFeedback.BlockReason != "":
		finish = "content_filter" // the prompt was blocked
	default:
		return nil, errors.New("gemini answer has no candidates")
	}
	for i := range calls {
		calls[i].Index = nil
	}
	return chat.NewCompletion(r.ResponseID, r.ModelVersion, text, calls, finish, r.UsageMetadata.chatUsage())
}

// google.rpc.Status, as the Gemini API sends it.

type gemErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Status  string `json:"status"`
	Details []struct {
		Type       string `json:"@type"`
		RetryDelay string `json:"retryDelay"` // RetryInfo: "26s", "0.5s"
		Reason     string `json:"reason"`     // ErrorInfo: "API_KEY_INVALID"
		Violations []struct {
			QuotaMetric string `json:"quotaMetric"`
			QuotaID     string `json:"quotaId"`
		} `json:"violations"` // QuotaFailure
	} `json:"details"`
}

// parseGeminiError reads {"error":{...}}, or [{"error":{...}}] as the
// JSON-array stream sends it; anything else keeps its start as the message.
func parseGeminiError(body []byte) gemErrorBody {
	b := bytes.TrimSpace(body)
	var top struct {
		Error *gemErrorBody `json:"error"`
	}
	var err error
	if len(b) > 0 && b[0] == '[' {
		var list []struct {
			Error *gemErrorBody `json:"error"`
		}
		if err = decodeJSON(b, &list); err == nil && len(list) > 0 {
			top.Error = list[0].Error
		}
	} else {
		err = decodeJSON(b, &top)
	}
	if err != nil || top.Error == nil {
		return gemErrorBody{Message: bodyText(body)}
	}
	top.Error.Message = excerpt.Of(top.Error.Message, 500)
	return *top.Error
}

// classifyGemini maps a status (0 inside a stream: the body's code is
// used) and a google.rpc.Status to a class and the wait its RetryInfo
// states (Unknown when none, or when it must not be trusted).
func classifyGemini(status int, e gemErrorBody) (provider.Class, time.Duration) {
	if status == 0 || status == http.StatusOK {
		status = e.Code
	}
	msg := strings.ToLower(e.Message)
	perDay, keyInvalid := strings.Contains(msg, "per day") || strings.Contains(msg, "per_day"), strings.Contains(msg, "api key not valid")
	wait := time.Duration(provider.Unknown)
	for _, d := range e.Details {
		if d.Reason == "API_KEY_INVALID" {
			keyInvalid = true
		}
		for _, v := range d.Violations {
			if strings.Contains(strings.ToLower(v.QuotaID), "perday") ||
				strings.Contains(strings.ToLower(v.QuotaMetric), "per_day") {
				perDay = true
			}
		}
		if d.RetryDelay != "" {
			if w, err := time.ParseDuration(strings.TrimSpace(d.RetryDelay)); err == nil && w >= 0 {
				wait = provider.ClampWait(w)
			}
		}
	}
	st := e.Status
	switch {
	case st == "RESOURCE_EXHAUSTED" || status == http.StatusTooManyRequests:
		if perDay {
			// The daily quota is spent; the retryDelay of seconds next to
			// it is not when it refreshes.
			return provider.QuotaExhausted, provider.Unknown
		}
		if wait < 0 {
			wait = provider.MessageHint(e.Message)
		}
		return provider.RateLimited, wait
	case keyInvalid || st == "UNAUTHENTICATED" || st == "PERMISSION_DENIED" ||
		status == http.StatusUnauthorized || status == http.StatusForbidden:
		return provider.Auth, provider.Unknown
	case st == "FAILED_PRECONDITION" && strings.Contains(msg, "billing"):
		// "free tier is not available in your country. Please enable billing"
		return provider.QuotaExhausted, provider.Unknown
	case st == "UNAVAILABLE" || status == http.StatusServiceUnavailable:
		return provider.Overloaded, wait
	case (st == "INVALID_ARGUMENT" || status >= 400 && status < 500) && geminiContextLength(msg):
		return provider.ContextLength, provider.Unknown
	case st == "INTERNAL" || st == "UNKNOWN" || st == "DEADLINE_EXCEEDED" || st == "NOT_FOUND" ||
		status >= 500 || status == http.StatusRequestTimeout || status == http.StatusNotFound:
		// NOT_FOUND names this deployment's model wrong (a retired preview):
		// its failure, not the client's, as for openai.
		return provider.Server, wait
	case st != "" || status >= 400 && status < 500:
		return provider.ClientError, provider.Unknown
	}
	return provider.Server, wait
}

func geminiContextLength(msg string) bool {
	return strings.Contains(msg, "exceeds the maximum number of tokens") ||
		strings.Contains(msg, "token count") && strings.Contains(msg, "exceeds") ||
		isContextLength("", msg)
}

// Observe implements provider.Provider.
func (*Gemini) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	ref := provider.RefTime(h, now)
	o := provider.NewObservation(provider.OK)
	o.RetryAfter = provider.RetryAfter(h, ref)
	if status >= 200 && status < 300 {
		return o
	}
	e := parseGeminiError(body)
	var wait time.Duration
	o.Class, wait = classifyGemini(status, e)
	o.Message, o.Code = e.Message, e.Status
	if o.RetryAfter < 0 && o.Class != provider.QuotaExhausted {
		o.RetryAfter = wait
	}
	return o
}

// geminiStream turns the events of ":streamGenerateContent?alt=sse", each
// a whole GenerateContentResponse, into chunks. The stream has no
// terminator: the event carrying a finishReason is the final one.
type geminiStream struct {
	w       chat.ChunkWriter
	started bool
	nCalls  int
	usage   *gemUsage // the latest usageMetadata, for a final event without
	finals  int
}

// Complete implements provider.EventDecoder: an event with a finishReason
// arrived.
func (s *geminiStream) Complete() bool { return s.finals > 0 }

// Decode implements provider.EventDecoder.
func (s *geminiStream) Decode(ev *provider.Event) (provider.Event, provider.EventKind, provider.Observation) {
	none := provider.Observation{}
	var r gemResponse
	if kind, obs, ok := decodeEvent(ev, &r); !ok {
		return provider.Event{}, kind, obs
	}
	if r.Error != nil {
		class, wait := classifyGemini(0, *r.Error)
		o := provider.NewObservation(class)
		o.Message, o.Code = excerpt.Of(r.Error.Message, 500), r.Error.Status
		if class != provider.QuotaExhausted {
			o.RetryAfter = wait
		}
		return provider.Event{}, provider.EventError, o
	}
	if r.Candidates == nil && r.PromptFeedback == nil && r.UsageMetadata == nil {
		return provider.Event{}, provider.EventError, streamBroken("stream event is not a GenerateContentResponse")
	}
	if !s.started {
		id := r.ResponseID
		if id == "" {
			id = chat.NewID("chatcmpl-")
		}
		s.w.Start(id, r.ModelVersion)
		s.started = true
	}
	if r.UsageMetadata != nil {
		s.usage = r.UsageMetadata
	}
	if len(r.Candidates) == 0 {
		if r.PromptFeedback != nil && r.PromptFeedback.BlockReason != "" {
			s.finals++
			return provider.Event{Data: s.w.Chunk(chat.Delta{}, "content_filter", s.usage.chatUsage())}, provider.EventFinal, none
		}
		return provider.Event{}, provider.EventSkip, none // usage alone, or nothing
	}
	c := r.Candidates[0]
	text, calls := geminiDelta(c.Content.Parts, s.nCalls)
	s.nCalls += len(calls)
	d := chat.Delta{ToolCalls: calls}
	if text != "" {
		d.Content = &text
	}
	if c.FinishReason != "" && c.FinishReason != "FINISH_REASON_UNSPECIFIED" {
		s.finals++
		return provider.Event{Data: s.w.Chunk(d, geminiFinish(c.FinishReason, s.nCalls > 0), s.usage.chatUsage())}, provider.EventFinal, none
	}
	if d.Content == nil && len(calls) == 0 {
		for _, p := range c.Content.Parts {
			if p.Thought && p.Text != "" {
				// Thinking: the model producing (a first token), with
				// nothing for a Chat Completions client.
				return provider.Event{}, provider.EventData, none
			}
		}
		return provider.Event{}, provider.EventSkip, none
	}
	return provider.Event{Data: s.w.Chunk(d, "", nil)}, provider.EventData, none
}
