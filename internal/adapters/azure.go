package adapters

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// AzureDefaultAPIVersion is the api-version sent when base_url states none:
// the latest GA data-plane version
// (https://learn.microsoft.com/en-us/azure/ai-services/openai/api-version-deprecation).
const AzureDefaultAPIVersion = "2024-10-21"

// Azure speaks Azure OpenAI: the OpenAI Chat Completions wire format, with
// the deployment in the path and the key in an api-key header
// (https://learn.microsoft.com/en-us/azure/ai-services/openai/reference).
//
// BaseURL is the resource's endpoint with "/openai", such as
// "https://RESOURCE.openai.azure.com/openai", optionally with
// "?api-version=2024-06-01" (else AzureDefaultAPIVersion); requests go to
// {BaseURL}/deployments/{model}/chat/completions?api-version=..., where the
// deployment's upstream model is the Azure deployment name. A BaseURL
// ending in "/openai/v1" (the v1 API, which takes no api-version and the
// model in the body) gets {BaseURL}/chat/completions.
//
// Errors, rate-limit headers (x-ratelimit-remaining-* of -1 means unknown),
// retry-after-ms and Retry-After are decoded as the openai adapter does.
type Azure struct {
	Endpoint provider.Endpoint
}

// azureURL builds the URL of an operation ("chat/completions",
// "embeddings") of a deployment.
func azureURL(base, deployment, op string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "", fmt.Errorf("azure base_url %q is not an absolute URL", base)
	}
	q := u.Query()
	p := strings.TrimSuffix(u.Path, "/")
	if strings.HasSuffix(p, "/v1") {
		u.Path = p + "/" + op
	} else {
		u.Path = p + "/deployments/" + deployment + "/" + op
		if q.Get("api-version") == "" {
			q.Set("api-version", AzureDefaultAPIVersion)
		}
	}
	u.RawPath = ""
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// azureV1 reports whether base is the v1 API ("/openai/v1"), which serves
// the Responses API (the deployment-path API serves it only in preview
// api-versions, so a Responses request goes there through its Chat form).
func azureV1(base string) bool {
	u, err := url.Parse(base)
	return err == nil && strings.HasSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
}

// Serves implements provider.Provider: the formats of OpenAI's
// (openAIFormats).
func (*Azure) Serves(f provider.Format) bool { return slices.Contains(openAIFormats, f) }

// Plan implements provider.Provider. The body is the client's (or its Chat
// form) with the model set: harmless for deployment URLs, required by the
// v1 API.
func (p *Azure) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	return planOpenAIFamily(model, r, azureV1(p.Endpoint.BaseURL), p.ContinuationFor(model), azureReader{}, func(op string, body []byte, stream bool) (*http.Request, error) {
		return azurePost(ctx, &p.Endpoint, model, op, body, stream)
	})
}

// azurePost builds a POST of body, with model set, to the deployment's
// operation, with the api-key header.
func azurePost(ctx context.Context, ep *provider.Endpoint, model, op string, body []byte, stream bool) (*http.Request, error) {
	out, err := provider.SetModel(body, model)
	if err != nil {
		return nil, err
	}
	target, err := azureURL(ep.BaseURL, model, op)
	if err != nil {
		return nil, err
	}
	return ep.NewRequest(ctx, target, out, stream, azureKey.name, azureKey.prefix)
}

// Observe implements provider.Provider: the openai dialect.
func (*Azure) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	return observeOpenAI(status, h, body, now)
}

// azureReader reads Azure's Chat Completions answers and streams.
type azureReader struct{ chatReader }

func (azureReader) decoder(p *plan) provider.EventDecoder {
	return &azureStream{chatStream{choices: p.choices, includeUsage: p.includeUsage}}
}

// azureStream is the openai decoder, but skips the chunk Azure sends first
// with only the prompt's content-filter results and no choices: it is no
// first token, and must not commit the response to this deployment.
type azureStream struct{ chatStream }

// Decode implements provider.EventDecoder. An event that is no chunk at
// all (not an object, no choices) is a broken stream, not content to relay.
func (s *azureStream) Decode(ev *provider.Event) (provider.Event, provider.EventKind, provider.Observation) {
	out, kind, obs := s.chatStream.Decode(ev)
	data := out.Data
	if len(data) == 0 {
		return out, kind, obs
	}
	if data[0] != '{' || !bytes.Contains(data, []byte(`"choices"`)) {
		return provider.Event{}, provider.EventError, streamBroken("stream event is not a chat completion chunk")
	}
	if kind != provider.EventFinal && bytes.Contains(data, []byte(`"prompt_filter_results"`)) {
		var c struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   json.RawMessage   `json:"usage"`
		}
		if json.Unmarshal(data, &c) == nil && len(c.Choices) == 0 &&
			(len(c.Usage) == 0 || bytes.Equal(c.Usage, []byte("null"))) {
			return provider.Event{}, provider.EventSkip, obs
		}
	}
	return out, kind, obs
}
