package adapters

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
)

// Embedder is implemented by adapters whose providers serve embeddings in
// the OpenAI format (POST .../embeddings); deployments of other adapters are
// not tried for embeddings requests.
type Embedder interface {
	// EmbeddingsRequest builds the upstream request for a client's
	// embeddings body, with the upstream model in place of the group.
	EmbeddingsRequest(ctx context.Context, ep *Endpoint, model string, body []byte) (*http.Request, error)
	// EmbeddingsResponse checks a successful upstream body and returns the
	// client's answer; an error makes the attempt a failure.
	EmbeddingsResponse(body []byte) ([]byte, error)
}

// EmbeddingsRequest implements Embedder: POST BaseURL + "/embeddings".
func (OpenAI) EmbeddingsRequest(ctx context.Context, ep *Endpoint, model string, body []byte) (*http.Request, error) {
	return openAIPost(ctx, ep, ep.BaseURL+"/embeddings", model, body, false)
}

// EmbeddingsResponse implements Embedder: the answer must be a list with data.
func (OpenAI) EmbeddingsResponse(body []byte) ([]byte, error) {
	var e struct {
		Data  json.RawMessage `json:"data"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return nil, errors.New("the answer is not JSON")
	}
	if len(e.Error) > 0 && !bytes.Equal(e.Error, []byte("null")) {
		return nil, errors.New("the answer is an error: " + parseErrorValue(e.Error).message)
	}
	if len(e.Data) == 0 || e.Data[0] != '[' {
		return nil, errors.New("the answer has no data")
	}
	return body, nil
}

// EmbeddingsRequest implements Embedder: the deployment's embeddings URL
// with api-version, and the api-key header.
func (Azure) EmbeddingsRequest(ctx context.Context, ep *Endpoint, model string, body []byte) (*http.Request, error) {
	return azurePost(ctx, ep, model, "embeddings", body, false)
}

// EmbeddingsResponse implements Embedder.
func (Azure) EmbeddingsResponse(body []byte) ([]byte, error) {
	return OpenAI{}.EmbeddingsResponse(body)
}

var (
	_ Embedder = OpenAI{}
	_ Embedder = Azure{}
)
