package adapters

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// VertexAnthropicVersion is the anthropic_version Vertex AI's rawPredict
// takes in a Messages body
// (https://cloud.google.com/vertex-ai/generative-ai/docs/partner-models/claude/use-claude).
const VertexAnthropicVersion = "vertex-2023-10-16"

// Vertex speaks Google Vertex AI's publisher models
// (https://cloud.google.com/vertex-ai/generative-ai/docs/reference/rest)
// at Endpoint.BaseURL, such as "https://us-east5-aiplatform.googleapis.com/v1":
// POST {base}/projects/{Project}/locations/{Location}/publishers/{publisher}/models/{model}:{method}.
//
// The model names its publisher: "claude-..." is Anthropic's, served by
// rawPredict / streamRawPredict with the Messages body Vertex expects
// (cloudMessages: no model, anthropic_version VertexAnthropicVersion,
// "stream": true for a stream) and the client's anthropic-beta header, so
// that a Messages client keeps its features; any other model is Google's
// (Gemini), served by generateContent / streamGenerateContent?alt=sse,
// translated from Chat as for the gemini type. "publishers/{p}/models/{m}"
// names both explicitly.
//
// Authentication is the transport's (an OAuth access token from Google's
// credentials, set up by the provider type).
//
// Capacity: Vertex states no remaining counts. A 429 RESOURCE_EXHAUSTED
// is one of (https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429,
// fixtures vertex-429-*.http): a per-minute quota named in the message or
// in a QuotaFailure detail (rate_limited until the next minute begins), a
// per-day quota (quota_exhausted), or dynamic shared quota, which names no
// quota and states no reset (rate_limited with the router's backoff); a
// RetryInfo detail, when present, is the wait. Anthropic's models may also
// answer in Anthropic's own error format (529 overloaded_error), read as
// the anthropic type reads it.
type Vertex struct {
	Endpoint          provider.Endpoint
	Project, Location string
}

// Serves implements provider.Provider: Chat, and Messages and Responses
// (natively or through their Chat form: chatFormats); no embeddings, no
// legacy completions.
func (*Vertex) Serves(f provider.Format) bool { return slices.Contains(chatFormats, f) }

// vertexModel splits a deployment's model into its publisher and name.
func vertexModel(model string) (publisher, name string) {
	if rest, ok := strings.CutPrefix(model, "publishers/"); ok {
		if p, m, ok := strings.Cut(rest, "/models/"); ok {
			return p, m
		}
	}
	if strings.HasPrefix(strings.ToLower(model), "claude") {
		return "anthropic", model
	}
	return "google", strings.TrimPrefix(model, "models/")
}

// Plan implements provider.Provider. It fails when the request holds what
// the model's API cannot express (see messages.FromChat, chatToGemini).
func (p *Vertex) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	if r.Format == provider.Embeddings || r.Format == provider.Completions {
		return nil, errNoEmbeddings
	}
	publisher, name := vertexModel(model)
	if err := checkSegment(publisher, true); err != nil {
		return nil, err
	}
	if err := checkSegment(name, true); err != nil {
		return nil, err
	}
	if publisher == "anthropic" {
		return planClaude(ctx, p, name, r)
	}
	if r.Continues {
		return nil, provider.ErrNoContinuation // Gemini answers afresh
	}
	chatBody, err := r.Chat()
	if err != nil {
		return nil, err
	}
	body, err := chatToGemini(chatBody, name)
	if err != nil {
		return nil, err
	}
	target := p.modelURL(publisher, name)
	if r.Stream {
		target += ":streamGenerateContent?alt=sse"
	} else {
		target += ":generateContent"
	}
	req, err := p.post(ctx, target, body, r.Stream)
	if err != nil {
		return nil, err
	}
	return chatPlan(req, name, r, false, geminiReader{}), nil
}

// modelURL is the URL of a publisher's model, without its ":method".
func (p *Vertex) modelURL(publisher, name string) string {
	return p.Endpoint.BaseURL + "/projects/" + url.PathEscape(p.Project) + "/locations/" + url.PathEscape(p.Location) +
		"/publishers/" + url.PathEscape(publisher) + "/models/" + url.PathEscape(name)
}

func (p *Vertex) post(ctx context.Context, target string, body []byte, stream bool) (*http.Request, error) {
	return p.Endpoint.NewRequest(ctx, target, body, stream, bearerKey.name, bearerKey.prefix)
}

// Observe implements provider.Provider.
func (*Vertex) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	if status < 200 || status >= 300 {
		if e := parseAnthropicError(body); e.Type != "" {
			// An Anthropic model's own error, passed through by Vertex.
			return (*Anthropic)(nil).Observe(status, h, body, now)
		}
	}
	// Google's errors, as the Gemini API sends them.
	o := (*Gemini)(nil).Observe(status, h, body, now)
	if o.Class == provider.RateLimited && o.RetryAfter < 0 {
		if metric := vertexQuotaMetric(parseGeminiError(body)); strings.Contains(metric, "per_minute") || strings.Contains(metric, "perminute") {
			// A per-minute quota: spent until the next minute begins.
			ref := provider.RefTime(h, now)
			reset := time.Minute - ref.Sub(ref.Truncate(time.Minute))
			o.RetryAfter = reset
			spent := provider.Window{Limit: provider.Unknown, Remaining: 0, Reset: reset}
			if strings.Contains(metric, "token") {
				o.Tokens = spent
			} else {
				o.Requests = spent
			}
		}
		// Otherwise dynamic shared quota: no reset stated, the router's
		// backoff decides.
	}
	return o
}

// vertexQuotaMetric is the quota a RESOURCE_EXHAUSTED names, lower case:
// a QuotaFailure's quotaMetric or quotaId, else the message's
// "aiplatform.googleapis.com/..." name; "" for dynamic shared quota.
func vertexQuotaMetric(e gemErrorBody) string {
	for _, d := range e.Details {
		for _, v := range d.Violations {
			if m := v.QuotaMetric + " " + v.QuotaID; strings.TrimSpace(m) != "" {
				return strings.ToLower(m)
			}
		}
	}
	msg := strings.ToLower(e.Message)
	if i := strings.Index(msg, "aiplatform.googleapis.com/"); i >= 0 {
		name := msg[i+len("aiplatform.googleapis.com/"):]
		if j := strings.IndexAny(name, " ,.\n"); j >= 0 {
			name = name[:j]
		}
		return name
	}
	return ""
}
