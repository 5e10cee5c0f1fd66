// Package adapters speaks each provider family's wire format: it builds the
// upstream request for a deployment, decodes capacity (rate-limit headers,
// Retry-After, body hints) and the error class from every response, and
// translates answers and streams back to the client's format.
//
// One file per wire family (openai.go, ...). Adapters hold no state and import
// neither Caddy nor the rest of this project except capacity.
package adapters

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Endpoint is what an adapter needs to reach one provider account.
type Endpoint struct {
	// BaseURL is the API root without a trailing slash, e.g.
	// "https://api.openai.com/v1".
	BaseURL string
	// APIKey is the provider's key. It is only ever put in the upstream
	// request's auth header; never logged or returned.
	APIKey string
	// Header holds extra upstream headers (the Caddyfile `header` lines).
	Header http.Header
}

// Adapter speaks one provider family's wire format. The client side is the
// OpenAI Chat Completions format.
type Adapter interface {
	// Name is the Caddyfile `type` ("openai", ...).
	Name() string
	// ChatRequest builds the upstream request for a client's Chat Completions
	// body, with the deployment's upstream model in place of the client's
	// model group and the provider's key set. Nothing of the client's request
	// headers is copied. It fails only if body is not a JSON object.
	ChatRequest(ctx context.Context, ep *Endpoint, model string, body []byte, stream bool) (*http.Request, error)
	// Observe decodes the error class and the capacity (rate-limit windows,
	// Retry-After) of one response. body is the response body for an error
	// status, nil for a success. now is the local time the response arrived;
	// absolute times in the response are read against its Date header when
	// present, so clock skew with the provider does not matter.
	Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation
	// ChatResponse translates a successful non-streaming upstream body into a
	// Chat Completions body.
	ChatResponse(body []byte) ([]byte, error)
	// NewStreamDecoder returns a decoder for one upstream stream (decoders
	// may keep state across events, such as a message's model or a tool
	// call's index).
	NewStreamDecoder() StreamDecoder
}

// UsageTrailer is implemented by stream decoders whose provider sends usage
// in a chunk of its own after the answer finished (OpenAI with
// stream_options.include_usage): a stream that asked for usage and ends
// without that chunk was cut.
type UsageTrailer interface {
	UsageTrails() bool
}

// StreamDecoder reads one upstream stream, event by event.
type StreamDecoder interface {
	// Event reads one upstream SSE event. For provider.EventData and provider.EventFinal, out
	// is the Chat Completions chunk JSON to send as "data: <out>" (valid
	// until the next call); for provider.EventError, obs holds the class and message.
	Event(ev *provider.Event) (out []byte, kind provider.EventKind, obs provider.Observation)
}

var registry = map[string]Adapter{}

// Register makes an adapter available under its Name. It panics on a
// duplicate name: adapters register from init.
func Register(a Adapter) {
	if _, dup := registry[a.Name()]; dup {
		panic("adapters: duplicate adapter " + a.Name())
	}
	registry[a.Name()] = a
}

// Get returns the adapter for a Caddyfile `type`, or an error naming the
// known types.
func Get(name string) (Adapter, error) {
	if a, ok := registry[name]; ok {
		return a, nil
	}
	return nil, fmt.Errorf("unknown provider type %q (known: %v)", name, Names())
}

// Names lists the registered adapter types, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// newPost builds a POST of a JSON body to url with the provider's extra
// headers and its key in keyHeader (as keyPrefix + key; nothing when the
// key is empty). Nothing of the client's request is copied.
func newPost(ctx context.Context, ep *Endpoint, url string, body []byte, stream bool, keyHeader, keyPrefix string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range ep.Header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if ep.APIKey != "" {
		req.Header.Set(keyHeader, keyPrefix+ep.APIKey)
	}
	return req, nil
}
