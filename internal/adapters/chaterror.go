package adapters

import (
	"encoding/json"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// ErrorTranslator is implemented by adapters whose provider's error bodies
// are not in the OpenAI format (anthropic, gemini). A provider's client
// error is passed on to the client as is (DESIGN.md, "Error classes"); the
// caller passes it through ChatError first when the adapter has one, so an
// OpenAI client reads {"error":{...}} whichever provider answered.
type ErrorTranslator interface {
	// ChatError returns the error body of a non-2xx answer (status, body)
	// as an OpenAI error body: {"error":{"message","type","code","param"}}.
	ChatError(status int, body []byte) []byte
}

// Interface guards
var (
	_ ErrorTranslator = Anthropic{}
	_ ErrorTranslator = Gemini{}
)

// openAIErrorBody returns {"error":{"message","type","code","param":null}};
// an empty code is null.
func openAIErrorBody(message, typ, code string) []byte {
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type = message, typ
	if code != "" {
		e.Error.Code = &code
	}
	b, _ := json.Marshal(e) // plain struct: cannot fail
	return b
}

// classCode is the OpenAI error code that says the same as a class, for
// clients that branch on it ("context_length_exceeded"), or "".
func classCode(c provider.Class) string {
	switch c {
	case provider.RateLimited:
		return "rate_limit_exceeded"
	case provider.QuotaExhausted:
		return "insufficient_quota"
	case provider.ContextLength:
		return "context_length_exceeded"
	case provider.Auth:
		return "invalid_api_key"
	case provider.Overloaded:
		return "overloaded"
	}
	return ""
}
