package api

import (
	"net/http"

	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Embeddings is OpenAI's embeddings API
// (https://platform.openai.com/docs/api-reference/embeddings): POST
// .../embeddings, served by the deployments whose provider serves
// embeddings; errors as Chat's.
type Embeddings struct{ Chat }

// Format implements API.
func (Embeddings) Format() provider.Format { return provider.Embeddings }

// embeddingsKeys are the body keys the router reads (see chatKeys).
var embeddingsKeys = []string{"model", "input"}

// Parse implements API: a JSON object with a model and an input.
func (Embeddings) Parse(body []byte, _ http.Header) (*router.Request, string, *Error) {
	var s scan
	model, input := "", false
	if e := scanBody(body, embeddingsKeys, &s, func(name, v []byte) {
		switch string(name) {
		case "model":
			model = s.str("model", v)
		case "input":
			input = true
		}
	}); e != nil {
		return nil, "", e
	}
	if model == "" {
		return nil, "", missingModel()
	}
	if !input {
		return nil, "", Errorf(http.StatusBadRequest, MissingParameter, "input", "you must provide an input parameter")
	}
	return s.sized(&provider.Request{Format: provider.Embeddings, Body: body, Choices: 1}, 0), model, nil
}

// WriteError implements API.
func (e Embeddings) WriteError(w http.ResponseWriter, err *Error) { writeError(w, e, err) }

// Write implements API.
func (e Embeddings) Write(w http.ResponseWriter, res *router.Result) error { return write(w, e, res) }
