package mockllm

import (
	"encoding/json"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Continuation requests: a request whose conversation ends with the
// assistant's own message, which the dialect asks the model to
// continue, gets the rest of Reply after that text (Handler.Continuation).
// A router resuming a broken stream on another provider sends one.
//
//   - Anthropic's Messages body (the anthropic dialect, bedrock's
//     InvokeModel, vertex's rawPredict and streamRawPredict): a final
//     assistant message is a prefill; its text (the string content, or
//     its text blocks joined) is the prefix P. As Anthropic, a P ending
//     in whitespace gets 400 invalid_request_error "final assistant
//     content cannot end with trailing whitespace"; with extended
//     thinking on ("thinking": {"type": "enabled"}), a prefill that
//     does not start with a thinking block gets 400 too ("Expected
//     `thinking` or `redacted_thinking`, but found `text`. ...").
//   - Chat Completions (the openai dialect): a final assistant message
//     with "prefix": true (Mistral, DeepSeek's beta prefix completion),
//     or "continue_final_message": true in the body (vLLM, which wants
//     "add_generation_prompt": false with it, else 400) continues it;
//     without either flag a final assistant message is history, and
//     the answer is the whole Reply, as OpenAI's.
//   - Other APIs (Gemini, Converse, the Responses API, legacy
//     completions) have no continuation.
//
// The answer to a continuation holds Reply after P when Reply starts
// with P, without P (as the providers answer), else the whole Reply (a
// model that ignored the prefix). A stream sends it in Chunks pieces.
// With Continuation "reject" every continuation gets 400 (before the
// checks above). Continuations, answered or not, are counted in
// Stats.Continuations; a continuation is never answered with the
// scripted ToolCall.

// Values of Handler.Continuation.
const (
	ContinuationAccept = "accept"
	ContinuationReject = "reject"
)

// Error messages of continuation requests.
const (
	msgPrefillRejected    = "assistant message prefill is not supported for this model"
	msgTrailingWhitespace = "final assistant content cannot end with trailing whitespace"
	msgPrefillThinking    = "Expected `thinking` or `redacted_thinking`, but found `text`. When `thinking` is enabled, a final `assistant` message must start with a thinking block."
	msgContinueGenPrompt  = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
)

// continuation is what a request asks to continue.
type continuation struct {
	on      bool   // the request is a continuation
	prefix  string // P, the text the answer continues
	invalid string // why the provider rejects it (400), or ""
}

// continuationOf finds the continuation a request of call c (its body,
// valid JSON) asks for.
func (h *Handler) continuationOf(c call, body []byte) continuation {
	switch {
	case c.wire == wireAnthropic && (c.ep == epMessages || c.ep == epInvoke || c.ep == epInvokeStream ||
		c.ep == epRawPredict || c.ep == epStreamRaw):
		return anthropicContinuation(body)
	case h.dialect == dlOpenAI && c.ep == epChat:
		return chatContinuation(body)
	}
	return continuation{}
}

// anthropicContinuation reads the prefill of a Messages body.
func anthropicContinuation(body []byte) continuation {
	var r struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Thinking *struct {
			Type string `json:"type"`
		} `json:"thinking"`
	}
	if json.Unmarshal(body, &r) != nil || len(r.Messages) == 0 || r.Messages[len(r.Messages)-1].Role != "assistant" {
		return continuation{}
	}
	content := r.Messages[len(r.Messages)-1].Content
	cont := continuation{on: true, prefix: contentText(content)}
	switch {
	case strings.TrimRightFunc(cont.prefix, unicode.IsSpace) != cont.prefix:
		cont.invalid = msgTrailingWhitespace
	case r.Thinking != nil && r.Thinking.Type == "enabled" && !startsWithThinking(content):
		cont.invalid = msgPrefillThinking
	}
	return cont
}

// startsWithThinking reports whether a message's content starts with a
// thinking or redacted_thinking block.
func startsWithThinking(raw json.RawMessage) bool {
	var blocks []struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(raw, &blocks) != nil || len(blocks) == 0 {
		return false
	}
	return blocks[0].Type == "thinking" || blocks[0].Type == "redacted_thinking"
}

// chatContinuation reads the continued message of a Chat Completions
// body.
func chatContinuation(body []byte) continuation {
	var r struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
			Prefix  bool            `json:"prefix"`
		} `json:"messages"`
		ContinueFinalMessage bool  `json:"continue_final_message"`
		AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	}
	if json.Unmarshal(body, &r) != nil || len(r.Messages) == 0 {
		return continuation{}
	}
	last := r.Messages[len(r.Messages)-1]
	if last.Role != "assistant" || (!last.Prefix && !r.ContinueFinalMessage) {
		return continuation{}
	}
	cont := continuation{on: true, prefix: contentText(last.Content)}
	if r.ContinueFinalMessage && (r.AddGenerationPrompt == nil || *r.AddGenerationPrompt) {
		// vLLM's add_generation_prompt defaults to true.
		cont.invalid = msgContinueGenPrompt
	}
	return cont
}

// contentText is the text of a message's content: the string, or its
// "text" blocks (Anthropic) or parts (OpenAI) joined.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &blocks)
	var b strings.Builder
	for _, bl := range blocks {
		if bl.Type == "text" {
			b.WriteString(bl.Text)
		}
	}
	return b.String()
}

// continueAnswer sets a's text, pieces and completion tokens to the
// continuation of prefix: Reply after prefix when Reply starts with it,
// else the whole Reply. Its completion tokens are the chunks' share of
// Reply it holds (Chunks × its runes / Reply's runes, rounded up).
func (h *Handler) continueAnswer(a *answer, prefix string) {
	rest, ok := strings.CutPrefix(h.reply, prefix)
	if !ok || prefix == "" {
		return // the whole Reply, as set up
	}
	n := h.chunks()
	a.text = rest
	a.pieces = splitReply(rest, n)
	total := utf8.RuneCountInString(h.reply)
	a.completion = (n*utf8.RuneCountInString(rest) + total - 1) / total
}

// writeContinuationError answers 400 to a continuation the provider
// rejects, in the error format of c's API.
func (h *Handler) writeContinuationError(w http.ResponseWriter, c call, msg string) {
	switch {
	case c.wire == wireAnthropic && h.dialect == dlBedrock:
		writeBedrockError(w, http.StatusBadRequest, "ValidationException"+bedrockCoral, msg)
	case c.wire == wireAnthropic:
		writeBody(w, http.StatusBadRequest, anthropicError("invalid_request_error", msg))
	default:
		writeError(w, http.StatusBadRequest, msg, "invalid_request_error", "")
	}
}
