package adapters

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// The requests on a response the provider keeps (OpenAI's Responses API:
// https://platform.openai.com/docs/api-reference/responses, and its
// background mode: https://platform.openai.com/docs/guides/background):
// GET /responses/{id} (a poll; with ?stream=true&starting_after=N the
// events after sequence number N again), POST /responses/{id}/cancel,
// DELETE /responses/{id}, GET /responses/{id}/input_items.

// ErrNoStoredResponses is ResponseRequest's error on a provider that does
// not serve the Responses API natively: it keeps no response.
var ErrNoStoredResponses = errors.New("this deployment does not serve the Responses API natively: it keeps no response")

// storedQuery are the query parameters a request on a stored response
// passes on (stream, starting_after; include[] of a poll; a list's after,
// limit, order): nothing else of the client's query goes upstream.
var storedQuery = []string{"stream", "starting_after", "include", "include[]", "after", "before", "limit", "order"}

// ResponseRequest builds the request method on the stored response path
// ("{id}", "{id}/cancel", "{id}/input_items", under BaseURL +
// "/responses/"), with query's parameters of storedQuery.
// ErrNoStoredResponses when the server does not serve the Responses API
// (responses: false).
func (p *OpenAI) ResponseRequest(ctx context.Context, method, path string, query url.Values) (*http.Request, error) {
	if !p.Responses {
		return nil, ErrNoStoredResponses
	}
	return storedRequest(ctx, &p.Endpoint, method, p.Endpoint.BaseURL+"/responses/"+path, query, bearerKey.name, bearerKey.prefix)
}

// ResponseRequest is OpenAI's (see OpenAI.ResponseRequest) on Azure's v1
// API, the one that serves the Responses API.
func (p *Azure) ResponseRequest(ctx context.Context, method, path string, query url.Values) (*http.Request, error) {
	if !azureV1(p.Endpoint.BaseURL) {
		return nil, ErrNoStoredResponses
	}
	target, err := azureURL(p.Endpoint.BaseURL, "", "responses/"+path)
	if err != nil {
		return nil, err
	}
	return storedRequest(ctx, &p.Endpoint, method, target, query, azureKey.name, azureKey.prefix)
}

// storedRequest is a bodiless request (Endpoint.NewRequest's headers and
// key) of method to target, with query's storedQuery parameters added to
// target's own; Accept text/event-stream when it asks for a stream.
func storedRequest(ctx context.Context, ep *provider.Endpoint, method, target string, query url.Values, keyHeader, keyPrefix string) (*http.Request, error) {
	stream := query.Get("stream") == "true"
	req, err := ep.NewRequest(ctx, target, nil, stream, keyHeader, keyPrefix)
	if err != nil {
		return nil, err
	}
	req.Method, req.Body, req.GetBody, req.ContentLength = method, http.NoBody, nil, 0
	req.Header.Del("Content-Type")
	q := req.URL.Query()
	for _, k := range storedQuery {
		for _, v := range query[k] {
			q.Add(k, v)
		}
	}
	req.URL.RawQuery = q.Encode()
	return req, nil
}
