package adapters

import (
	"context"
	"net/http"
)

// Native is implemented by adapters whose wire format is also a client
// format the router accepts: a request in that format goes to their
// deployments as it is (with the upstream model set), and their answers and
// streams go back as they are, losing nothing to translation (Anthropic's
// cache_control, thinking blocks, ...).
type Native interface {
	// NativeFormat names the client format: "anthropic" for the Messages API.
	NativeFormat() string
	// NativeRequest builds the upstream request for a client body already in
	// NativeFormat. header holds the client's headers that belong to the
	// format (NativeHeaders), passed on as they came.
	NativeRequest(ctx context.Context, ep *Endpoint, model string, body []byte, header http.Header, stream bool) (*http.Request, error)
}

// NativeHeaders are the client headers a native pass keeps, by format:
// Anthropic's API version and beta features (1M context, ...) are the
// client's choice.
var NativeHeaders = map[string][]string{
	"anthropic": {"Anthropic-Version", "Anthropic-Beta"},
}

// NativeFormat implements Native.
func (Anthropic) NativeFormat() string { return "anthropic" }

// NativeRequest implements Native: the client's Messages body with the
// upstream model, to BaseURL + "/messages".
func (Anthropic) NativeRequest(ctx context.Context, ep *Endpoint, model string, body []byte, header http.Header, stream bool) (*http.Request, error) {
	out, err := SetString(body, "model", model)
	if err != nil {
		return nil, err
	}
	req, err := anthropicPost(ctx, ep, out, stream)
	if err != nil {
		return nil, err
	}
	for _, k := range NativeHeaders["anthropic"] {
		if v := header.Values(k); len(v) > 0 {
			req.Header[k] = v
		}
	}
	return req, nil
}

// anthropicPost builds a POST of a Messages body with the provider's key and
// API version; nothing of the client's.
func anthropicPost(ctx context.Context, ep *Endpoint, body []byte, stream bool) (*http.Request, error) {
	req, err := newPost(ctx, ep, ep.BaseURL+"/messages", body, stream, "X-Api-Key", "")
	if err != nil {
		return nil, err
	}
	if req.Header.Get("Anthropic-Version") == "" {
		req.Header.Set("Anthropic-Version", anthropicVersion)
	}
	return req, nil
}

var _ Native = Anthropic{}
