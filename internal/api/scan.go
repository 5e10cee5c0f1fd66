package api

import (
	"cmp"
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
// by a provider type, which decodes it then. It keeps the first error,
// and the keys the body names its conversation by (note).
type scan struct {
	err *Error
	// The first prompt_cache_key, user and metadata.user_id, each "" when
	// absent or not a string; seen says which of the three were met.
	cacheKey, user, metaUser string
	seen                     uint8
}

// scanBody checks body is one valid JSON object in which each of keys
// appears at most once and is spelled exactly so (or the provider might
// read another value than the router), then calls member with each
// top-level member until s holds an error. Null reads as absent, as it
// does for encoding/json: member is not called for it.
func scanBody(body []byte, keys []string, s *scan, member func(name, v []byte)) *Error {
	if !jsonbody.Valid(body) {
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
			s.note(name, v)
			member(name, v)
		}
		return s.err == nil
	})
	return s.err
}

// The keys note reads, as bits of scan.seen.
const (
	seenCacheKey = 1 << iota
	seenUser
	seenMetadata
)

// note keeps a top-level member that names the request's conversation or
// its prompt cache, the first of each name: prompt_cache_key (OpenAI's),
// user (OpenAI's end-user id), metadata (Anthropic's, its user_id).
func (s *scan) note(name, v []byte) {
	str := func(v []byte) string {
		if v[0] != '"' {
			return ""
		}
		out, _ := jsonbody.String(v)
		return out
	}
	switch string(name) {
	case "prompt_cache_key":
		if s.seen&seenCacheKey == 0 {
			s.seen |= seenCacheKey
			s.cacheKey = str(v)
		}
	case "user":
		if s.seen&seenUser == 0 {
			s.seen |= seenUser
			s.user = str(v)
		}
	case "metadata":
		if s.seen&seenMetadata == 0 {
			s.seen |= seenMetadata
			if v[0] == '{' {
				s.metaUser, _ = jsonbody.GetString(v, "user_id")
			}
		}
	}
}

// keys are the request's keys of its conversation and prompt cache.
func (s *scan) keys() router.Keys {
	return router.Keys{Cache: s.cacheKey, Conversation: cmp.Or(s.cacheKey, s.user, s.metaUser)}
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

// sized wraps pr for routing with the keys s read (keys) and its token
// estimate: prompt tokens are estimate.Prompt (the body's bytes / 4, an
// inline image or document a flat estimate.PayloadTokens), output tokens
// the client's max_tokens (0 when unset), bounded by maxTokenEstimate.
func (s *scan) sized(pr *provider.Request, maxTokens int64) *router.Request {
	rr := &router.Request{Request: pr, PromptTokens: estimate.Prompt(pr.Body),
		OutputTokens: min(max(maxTokens, 0), maxTokenEstimate), Keys: s.keys()}
	rr.Tokens = rr.PromptTokens + rr.OutputTokens
	return rr
}
