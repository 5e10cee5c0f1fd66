package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/llmrouter/caddy-llm-router/internal/estimate"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// HeaderTokenCount says how a count_tokens answer was made: "estimate"
// when no deployment of the group could count (the router's own count,
// by OpenAI's o200k_base tokenizer over the request's text, which differs
// from Claude's by some percent); absent when a provider counted.
const HeaderTokenCount = "X-LLM-Router-Token-Count"

// CountTokens is Anthropic's token counting
// (https://docs.anthropic.com/en/api/messages-count-tokens): POST
// .../messages/count_tokens, answered {"input_tokens": n}. The router
// serves it as any request (router.Request.CountTokens): a deployment
// whose provider counts tokens (provider.TokenCounter: anthropic) is
// asked, with failover, and its answer, or its client error, is passed on
// as it came. When none can count (none is configured, or each is
// rate-limited, failing or drained until the deadline), the answer is the
// router's estimate, marked by HeaderTokenCount. Errors in the Messages
// format.
type CountTokens struct {
	// body is the request's (ForRequest): what the estimate counts.
	body []byte
}

// Format implements API.
func (CountTokens) Format() provider.Format { return provider.Messages }

// Parse implements API: a JSON object with a model and a non-empty
// messages array, shaped as for Messages.Parse (max_tokens is not asked
// for). The request weighs nothing on token windows: Anthropic counts
// tokens for free, under rate limits of their own.
func (CountTokens) Parse(body []byte, header http.Header) (*router.Request, string, *Error) {
	var m messagesScan
	if e := scanBody(body, []string{"model", "messages", "system"}, &m.scan, m.member); e != nil {
		return nil, "", e
	}
	if m.model == "" {
		return nil, "", missingModel()
	}
	if m.messages == 0 {
		return nil, "", Errorf(http.StatusBadRequest, MissingParameter, "messages", "messages: a non-empty array is required")
	}
	pr := &provider.Request{Format: provider.Messages, Body: body, Header: MessagesHeaders(header), Choices: 1}
	return &router.Request{Request: pr, CountTokens: true}, m.model, nil
}

// WriteError implements API, in the Messages format.
func (CountTokens) WriteError(w http.ResponseWriter, e *Error) { Messages{}.WriteError(w, e) }

// Write implements API: the provider's count or client error as it came;
// the router's estimate when the router failed (its own error).
func (c CountTokens) Write(w http.ResponseWriter, res *router.Result) error {
	var rerr *router.Error
	if !errors.As(res.Err, &rerr) {
		return Messages{}.Write(w, res)
	}
	n, _, ok := estimate.Exact(c.body, 1<<31)
	if !ok {
		n = estimate.Prompt(c.body)
	}
	w.Header().Set(HeaderTokenCount, "estimate")
	writeBody(w, http.StatusOK, []byte(`{"input_tokens":`+strconv.FormatInt(n, 10)+`}`))
	return nil
}

// ForRequest returns a for the request body body, as its answer is
// written: a Responses answer translated from Chat restates the request's
// instructions, temperature and top_p (Responses.WithRequest); a
// count_tokens estimate counts it.
func ForRequest(a API, body []byte) API {
	switch x := a.(type) {
	case Responses:
		return x.WithRequest(body)
	case CountTokens:
		x.body = body
		return x
	}
	return a
}
