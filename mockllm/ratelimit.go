package mockllm

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// The provider-side rate limit (Handler.RateLimit): its fixed window,
// the openai dialect's x-ratelimit-* headers and the 429 sent to a
// request over the window.

// RateLimit is a fixed-window provider rate limit, one window for
// requests and tokens alike. The window starts with the first API
// request and a new one starts with the first request after it ends.
// A request that would exceed a limit gets 429 and is not counted
// against the window; requests rejected with 401 or 400 are not
// counted either. The 429 is in the dialect's format:
// OpenAI's rate_limit_exceeded error with Retry-After; Anthropic's
// rate_limit_error with retry-after; Gemini's RESOURCE_EXHAUSTED
// google.rpc error with a QuotaFailure (quotaId
// GenerateRequestsPerMinutePerProjectPerModel-FreeTier, or
// GenerateContentInputTokensPerModelPerMinute-FreeTier when the tokens
// limit is the one exceeded) and a RetryInfo; Bedrock's
// ThrottlingException ("Too many requests, ..." or "Too many tokens,
// ...", no Retry-After); Vertex's RESOURCE_EXHAUSTED per-minute quota
// of the base model (generate_content_requests_per_minute_per_project_per_base_model
// or generate_content_input_tokens_per_minute_per_base_model) with a
// RetryInfo. Retry-After, retry-after and retryDelay are the whole
// seconds until the window ends, rounded up. Only openai and anthropic
// send rate-limit headers.
type RateLimit struct {
	// Requests is the number of requests allowed per window.
	// Default: 0 (unlimited, no x-ratelimit-*-requests headers).
	// Unit: requests.
	Requests int `json:"requests,omitempty"`

	// Tokens is the number of tokens allowed per window; a request
	// uses its prompt plus completion tokens. Default: 0 (unlimited,
	// no x-ratelimit-*-tokens headers). Unit: tokens.
	Tokens int `json:"tokens,omitempty"`

	// Window is the length of the fixed window. Default: 1m.
	// Unit: duration.
	Window caddy.Duration `json:"window,omitempty"`
}

// limitState is a snapshot of the rate-limit window.
type limitState struct {
	on       bool
	requests int // limit, 0 = none
	tokens   int // limit, 0 = none
	remReq   int
	remTok   int
	reset    time.Duration // until the window ends
	now      time.Time     // when the snapshot was taken
	exceeded string        // "requests" or "tokens" when over the limit
}

// window is the length of the RateLimit window.
func (h *Handler) window() time.Duration {
	if h.RateLimit != nil && h.RateLimit.Window > 0 {
		return time.Duration(h.RateLimit.Window)
	}
	return DefaultRateLimitWindow
}

// limit checks a request that uses tokens against the window. With
// consume it starts or rolls the window and counts the request when
// it fits; without, it only reports the current state.
func (h *Handler) limit(tokens int, consume bool) limitState {
	rl := h.RateLimit
	if rl == nil || (rl.Requests <= 0 && rl.Tokens <= 0) {
		return limitState{}
	}
	window := h.window()
	now := h.now()
	st := h.st
	st.mu.Lock()
	defer st.mu.Unlock()
	start, reqs, toks := st.rlStart, st.rlRequests, st.rlTokens
	if start.IsZero() || !now.Before(start.Add(window)) {
		start, reqs, toks = now, 0, 0
		if consume {
			st.rlStart, st.rlRequests, st.rlTokens = now, 0, 0
		}
	}
	ls := limitState{on: true, requests: rl.Requests, tokens: rl.Tokens, reset: start.Add(window).Sub(now), now: now}
	if consume {
		switch {
		case rl.Requests > 0 && reqs+1 > rl.Requests:
			ls.exceeded = "requests"
		case rl.Tokens > 0 && toks+tokens > rl.Tokens:
			ls.exceeded = "tokens"
		default:
			reqs++
			toks += tokens
			st.rlRequests, st.rlTokens = reqs, toks
		}
	}
	ls.remReq = max(0, rl.Requests-reqs)
	ls.remTok = max(0, rl.Tokens-toks)
	return ls
}

// setLimitHeaders sets the dialect's rate-limit headers, if any.
func (h *Handler) setLimitHeaders(hdr http.Header, ls limitState) {
	if !ls.on {
		return
	}
	switch h.dialect {
	case dlAnthropic:
		setAnthropicLimitHeaders(hdr, ls)
		return
	case dlGemini, dlBedrock, dlVertex:
		return // they send no rate-limit headers
	}
	reset := ls.reset.Round(time.Millisecond).String()
	if ls.requests > 0 {
		hdr.Set("x-ratelimit-limit-requests", strconv.Itoa(ls.requests))
		hdr.Set("x-ratelimit-remaining-requests", strconv.Itoa(ls.remReq))
		hdr.Set("x-ratelimit-reset-requests", reset)
	}
	if ls.tokens > 0 {
		hdr.Set("x-ratelimit-limit-tokens", strconv.Itoa(ls.tokens))
		hdr.Set("x-ratelimit-remaining-tokens", strconv.Itoa(ls.remTok))
		hdr.Set("x-ratelimit-reset-tokens", reset)
	}
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	return max(1, int64(math.Ceil(d.Seconds())))
}

// writeRateLimited answers a request over the RateLimit window.
func (h *Handler) writeRateLimited(w http.ResponseWriter, lim limitState, model string) {
	switch h.dialect {
	case dlAnthropic:
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(lim.reset), 10))
		writeBody(w, http.StatusTooManyRequests, anthropicRateLimitError(lim, h.window()))
	case dlGemini:
		writeBody(w, http.StatusTooManyRequests, geminiWindowQuotaError(lim, model))
	case dlBedrock:
		msg := bedrockTooManyRequests
		if lim.exceeded == "tokens" {
			msg = bedrockTooManyTokens
		}
		writeBedrockError(w, http.StatusTooManyRequests, "ThrottlingException"+bedrockCoral, msg)
	case dlVertex:
		quota := vertexRequestsPerMinute
		if lim.exceeded == "tokens" {
			quota = vertexTokensPerMinute
		}
		writeBody(w, http.StatusTooManyRequests, vertexQuotaError(http.StatusTooManyRequests, QuotaPerMinute, quota, model, lim.reset))
	default:
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(lim.reset), 10))
		writeError(w, http.StatusTooManyRequests, "Rate limit reached for "+lim.exceeded, lim.exceeded, "rate_limit_exceeded")
	}
}
