package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/llmrouter/caddy-llm-router/internal/estimate"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// scan reads what routing needs of a request body, member by member,
// without decoding it: the body goes upstream as it came, or is translated
// by a provider type, which decodes it then. It keeps the first error.
type scan struct{ err *Error }

// scanBody checks body is one valid JSON object in which each of keys
// appears at most once and is spelled exactly so (or the provider might
// read another value than the router), then calls member with each
// top-level member until s holds an error. Null reads as absent, as it
// does for encoding/json: member is not called for it.
func scanBody(body []byte, keys []string, s *scan, member func(name, v []byte)) *Error {
	if !json.Valid(body) {
		return Errorf(http.StatusBadRequest, InvalidJSON, "", "the request body is not valid JSON")
	}
	if err := jsonbody.CheckKeys(body, keys...); err != nil {
		if errors.Is(err, jsonbody.ErrNotObject) {
			return Errorf(http.StatusBadRequest, InvalidJSON, "", "the request body must be a JSON object")
		}
		return Errorf(http.StatusBadRequest, InvalidJSON, "", "%s", err.Error())
	}
	_ = jsonbody.EachMember(body, func(name []byte, start, end int) bool {
		if v := body[start:end]; string(v) != "null" {
			member(name, v)
		}
		return s.err == nil
	})
	return s.err
}

func (s *scan) str(key string, v []byte) string {
	out, ok := "", v[0] == '"'
	if ok {
		out, ok = jsonbody.String(v)
	}
	if !ok {
		s.typeError(key, "a string")
	}
	return out
}

func (s *scan) boolean(key string, v []byte) bool {
	switch string(v) {
	case "true":
		return true
	case "false":
		return false
	}
	s.typeError(key, "a boolean")
	return false
}

func (s *scan) integer(key string, v []byte) int64 {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		s.typeError(key, "an integer")
	}
	return n
}

func (s *scan) typeError(key, kind string) {
	s.fail(Errorf(http.StatusBadRequest, InvalidJSON, key, "invalid type for '%s': expected %s", key, kind))
}

func (s *scan) fail(e *Error) {
	if s.err == nil {
		s.err = e
	}
}

// maxTokenEstimate bounds a request's output-token estimate (2^31 tokens,
// more than any model answers), so that a max_tokens near the int64 limit
// cannot overflow the sums capacity planning makes of it.
const maxTokenEstimate = 1 << 31

// sized wraps pr for routing with its token estimate: prompt tokens are
// estimate.Prompt (the body's bytes / 4, an inline image or document a flat
// estimate.PayloadTokens), output tokens the client's max_tokens (0 when
// unset), bounded by maxTokenEstimate.
func sized(pr *provider.Request, maxTokens int64) *router.Request {
	rr := &router.Request{Request: pr, PromptTokens: estimate.Prompt(pr.Body),
		OutputTokens: min(max(maxTokens, 0), maxTokenEstimate)}
	rr.Tokens = rr.PromptTokens + rr.OutputTokens
	return rr
}
