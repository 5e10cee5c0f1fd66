package mockllm

import (
	"crypto/sha256"
	"encoding/json"
)

// A prompt cache, as providers keep one per account: the longest prefix
// of a request's conversation (its system prompt and tools, then its
// messages or input items, one by one) that an earlier request to this
// mock began with is "read from the cache", and reported as cached input
// tokens (its bytes / 4): prompt_tokens_details.cached_tokens (openai),
// cache_read_input_tokens (anthropic), input_tokens_details.cached_tokens
// (Responses). So a benchmark can show what keeping a conversation on one
// deployment saves.

// maxCachedPrefixes bounds the prefixes remembered; past it the cache is
// emptied, as a provider's evicts.
const maxCachedPrefixes = 1 << 17

// cachedTokens returns the tokens of body's longest prefix seen before,
// and remembers body's prefixes.
func (h *Handler) cachedTokens(body []byte) int {
	var r struct {
		System   json.RawMessage   `json:"system"`
		Tools    json.RawMessage   `json:"tools"`
		Messages []json.RawMessage `json:"messages"`
		Input    json.RawMessage   `json:"input"`
	}
	if json.Unmarshal(body, &r) != nil {
		return 0
	}
	turns := r.Messages
	if len(turns) == 0 && len(r.Input) > 0 && r.Input[0] == '[' {
		_ = json.Unmarshal(r.Input, &turns)
	}
	if len(turns) == 0 {
		return 0
	}
	hash := sha256.New()
	hash.Write(r.System)
	hash.Write(r.Tools)
	size := len(r.System) + len(r.Tools)
	sums := make([][32]byte, len(turns))
	sizes := make([]int, len(turns))
	for i, t := range turns {
		hash.Write(t)
		size += len(t)
		hash.Sum(sums[i][:0])
		sizes[i] = size
	}
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	if h.st.prefixes == nil || len(h.st.prefixes) > maxCachedPrefixes {
		h.st.prefixes = map[[32]byte]struct{}{}
	}
	cached := 0
	for i := len(turns) - 1; i >= 0; i-- {
		if _, ok := h.st.prefixes[sums[i]]; ok {
			cached = (sizes[i] + 3) / 4
			break
		}
	}
	for _, s := range sums {
		h.st.prefixes[s] = struct{}{}
	}
	return cached
}
