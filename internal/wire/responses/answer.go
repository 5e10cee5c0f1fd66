package responses

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/wire/chat"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

// Response is a response object: the answer of a non-streamed request, and
// what response.created / response.completed events carry.
type Response struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	CreatedAt         int64              `json:"created_at"`
	Status            string             `json:"status"` // completed, incomplete, in_progress, failed
	Model             string             `json:"model"`
	Output            []OutputItem       `json:"output"`
	OutputText        string             `json:"output_text,omitempty"`
	IncompleteDetails *IncompleteDetails `json:"incomplete_details"`
	Error             *ErrorObject       `json:"error"`
	Usage             *Usage             `json:"usage,omitempty"`
	ParallelToolCalls bool               `json:"parallel_tool_calls"`
	ToolChoice        json.RawMessage    `json:"tool_choice"`
	Tools             []json.RawMessage  `json:"tools"`
	Metadata          json.RawMessage    `json:"metadata"`
	// Instructions, Temperature and TopP are required (the OpenAI spec's
	// Response): a translated response restates its request's (Echo),
	// null where the request set none.
	Instructions json.RawMessage `json:"instructions"`
	Temperature  *float64        `json:"temperature"`
	TopP         *float64        `json:"top_p"`
}

// OutputItem is one item of a response's output: a message or a
// function_call.
type OutputItem struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role,omitempty"`
	Content []OutputPart `json:"content,omitempty"`
	CallID  string       `json:"call_id,omitempty"`
	Name    string       `json:"name,omitempty"`
	Args    *string      `json:"arguments,omitempty"`
}

// MarshalJSON implements json.Marshaler: a message item always has its
// content array (clients such as Codex CLI read a message without one as
// no message), a function_call none.
func (it OutputItem) MarshalJSON() ([]byte, error) {
	type plain OutputItem
	if it.Type != "message" {
		return jsonbody.Marshal(plain(it))
	}
	content := it.Content
	if content == nil {
		content = []OutputPart{}
	}
	it.Content = nil
	return jsonbody.Marshal(struct {
		plain
		Content []OutputPart `json:"content"`
	}{plain(it), content})
}

// MarshalJSON implements json.Marshaler: an output_text part always has
// its text, annotations and logprobs (OutputTextContent's required
// members; [] when there are none).
func (p OutputPart) MarshalJSON() ([]byte, error) {
	type plain OutputPart
	if p.Type != "output_text" {
		return jsonbody.Marshal(plain(p))
	}
	text, ann, lp := "", p.Annotations, p.Logprobs
	if p.Text != nil {
		text = *p.Text
	}
	if ann == nil {
		ann = []json.RawMessage{}
	}
	if lp == nil {
		lp = []json.RawMessage{}
	}
	p.Text, p.Annotations, p.Logprobs = nil, nil, nil
	return jsonbody.Marshal(struct {
		plain
		Text        string            `json:"text"`
		Annotations []json.RawMessage `json:"annotations"`
		Logprobs    []json.RawMessage `json:"logprobs"`
	}{plain(p), text, ann, lp})
}

// OutputPart is a part of an output message: output_text or refusal.
type OutputPart struct {
	Type        string            `json:"type"`
	Text        *string           `json:"text,omitempty"`
	Refusal     *string           `json:"refusal,omitempty"`
	Annotations []json.RawMessage `json:"annotations,omitempty"`
	Logprobs    []json.RawMessage `json:"logprobs,omitempty"`
}

// IncompleteDetails says why a response is incomplete: max_output_tokens
// or content_filter.
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// ErrorObject is a failed response's error.
type ErrorObject struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Usage is a response's token usage.
type Usage struct {
	InputTokens         int64         `json:"input_tokens"`
	InputTokensDetails  InputDetails  `json:"input_tokens_details"`
	OutputTokens        int64         `json:"output_tokens"`
	OutputTokensDetails OutputDetails `json:"output_tokens_details"`
	TotalTokens         int64         `json:"total_tokens"`
}

// InputDetails is usage.input_tokens_details: CachedTokens read from the
// prompt cache, CacheWriteTokens written to it (both required by OpenAI's
// spec 2.3.0, 0 when none).
type InputDetails struct {
	CachedTokens     int64 `json:"cached_tokens"`
	CacheWriteTokens int64 `json:"cache_write_tokens"`
}

// OutputDetails is usage.output_tokens_details.
type OutputDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// usageFromChat converts Chat usage (nil: none stated).
func usageFromChat(u *chat.Usage) *Usage {
	if u == nil {
		return nil
	}
	out := &Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens,
		TotalTokens: u.PromptTokens + u.CompletionTokens}
	out.InputTokensDetails.CachedTokens = u.CachedTokens()
	out.InputTokensDetails.CacheWriteTokens = u.CacheWriteTokens()
	if d := u.CompletionTokensDetails; d != nil {
		out.OutputTokensDetails.ReasoningTokens = d.ReasoningTokens
	}
	return out
}

// status is a response's status and incomplete_details for a Chat
// finish_reason: length and content_filter end an incomplete response.
func status(finish string) (string, *IncompleteDetails) {
	switch finish {
	case "length":
		return "incomplete", &IncompleteDetails{Reason: "max_output_tokens"}
	case "content_filter":
		return "incomplete", &IncompleteDetails{Reason: "content_filter"}
	}
	return "completed", nil
}

// newResponse returns the frame of a response: id (a fresh one when
// empty), model, status, empty output.
func newResponse(id, model, st string) Response {
	if id == "" {
		id = chat.NewID("resp_")
	}
	return Response{ID: id, Object: "response", CreatedAt: time.Now().Unix(), Status: st, Model: model,
		Output: []OutputItem{}, ParallelToolCalls: true, ToolChoice: json.RawMessage(`"auto"`),
		Tools: []json.RawMessage{}, Metadata: json.RawMessage(`{}`)}
}

func messageItem(id, text string, refusal bool, st string) OutputItem {
	part := OutputPart{Type: "output_text", Text: &text, Annotations: []json.RawMessage{}}
	if refusal {
		part = OutputPart{Type: "refusal", Refusal: &text}
	}
	return OutputItem{Type: "message", ID: id, Status: st, Role: "assistant", Content: []OutputPart{part}}
}

func callItem(id, callID, name, args, st string) OutputItem {
	return OutputItem{Type: "function_call", ID: id, Status: st, CallID: callID, Name: name, Args: &args}
}

// Echo is what a response restates of the request it answers, as OpenAI's
// do: its instructions (a string, or null), temperature and top_p (null
// when the request set none: the router does not know the provider's
// default). The zero Echo restates nothing (all null).
type Echo struct {
	Instructions json.RawMessage
	Temperature  *float64
	TopP         *float64
}

// EchoOf reads a Responses request's Echo; what it cannot read is left
// null.
func EchoOf(request []byte) Echo {
	var r struct {
		Instructions *string  `json:"instructions"`
		Temperature  *float64 `json:"temperature"`
		TopP         *float64 `json:"top_p"`
	}
	if json.Unmarshal(request, &r) != nil {
		return Echo{}
	}
	e := Echo{Temperature: r.Temperature, TopP: r.TopP}
	if r.Instructions != nil {
		e.Instructions, _ = jsonbody.Marshal(*r.Instructions) // a string: cannot fail
	}
	return e
}

// restate sets what r restates of its request.
func (r *Response) restate(e Echo) {
	r.Instructions, r.Temperature, r.TopP = e.Instructions, e.Temperature, e.TopP
}

// FromChatAnswer translates a chat.completion into a response object: the
// first choice's text (or refusal) as a message item, its tool calls as
// function_call items, the finish_reason as status and
// incomplete_details, and usage. The id is a fresh "resp_" one: a
// response id names a response the router gave (see previous_response_id).
// It restates nothing of the request (FromChatAnswerTo does).
func FromChatAnswer(completion []byte) ([]byte, error) { return FromChatAnswerTo(completion, Echo{}) }

// FromChatAnswerTo is FromChatAnswer for the request whose Echo is e.
func FromChatAnswerTo(completion []byte, e Echo) ([]byte, error) {
	var c chat.Completion
	if err := json.Unmarshal(completion, &c); err != nil {
		return nil, fmt.Errorf("reading chat completion: %w", err)
	}
	if len(c.Choices) == 0 {
		return nil, errors.New("chat completion has no choices")
	}
	ch := c.Choices[0]
	st, inc := status(ch.FinishReason)
	r := newResponse("", c.Model, st)
	r.restate(e)
	r.IncompleteDetails = inc
	text := ch.Message.Content.String()
	switch {
	case text != "":
		r.Output = append(r.Output, messageItem(chat.NewID("msg_"), text, false, "completed"))
		r.OutputText = text
	case ch.Message.Refusal != "":
		r.Output = append(r.Output, messageItem(chat.NewID("msg_"), ch.Message.Refusal, true, "completed"))
	}
	for _, tc := range ch.Message.ToolCalls {
		callID := tc.ID
		if callID == "" {
			callID = chat.NewID("call_")
		}
		r.Output = append(r.Output, callItem(chat.NewID("fc_"), callID, tc.Function.Name, string(tc.Function.Arguments), "completed"))
	}
	r.Usage = usageFromChat(c.Usage)
	return jsonbody.Marshal(r)
}

// NewError returns the Responses API's error body, the same as Chat
// Completions': {"error":{"message","type","param","code"}}.
func NewError(message, typ, code, param string) []byte {
	return chat.NewError(message, typ, code, param)
}
