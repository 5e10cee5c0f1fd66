// Package adapters holds the built-in provider types' wire formats (the
// Caddy-free half of the llm_router.providers.* modules): openai (and every
// OpenAI-compatible API), azure, anthropic, gemini, bedrock and vertex.
// Each implements provider.Provider for one configured account: it plans
// every attempt (the upstream request, how its answer and stream are read)
// and decodes the capacity and error class of every answer.
//
// One file per wire family (converse.go: Bedrock's Converse API, for its
// models other than Claude; cloud.go: what Bedrock and Vertex share for
// Claude; stored.go: the requests on a response a provider keeps). The
// client formats they translate from and to are declared in packages
// wire/chat, wire/messages and wire/responses.
package adapters

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/excerpt"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// plan is one attempt of a built-in provider type: the request and the
// reader of its answers.
type plan struct {
	req    *http.Request
	format provider.Format
	native bool
	// model is the deployment's upstream model, named in a Chat answer
	// that names none.
	model string
	// choices and includeUsage are the Chat form's n and
	// stream_options.include_usage: what a complete stream holds.
	choices      int
	includeUsage bool
	r            reader
}

// reader reads one kind of plan's answers: a stateless value, so that
// holding it in the plan costs nothing.
type reader interface {
	answer(p *plan, body []byte) ([]byte, error)
	decoder(p *plan) provider.EventDecoder
}

// Request implements provider.Plan.
func (p *plan) Request() *http.Request { return p.req }

// Format implements provider.Plan.
func (p *plan) Format() provider.Format { return p.format }

// Native implements provider.Plan.
func (p *plan) Native() bool { return p.native }

// Answer implements provider.Plan.
func (p *plan) Answer(body []byte) ([]byte, error) { return p.r.answer(p, body) }

// Stream implements provider.Plan: server-sent events, unless the reader
// reads another framing (framedReader).
func (p *plan) Stream(body io.Reader) provider.Stream {
	if f, ok := p.r.(framedReader); ok {
		return f.stream(p, body)
	}
	return provider.SSE(body, p.r.decoder(p))
}

// framedReader is a reader whose streams are not server-sent events
// (Bedrock's AWS event stream).
type framedReader interface {
	stream(p *plan, body io.Reader) provider.Stream
}

// chatPlan returns a plan whose answers are read into Chat; native when
// Chat is the provider's own format.
func chatPlan(req *http.Request, model string, r *provider.Request, native bool, rd reader) *plan {
	return &plan{req: req, format: provider.Chat, native: native, model: model,
		choices: max(r.Choices, 1), includeUsage: r.IncludeUsage, r: rd}
}

// chatFormats are the formats of a type that serves what has a Chat form
// (anthropic, gemini, bedrock, vertex): no embeddings, no legacy
// completions, and no client API added later until it plans it.
var chatFormats = []provider.Format{provider.Chat, provider.Messages, provider.Responses}

// errNoEmbeddings is a plan's error for an embeddings request to a
// provider type without embeddings (the router does not ask: Serves).
var errNoEmbeddings = errors.New("this provider type does not serve embeddings")

// withModel fills a Chat answer's empty "model" with the deployment's
// upstream model: the client's dashboards attribute tokens by it.
func withModel(body []byte, model string) []byte {
	if v, ok := jsonbody.GetString(body, "model"); ok && v != "" {
		return body
	}
	if out, err := jsonbody.SetString(body, "model", model); err == nil {
		return out
	}
	return body
}

// streamBroken is a stream event that is not what the format promises.
func streamBroken(msg string) provider.Observation {
	o := provider.NewObservation(provider.Server)
	o.Message = msg
	return o
}

// decodeEvent unmarshals a JSON event's data into v for a stream decoder.
// When it returns false, the decoder answers with kind and obs: EventSkip
// for an empty event, EventError for data that is not JSON.
func decodeEvent(ev *provider.Event, v any) (provider.EventKind, provider.Observation, bool) {
	data := bytes.TrimSpace(ev.Data)
	if len(data) == 0 {
		return provider.EventSkip, provider.Observation{}, false
	}
	if err := json.Unmarshal(data, v); err != nil {
		return provider.EventError, streamBroken("invalid JSON event in stream"), false
	}
	return provider.EventData, provider.Observation{}, true
}

// decodeJSON unmarshals data into v, tolerating fields of an unexpected
// type (they are left zero): a provider's odd field must not lose the rest
// of an error body. Only a syntax error is returned.
func decodeJSON(data []byte, v any) error {
	err := json.Unmarshal(data, v)
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return nil
	}
	return err
}

// bodyText is what an error body that is no JSON says, for a message: its
// text, or an HTML page's title (a proxy's "502 Bad Gateway") or else its
// text without tags; whitespace collapsed, at most 200 bytes.
func bodyText(body []byte) string {
	text := string(bytes.TrimSpace(body))
	if strings.HasPrefix(text, "<") {
		lower := strings.ToLower(text)
		if i := strings.Index(lower, "<title>"); i >= 0 {
			if j := strings.Index(lower[i:], "</title>"); j > len("<title>") {
				text = text[i+len("<title>") : i+j]
			}
		} else {
			text = htmlTags.ReplaceAllString(text, " ")
		}
		text = strings.TrimSpace("an HTML page: " + strings.TrimSpace(text))
		text = strings.TrimSuffix(text, ":")
	}
	return excerpt.Of(strings.Join(strings.Fields(text), " "), 200)
}

var htmlTags = regexp.MustCompile(`<[^>]*>`)
