package adapters

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/excerpt"
	"github.com/llmrouter/caddy-llm-router/internal/wire/messages"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Anthropic speaks Anthropic's Messages API
// (https://docs.anthropic.com/en/api/messages): requests go to BaseURL +
// "/messages" (BaseURL such as "https://api.anthropic.com/v1") with
// "x-api-key: <key>" and "anthropic-version: 2023-06-01". A Messages
// request goes as the client wrote it (a native pass: only the model
// replaced, the client's anthropic-version and anthropic-beta kept), and
// its answer or stream comes back as Anthropic sent it, losing nothing to
// translation (prompt caching, thinking, server tools). Other formats go
// through their Chat form, translated to a Messages request, and their
// answers and streams are translated back (package wire/messages).
//
// Capacity (https://docs.anthropic.com/en/api/rate-limits):
// anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset},
// resets as RFC 3339 instants read against the Date header; the token
// window reported is the tightest of the three token windows (by the share
// left; the combined tokens window on a tie, which the docs say is already
// the most restrictive limit in effect), and retry-after in seconds. The
// window says what it counts (provider.Window.Counts): cache reads count
// in none of them (PROVIDERS.md), the input window counts the uncached
// prompt, the output window max_tokens.
//
// Error classes (https://docs.anthropic.com/en/api/errors): 429
// rate_limit_error is rate_limited, unless it is the monthly spend limit
// (error_code enforced_spend_limit_reached); 529 overloaded_error
// overloaded; 401 authentication_error and 403 permission_error auth;
// 402 billing_error, "credit balance is too low" and spend limits
// quota_exhausted; 400 "prompt is too long" context_length; other 4xx
// client_error; 404 not_found_error (this deployment's model or base_url
// is wrong), 500 api_error, 504 timeout_error and other 5xx server.
// Errors inside a stream (which began with a 200) are classified by their
// type alone.
type Anthropic struct {
	Endpoint provider.Endpoint
}

// Serves implements provider.Provider: Chat, and Messages and Responses
// (natively or through their Chat form: chatFormats); no embeddings, no
// legacy completions.
func (*Anthropic) Serves(f provider.Format) bool { return slices.Contains(chatFormats, f) }

// Plan implements provider.Provider: the Claude plan (planClaude). A
// translated request fails when it holds what the Messages API cannot
// express (see messages.FromChat).
func (p *Anthropic) Plan(ctx context.Context, model string, r *provider.Request) (provider.Plan, error) {
	if r.Format == provider.Embeddings {
		return nil, errNoEmbeddings
	}
	return planClaude(ctx, p, model, r)
}

// CountTokensRequest implements provider.TokenCounter: POST
// {base_url}/messages/count_tokens with the upstream model, the key, and
// the client's API version and beta features.
func (p *Anthropic) CountTokensRequest(ctx context.Context, model string, body []byte, header http.Header) (*http.Request, error) {
	body, err := provider.SetModel(body, model)
	if err != nil {
		return nil, err
	}
	req, err := p.postTo(ctx, "/messages/count_tokens", body, false)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	return req, nil
}

// post builds a POST of a Messages body with the provider's key and API
// version; nothing of the client's.
func (p *Anthropic) post(ctx context.Context, body []byte, stream bool) (*http.Request, error) {
	return p.postTo(ctx, "/messages", body, stream)
}

func (p *Anthropic) postTo(ctx context.Context, op string, body []byte, stream bool) (*http.Request, error) {
	req, err := p.Endpoint.NewRequest(ctx, p.Endpoint.BaseURL+op, body, stream, anthropicKey.name, anthropicKey.prefix)
	if err != nil {
		return nil, err
	}
	if req.Header.Get("Anthropic-Version") == "" {
		req.Header.Set("Anthropic-Version", messages.Version)
	}
	return req, nil
}

// anthropicReader reads Messages answers and streams: passed on as they
// come (native) or translated to Chat.
type anthropicReader struct{ native bool }

func (a anthropicReader) answer(p *plan, body []byte) ([]byte, error) {
	chat, err := messages.ToChatAnswer(body)
	if err != nil {
		return nil, err
	}
	if a.native {
		return body, nil // checked by translating, passed on as it came
	}
	return withModel(chat, p.model), nil
}

func (a anthropicReader) decoder(*plan) provider.EventDecoder {
	return messages.NewChatDecoder(a.native, streamError)
}

// streamError classifies an error event inside a stream, which began with
// a 200: by its type alone.
func streamError(d messages.ErrorDetail) provider.Observation {
	o := provider.NewObservation(classifyAnthropic(0, d))
	o.Message, o.Code = excerpt.Of(d.Message, 500), d.Code()
	if o.Message == "" {
		o.Message = d.Type
	}
	return o
}

// Observe implements provider.Provider.
func (*Anthropic) Observe(status int, h http.Header, body []byte, now time.Time) provider.Observation {
	ref := provider.RefTime(h, now)
	o := provider.NewObservation(provider.OK)
	o.Requests = anthropicWindow(h, "requests", ref, provider.CountsAll)
	o.Tokens = tightestShare(
		anthropicWindow(h, "tokens", ref, provider.CountsUncached),
		anthropicWindow(h, "input-tokens", ref, provider.CountsUncachedInput),
		anthropicWindow(h, "output-tokens", ref, provider.CountsOutput),
	)
	o.RetryAfter = provider.RetryAfter(h, ref)
	wait, rejected := unifiedRejected(h, ref)
	if wait > o.RetryAfter {
		o.RetryAfter = wait
	}
	if status >= 200 && status < 300 {
		return o
	}
	e := parseAnthropicError(body)
	o.Message, o.Code = e.Message, e.Code()
	o.Class = classifyAnthropic(status, e)
	if rejected && o.RetryAfter < 0 && o.Class == provider.RateLimited {
		// The account is refused with no wait stated: a quota, not a
		// rate limit to retry within seconds.
		o.Class = provider.QuotaExhausted
	}
	if o.RetryAfter < 0 && o.Class.Transient() {
		o.RetryAfter = provider.MessageHint(e.Message)
	}
	return o
}

// unifiedRejected reads the unified rate limits of a subscription account:
// when anthropic-ratelimit-unified-status is "rejected", the account is
// refused until the latest reset among the overall one
// (anthropic-ratelimit-unified-reset) and those of its rejected windows
// (anthropic-ratelimit-unified-{5h,7d,...}-{status,reset}; the windows are
// all enforced), as Unix seconds or milliseconds or RFC 3339; wait is
// provider.Unknown when none is stated. The overage window's own status
// does not refuse ordinary use, nor does "allowed_warning". Sources:
// fixtures anthropic-429-unified-*.http.
func unifiedRejected(h http.Header, ref time.Time) (wait time.Duration, rejected bool) {
	if !strings.EqualFold(strings.TrimSpace(h.Get("Anthropic-Ratelimit-Unified-Status")), "rejected") {
		return provider.Unknown, false
	}
	wait = provider.ParseReset(h.Get("Anthropic-Ratelimit-Unified-Reset"), ref)
	for k, vs := range h {
		lower := strings.ToLower(k)
		if len(vs) == 0 || !strings.HasPrefix(lower, "anthropic-ratelimit-unified-") || !strings.HasSuffix(lower, "-status") ||
			strings.Contains(lower, "overage") || !strings.EqualFold(strings.TrimSpace(vs[0]), "rejected") {
			continue
		}
		if d := provider.ParseReset(h.Get(k[:len(k)-len("status")]+"reset"), ref); d > wait {
			wait = d
		}
	}
	return wait, true
}

// anthropicWindow reads anthropic-ratelimit-<kind>-{limit,remaining,reset},
// a window that counts what counts says when anything of it is stated.
func anthropicWindow(h http.Header, kind string, ref time.Time, counts provider.Counts) provider.Window {
	w := provider.UnknownWindow
	prefix := "Anthropic-Ratelimit-" + kind + "-"
	if v := h.Get(prefix + "Limit"); v != "" {
		w.Limit = provider.ParseCount(v)
	}
	if v := h.Get(prefix + "Remaining"); v != "" {
		w.Remaining = provider.ParseCount(v)
	}
	if v := h.Get(prefix + "Reset"); v != "" {
		w.SetReset(v, ref)
	}
	if w != provider.UnknownWindow {
		w.Counts = counts
	}
	return w
}

// tightestShare returns the window with the smallest share left
// (remaining/limit): an exhausted one first (the later reset among
// several), the first one on a tie.
func tightestShare(ws ...provider.Window) provider.Window {
	best, bestShare := provider.UnknownWindow, 4.0
	for _, w := range ws {
		var share float64
		switch {
		case w == provider.UnknownWindow:
			share = 3
		case w.Remaining < 0:
			share = 2 // a limit or reset without the count left
		case w.Remaining == 0:
			share = 0
		case w.Limit > 0:
			share = min(float64(w.Remaining)/float64(w.Limit), 1)
		default:
			share = 1
		}
		if share < bestShare || share == 0 && bestShare == 0 && w.Reset > best.Reset {
			best, bestShare = w, share
		}
	}
	return best
}

// parseAnthropicError reads {"type":"error","error":{"type","message"}};
// anything else (a proxy's HTML page) keeps its start as the message.
func parseAnthropicError(body []byte) messages.ErrorDetail {
	var top struct {
		Error json.RawMessage `json:"error"`
	}
	if decodeJSON(body, &top) != nil || len(top.Error) == 0 {
		return messages.ErrorDetail{Message: bodyText(body)}
	}
	var e messages.ErrorDetail
	if decodeJSON(top.Error, &e) != nil || e.Type == "" && e.Message == "" {
		var s string
		if json.Unmarshal(top.Error, &s) == nil {
			return messages.ErrorDetail{Message: excerpt.Of(s, 500)}
		}
		return messages.ErrorDetail{Message: excerpt.Of(string(top.Error), 200)}
	}
	e.Message = excerpt.Of(e.Message, 500)
	return e
}

// classifyAnthropic maps a status (0 inside a stream) and an error to a
// class. The error type wins over the status: a 200 stream's error event
// is an overload, not a success.
func classifyAnthropic(status int, e messages.ErrorDetail) provider.Class {
	typ, msg := e.Type, strings.ToLower(e.Message)
	switch {
	case typ == "billing_error" || status == http.StatusPaymentRequired ||
		e.Code() == "enforced_spend_limit_reached" ||
		strings.Contains(msg, "credit balance") || strings.Contains(msg, "spend limit"):
		return provider.QuotaExhausted
	case typ == "rate_limit_error" || status == http.StatusTooManyRequests:
		return provider.RateLimited
	case typ == "overloaded_error" || status == 529 || status == http.StatusServiceUnavailable:
		return provider.Overloaded
	case typ == "authentication_error" || typ == "permission_error" ||
		status == http.StatusUnauthorized || status == http.StatusForbidden:
		return provider.Auth
	case (typ == "invalid_request_error" || status >= 400 && status < 500) &&
		(isContextLength("", msg) || strings.Contains(msg, "exceed context limit")):
		return provider.ContextLength
	case typ == "api_error" || typ == "timeout_error" || typ == "not_found_error" ||
		status >= 500 || status == http.StatusRequestTimeout || status == http.StatusNotFound:
		// A 404 names this deployment's model or base_url wrong (a retired
		// model, a typo): its failure, not the client's, as for openai.
		return provider.Server
	case typ == "invalid_request_error" || typ == "request_too_large" || status >= 400 && status < 500:
		return provider.ClientError
	}
	return provider.Server
}
