package router

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Error is a failure the router answers itself (not a provider's answer
// passed on). Client APIs write it in their format, with x-should-retry:
// false (the router already walked the deployments within the deadline),
// and RetryAfter as Retry-After:
//
//   - 400 client_error: no deployment could express the request (Message
//     says why); no Retry-After;
//   - 400 context_length: the request's estimate is larger than every
//     deployment's context window (the pre-check: no attempt was made); no
//     Retry-After;
//   - 413 client_error: the request is larger than the token rate limit
//     of every deployment that could take it (a provider's too_large, or
//     a stated limit known to bound a request, capacity.State.FitsTokens):
//     no wait lets it through; no Retry-After;
//   - 429 rate_limited (quota_exhausted for a spent budget): every
//     deployment is rate-limited or out of quota; Retry-After until the
//     earliest reset (or the budget's renewal);
//   - 502 server: every deployment failed, or is cooling down after
//     failures; Retry-After, when they cool, until the first comes back by
//     itself (a reset, a failing circuit's next probe), none when only keys
//     their providers refused hold them out, or when attempts ran out;
//   - 503 server: every deployment is disabled by its operator; no
//     Retry-After;
//   - 504 transport: the deadline passed; no Retry-After.
type Error struct {
	Status  int
	Class   provider.Class
	Message string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds): a
	// real wait until capacity may be back, never a guess; 0: none.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// ErrClientGone is returned when the client's context ended the request.
var ErrClientGone = errors.New("client went away")

// giveUp ends a request whose attempts or eligible deployments ran out.
func (r *Router) giveUp(res *Result, w *walk, group []*Deployment, now time.Time, req *Request) *Result {
	switch {
	case w.last != nil && w.last.obs.Class == provider.ContextLength && !r.largerWindowLeft(w, group, req):
		return res.passOn(w.last, w) // the provider's 400, as it is: no deployment could take the prompt
	case w.last == nil && w.budget != nil:
		return res.fail(w.budget.error(now), w)
	case w.last == nil && w.unplanned != nil:
		return res.fail(&Error{Status: http.StatusBadRequest, Class: provider.ClientError, Message: w.unplanned.obs.Message}, w)
	case w.last == nil || w.last.obs.Class == provider.TooLarge:
		if e := sizeError(group, w, req); e != nil {
			return res.fail(e, w)
		}
	}
	return res.fail(r.finalError(w, group, now, req), w)
}

// sizeError is the refusal of a request too large for every deployment
// that serves its format, nil unless each was left out for its size: a 413
// when the token window of one of them can never admit it (its stated
// limit, or the provider's too_large), naming the largest such limit; else
// a 400 when their context windows are all too small (the pre-check,
// before any attempt). Neither is worth a retry: the client is told so.
func sizeError(group []*Deployment, w *walk, req *Request) *Error {
	largest, limit, windows, any := int64(0), int64(provider.Unknown), false, false
	for i, d := range group {
		if !req.servedBy(d) {
			continue
		}
		switch p := w.per[i]; {
		case p.tooLarge:
			_, l := d.stateFor(req).FitsTokens(req.Tokens)
			windows, limit = true, max(limit, l)
		case p.tooSmall:
			largest = max(largest, d.ContextWindow)
		default:
			return nil
		}
		any = true
	}
	switch {
	case !any:
		return nil
	case windows:
		msg := "this request is larger than the token rate limit of every deployment of this model"
		if limit > 0 {
			msg += fmt.Sprintf(" (the largest: %d tokens, prompt plus max_tokens)", limit)
		}
		return &Error{Status: http.StatusRequestEntityTooLarge, Class: provider.ClientError,
			Message: msg + "; no wait lets it through: reduce the prompt or max_tokens"}
	}
	return &Error{Status: http.StatusBadRequest, Class: provider.ContextLength,
		Message: contextMessage(req, "this model", largest)}
}

// contextMessage is the message of a context pre-check's 400: the
// request's size (its exact count where one was made, else the
// estimate) and the largest window of whom.
func contextMessage(req *Request, of string, largest int64) string {
	about, need, how := "about", req.Tokens, "its prompt, estimated"
	if c := req.exact.Load(); c != nil {
		need, how = c.n+req.OutputTokens, "its prompt, counted"
		if !c.complete {
			about = "more than"
		}
	}
	return fmt.Sprintf("this request needs %s %d tokens (%s, plus max_tokens), more than the context window of every deployment of %s (the largest: %d tokens)",
		about, need, how, of, largest)
}

// largerWindowLeft reports whether a deployment that may take a prompt too
// long for the last one (a larger or unknown context window) is still in
// the running, only busy or limited for now: then the request failed for
// capacity, not for its length.
func (r *Router) largerWindowLeft(w *walk, group []*Deployment, req *Request) bool {
	for i, d := range group {
		if !w.per[i].excluded && req.servedBy(d) && (d.ContextWindow == 0 || d.ContextWindow > w.minContext) {
			return true
		}
	}
	return false
}

func deadlineError() *Error {
	return &Error{Status: http.StatusGatewayTimeout, Class: provider.Transport,
		Message: "no deployment answered before the request deadline"}
}

// retryAfterSeconds rounds a wait up to whole seconds, at least 1. The
// margin the budget adds to a stated reset (capacity.ResetMargin) is the
// router's own caution: a client told the provider's second is queued for
// those milliseconds, not sent a second later.
func retryAfterSeconds(d time.Duration) time.Duration {
	s := max(1, int64(math.Ceil((d - capacity.ResetMargin).Seconds())))
	return time.Duration(s) * time.Second
}

// rateLimitedError is the 429 of a group whose deployments are all
// rate-limited or out of quota, the earliest back after wait.
func rateLimitedError(wait time.Duration) *Error {
	return &Error{Status: http.StatusTooManyRequests, Class: provider.RateLimited,
		Message:    "every deployment of this model is rate-limited or out of quota; retry after the given time",
		RetryAfter: retryAfterSeconds(wait)}
}

// coolingError answers when every eligible deployment is cooling past the
// deadline: 429 when they are all rate-limited or out of quota, with
// Retry-After until the earliest reset; else 502, with Retry-After until
// the earliest comes back by itself (backAfter). A deployment only busy
// (slow start: the router's own pacing, not a provider's limit) makes it a
// 504: the request ran out of time.
func coolingError(cands []scored, first scored, now time.Time) *Error {
	for _, c := range cands {
		if c.f.Why == provider.OK {
			return deadlineError()
		}
	}
	for _, c := range cands {
		if c.f.Why != provider.RateLimited && c.f.Why != provider.QuotaExhausted {
			return failingError(cands, backAfter(cands, now))
		}
	}
	return rateLimitedError(first.f.At.Sub(now))
}

// keysRefusedMessage is the 502's message when only keys their providers
// refused (class auth) hold a group's deployments out.
const keysRefusedMessage = "every deployment of this model is out: its provider refused the router's key for it (401 or 403); an operator must fix the key, and a retry does not help"

// failingError is the 502 of a group whose deployments are all out for
// failures, with Retry-After retry (0: none). Its message says whether a
// retry may help: when only keys their providers refused (class auth)
// hold them out, an operator must act, and no retry does.
func failingError(cands []scored, retry time.Duration) *Error {
	msg := "every deployment of this model is failing; retry later"
	keys := true
	for _, c := range cands {
		if c.f.Why != provider.Auth && c.f.Why != provider.RateLimited && c.f.Why != provider.QuotaExhausted {
			keys = false
		}
	}
	switch {
	case keys && retry <= 0:
		msg = keysRefusedMessage
	case retry <= 0:
		msg = "every deployment of this model is failing"
	}
	return &Error{Status: http.StatusBadGateway, Class: provider.Server, Message: msg, RetryAfter: retry}
}

// backAfter is the Retry-After of a group whose deployments all cool: the
// wait until the first that comes back by itself does (a window's reset, a
// failing circuit's next probe, in whole seconds), 0 (none) when only keys
// their providers refused hold them out: an operator brings those back,
// and the hour the router waits before it asks again promises nothing.
func backAfter(cands []scored, now time.Time) time.Duration {
	var at time.Time
	for _, c := range cands {
		if c.f.Why != provider.Auth && c.f.At.After(now) && (at.IsZero() || c.f.At.Before(at)) {
			at = c.f.At
		}
	}
	if at.IsZero() {
		return 0
	}
	return retryAfterSeconds(at.Sub(now))
}

// finalError answers when attempts or eligible deployments ran out, with
// what the request learned: a 429, with Retry-After until the earliest
// known reset, when every attempt met a rate limit or a spent quota, or
// every deployment is known to be limited now; else a 502. The message says
// how many deployments were tried when not all were (max_attempts, or
// those that could not take the request), and that no retry helps when
// every deployment refused the router's key (keysRefusedMessage).
func (r *Router) finalError(w *walk, group []*Deployment, now time.Time, req *Request) *Error {
	if w.last == nil {
		drained := false
		for _, d := range group {
			if req.servedBy(d) {
				if drained = d.State.Disabled(); !drained {
					break
				}
			}
		}
		if drained {
			return &Error{Status: http.StatusServiceUnavailable, Class: provider.Server,
				Message: "every deployment of this model is disabled by its operator; retry later"}
		}
		return &Error{Status: http.StatusBadGateway, Class: provider.Server,
			Message: "no deployment could serve this request"}
	}
	tried := 0
	for _, p := range w.per {
		if p.tried {
			tried++
		}
	}
	earliest, allLimited := time.Time{}, true
	for _, d := range group {
		at, why := d.stateFor(req).AvailableAt(now, req.Tokens)
		if why != provider.RateLimited && why != provider.QuotaExhausted || !at.After(now) {
			allLimited = false
			continue
		}
		if earliest.IsZero() || at.Before(earliest) {
			earliest = at
		}
	}
	if w.limited == w.failures || allLimited {
		if allLimited || tried == len(group) {
			return rateLimitedError(earliest.Sub(now))
		}
		e := rateLimitedError(earliest.Sub(now))
		e.Message = fmt.Sprintf("the deployments tried (%d of %d) are rate-limited or out of quota; retry after the given time",
			tried, len(group))
		return e
	}
	msg := "every deployment of this model failed; retry later"
	if w.refusedKey == w.failures && tried == len(group) {
		msg = keysRefusedMessage
	} else if tried < len(group) {
		msg = fmt.Sprintf("the deployments tried (%d of %d) failed; retry later", tried, len(group))
	}
	return &Error{Status: http.StatusBadGateway, Class: provider.Server, Message: msg}
}
