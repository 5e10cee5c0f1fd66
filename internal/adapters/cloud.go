package adapters

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// What the clouds that host Anthropic's models (Bedrock, Vertex AI) share:
// a Messages body without its model (the model is in the URL) and with the
// cloud's own API version in the body instead of the anthropic-version
// header.

// cloudMessages rewrites a Messages request body (a JSON object) for a
// cloud that names the model in its URL: "model" removed, "stream" removed
// or set to true (stream, for a cloud that reads it from the body), the
// "anthropic_version" the cloud wants (version, replacing the client's
// header's), and, when betas is not empty and the body has none, the
// client's anthropic-beta features as "anthropic_beta" (Bedrock reads them
// there). Everything else is copied as it came.
func cloudMessages(body []byte, version string, stream bool, betas []string) ([]byte, error) {
	out := make([]byte, 0, len(body)+64)
	out = append(out, '{')
	hasBeta := false
	err := jsonbody.EachMember(body, func(key []byte, start, end int) bool {
		switch string(key) {
		case "model", "stream", "anthropic_version":
			return true
		case "anthropic_beta":
			hasBeta = true
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		k, _ := json.Marshal(string(key)) // a string always marshals
		out = append(append(append(out, k...), ':'), body[start:end]...)
		return true
	})
	if err != nil {
		return nil, err
	}
	if len(out) > 1 {
		out = append(out, ',')
	}
	v, _ := json.Marshal(version)
	out = append(append(out, `"anthropic_version":`...), v...)
	if stream {
		out = append(out, `,"stream":true`...)
	}
	if len(betas) > 0 && !hasBeta {
		b, _ := json.Marshal(betas)
		out = append(append(out, `,"anthropic_beta":`...), b...)
	}
	return append(out, '}'), nil
}

// checkSegment refuses a model that cannot be one segment of a URL path
// (it is path-escaped, but "." and ".." would still move the path), or,
// with method, one that holds ":" (it would run into the ":method" that
// follows it).
func checkSegment(model string, method bool) error {
	if model == "" || model == "." || model == ".." || method && strings.Contains(model, ":") {
		return fmt.Errorf("model %q cannot be named in the provider's URL", model)
	}
	return nil
}

// anthropicBetas are the client's anthropic-beta features, one per value
// (the header is a comma-separated list, possibly repeated).
func anthropicBetas(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Anthropic-Beta") {
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
	}
	return out
}

// prefill checks a Messages body for Claude (Anthropic, Bedrock, Vertex)
// when r is a resume's request (provider.Request.Continues): Claude
// continues its final assistant message (prefill:
// https://docs.anthropic.com/en/docs/build-with-claude/prompt-engineering/prefill-claudes-response),
// except with extended thinking on, which takes no prefill
// (https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking).
func prefill(body []byte, r *provider.Request) error {
	if !r.Continues {
		return nil
	}
	start, end, err := jsonbody.FindMember(body, "thinking")
	if err != nil || start < 0 {
		return err
	}
	var t struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(body[start:end], &t) == nil && t.Type != "" && t.Type != "disabled" {
		return fmt.Errorf("%w: Claude takes no prefill with extended thinking on", provider.ErrNoContinuation)
	}
	return nil
}
