package capacity

import (
	"math"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// A deployment's prompt cache, as the router predicts it: what its answers
// last reported as held in the provider's cache (read from it or written
// to it) for a request's cache prefix, so that admission charges a window
// that does not count cache reads (provider.CountsUncachedInput) only the
// prompt's uncached part.

// PromptCacheTTL is how long a prefix the deployment last reported is
// predicted to stay in its provider's cache: Anthropic's default cache
// lifetime, 5 minutes, refreshed by every read
// (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching);
// PromptCacheTTL1h for a prefix an answer reported written to the
// one-hour cache (provider.Usage.CacheWrite1hTokens), kept by later reads.
const (
	PromptCacheTTL   = 5 * time.Minute
	PromptCacheTTL1h = time.Hour
)

// maxCachedPrefixes bounds the prefixes a State remembers; past it the
// expired ones are forgotten, and all of them if none had expired.
const maxCachedPrefixes = 4096

// cachedPrefix is what an answer reported held in the cache for a prefix:
// its tokens (cache reads plus cache writes), and when.
type cachedPrefix struct {
	tokens int64
	at     time.Time
	ttl    time.Duration
}

// RecordCache notes what an answer at now, to a request of the given
// cache prefixes (Need.Prefixes), used: its cache reads plus writes are
// what the provider holds in its cache for the request's longest prefix
// from then on. An answer that read and wrote nothing forgets it (the
// provider does not cache it: too short, or the cache was evicted).
func (s *State) RecordCache(now time.Time, prefixes []uint64, u provider.Usage) {
	if len(prefixes) == 0 {
		return
	}
	key := prefixes[len(prefixes)-1]
	held := u.CachedInputTokens + u.CacheWriteTokens
	s.lock()
	defer s.mu.Unlock()
	if held <= 0 {
		delete(s.cache, key)
		return
	}
	if s.cache == nil || len(s.cache) >= maxCachedPrefixes {
		s.cache = forgetExpired(s.cache, now)
	}
	ttl := PromptCacheTTL
	if c, ok := s.cache[key]; u.CacheWrite1hTokens > 0 || ok && c.ttl == PromptCacheTTL1h && now.Sub(c.at) < c.ttl {
		ttl = PromptCacheTTL1h
	}
	s.cache[key] = cachedPrefix{tokens: held, at: now, ttl: ttl}
}

// forgetExpired returns m without its expired prefixes, or a new map when
// none had expired (or m is nil).
func forgetExpired(m map[uint64]cachedPrefix, now time.Time) map[uint64]cachedPrefix {
	for k, c := range m {
		if now.Sub(c.at) >= c.ttl {
			delete(m, k)
		}
	}
	if m == nil || len(m) >= maxCachedPrefixes {
		return map[uint64]cachedPrefix{}
	}
	return m
}

// cachedLocked predicts how many of n's prompt tokens the provider reads
// from its cache at now: what the deployment last reported for the longest
// of n's prefixes it remembers within its TTL, at most the prompt
// (n.Tokens less n.Output).
func (s *core) cachedLocked(now time.Time, n Need) int64 {
	for i := len(n.Prefixes) - 1; i >= 0; i-- {
		if c, ok := s.cache[n.Prefixes[i]]; ok && now.Sub(c.at) < c.ttl {
			return min(c.tokens, max(n.Tokens-n.Output, 0))
		}
	}
	return 0
}

// windowTokens is what the stated token window counts of an attempt of n
// at now, as its last statement said it counts (provider.Counts): the
// estimate (prompt plus max_tokens), less the predicted cache reads for a
// window that does not count them, the prompt alone or max_tokens alone
// for an input or output window. A count the estimate cannot give (an
// output window, no max_tokens) is the whole estimate.
func (s *core) windowTokens(now time.Time, n Need) int64 {
	switch s.counts {
	case provider.CountsUncached:
		return n.Tokens - s.cachedLocked(now, n)
	case provider.CountsUncachedInput:
		return max(n.Tokens-n.Output-s.cachedLocked(now, n), min(n.Tokens, 1))
	case provider.CountsOutput:
		if n.Output > 0 {
			return n.Output
		}
	}
	return n.Tokens
}

// learnCharged folds an attempt's charge to the token window (counted of
// its estimate of tokens) into State.charged.
func (s *State) learnCharged(counted, tokens int64) {
	if tokens <= 0 {
		return
	}
	c := min(max(float64(counted)/float64(tokens), minRatio), 1)
	if s.charged == 0 {
		s.charged = c
	} else {
		s.charged += ratioWeight * (c - s.charged)
	}
}

// perEstimate turns n units of the token window (a forecast, or Unknown)
// into units of the router's estimate, at what the window was charged
// per unit lately (State.charged): a window that counts a fifth of the
// estimates of cached requests lets five times as many start.
func (s *State) perEstimate(n int64) int64 {
	if n < 0 || s.charged <= 0 || s.charged >= 1 {
		return n
	}
	return int64(min(float64(n)/s.charged, math.MaxInt64/4))
}
