package api

import (
	"errors"
	"net/http"

	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Completions is OpenAI's legacy completions API
// (https://platform.openai.com/docs/api-reference/completions): POST
// .../completions, streamed or not, served by the group's OpenAI-format
// deployments (openai, azure) as the client wrote it, with the same
// failover; it has no Chat Completions form, so other deployments are not
// tried. Errors as Chat Completions'.
type Completions struct{ Chat }

// completionsKeys are the body keys the router reads (see chatKeys).
var completionsKeys = []string{"model", "prompt", "stream", "n", "max_tokens", "stream_options"}

// Format implements API.
func (Completions) Format() provider.Format { return provider.Completions }

// Parse implements API: a JSON object with a model and a prompt (a string
// or an array), n within 1..128.
func (Completions) Parse(body []byte, _ http.Header) (*router.Request, string, *Error) {
	var c chatScan
	c.noRole = -1
	prompt := false
	if e := scanBody(body, completionsKeys, &c.scan, func(name, v []byte) {
		if string(name) == "prompt" {
			if v[0] != '"' && v[0] != '[' {
				c.typeError("prompt", "a string or an array")
			}
			prompt = true
			return
		}
		c.member(name, v)
	}); e != nil {
		return nil, "", e
	}
	switch {
	case c.model == "":
		return nil, "", missingModel()
	case !prompt:
		return nil, "", Errorf(http.StatusBadRequest, MissingParameter, "prompt", "you must provide a prompt parameter")
	case c.n != nil && (*c.n < 1 || *c.n > 128):
		return nil, "", Errorf(http.StatusBadRequest, InvalidValue, "n", "'n' must be between 1 and 128")
	}
	pr := &provider.Request{Format: provider.Completions, Body: body, Stream: c.stream, Choices: 1, IncludeUsage: c.includeUsage}
	if c.n != nil {
		pr.Choices = int(*c.n)
	}
	return c.sized(pr, max(c.maxTokens, 0)), c.model, nil
}

// WriteError implements API.
func (x Completions) WriteError(w http.ResponseWriter, e *Error) { writeError(w, x, e) }

// Write implements API.
func (x Completions) Write(w http.ResponseWriter, res *router.Result) error { return write(w, x, res) }

// fromChat is never asked: a completion is only served natively.
func (Completions) fromChat([]byte) ([]byte, error) {
	return nil, errors.New("a legacy completion has no Chat Completions form")
}
