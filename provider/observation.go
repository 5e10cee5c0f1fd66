package provider

import "time"

// Unknown marks a count or duration that the provider did not state.
// Unknown is not zero: a missing x-ratelimit-remaining-requests header means
// "not said", never "no requests left".
const Unknown = -1

// MaxCooldown bounds any wait decoded from a provider (a Retry-After of a
// billion seconds is garbage, not advice). 8 days covers daily quotas and
// weekly windows (Anthropic's 7-day unified limit).
const MaxCooldown = 8 * 24 * time.Hour

// Class is the error class of one attempt, decided by the provider type
// (Provider.Observe) and acted on by the router.
type Class uint8

// The error classes. OK is a usable answer.
const (
	OK             Class = iota
	RateLimited          // 429 rate_limit_exceeded and kin: avoid until reset, try another deployment
	QuotaExhausted       // insufficient_quota, spend limit, 402: avoid for long
	Overloaded           // 503, 529, Groq 498: transient, try another deployment
	Server               // other 5xx, a 200 that is no answer: transient
	Transport            // refused, reset, TLS, timeout before headers: transient
	Auth                 // 401/403 from the provider: our key is bad, avoid for long
	ContextLength        // prompt too long for this deployment: try a larger context window
	ClientError          // any other 4xx: the client's fault, returned as is
	// TooLarge: the request is larger than a rate-limit window's whole
	// limit (OpenAI's 429 "Request too large ... Limit 30000, Requested
	// 36278"), so no wait lets it through; the deployment is not out of
	// capacity for smaller ones. Try one whose window is larger; Tokens.Limit
	// holds the limit when stated.
	TooLarge
)

var classNames = [...]string{
	OK:             "ok",
	RateLimited:    "rate_limited",
	QuotaExhausted: "quota_exhausted",
	Overloaded:     "overloaded",
	Server:         "server",
	Transport:      "transport",
	Auth:           "auth",
	ContextLength:  "context_length",
	ClientError:    "client_error",
	TooLarge:       "too_large",
}

// String returns the class name used in logs, metrics, the admin API and
// fixtures ("rate_limited", "quota_exhausted", ...).
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "unknown"
}

// MarshalText writes the class's name, so that JSON shows "rate_limited".
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// ParseClass is the inverse of String; ok is false for an unknown name.
func ParseClass(s string) (Class, bool) {
	for i, n := range classNames {
		if n == s {
			return Class(i), true
		}
	}
	return 0, false
}

// Transient reports whether another attempt (elsewhere, or later) may succeed.
func (c Class) Transient() bool {
	switch c {
	case RateLimited, Overloaded, Server, Transport:
		return true
	}
	return false
}

// Failure reports whether the class counts against the deployment's health.
func (c Class) Failure() bool {
	switch c {
	case OK, ContextLength, ClientError, TooLarge:
		return false
	}
	return true
}

// Window is what one response said about one rate-limit window (requests or
// tokens). Every field is Unknown when the provider did not state it.
type Window struct {
	// Limit is the window's size (requests or tokens).
	Limit int64
	// Remaining is what is left in the window now.
	Remaining int64
	// Reset is how long after the response the window refreshes.
	Reset time.Duration
	// Instant says that the provider stated Reset as an instant (an RFC
	// 3339 time, a Unix time), which Observe turned into a duration from
	// the time it was given: exact but for clock skew. False for a
	// countdown ("9.8s", "6m0s", seconds), which the provider computed when
	// it admitted the request, some time between the attempt's send and
	// its first byte: the router anchors it to that interval.
	Instant bool
	// BoundsRequest says that the provider admits a request only when its
	// own estimate of it (prompt plus max_tokens) fits the window's whole
	// Limit, so that a larger one is refused however long it waits
	// (OpenAI's tokens per minute, whose 429 says "Request too large").
	// False when not known: a window may count less than that (Anthropic's
	// most restrictive token window may be its output tokens).
	BoundsRequest bool
	// Resolution is the unit the provider stated Reset in (1 s for "8s",
	// "8" or an RFC 3339 time without a fraction; 0 when finer than a
	// millisecond; see ParseResetInstant): a provider that rounds, down
	// or up, puts the true reset up to that much from the stated one.
	Resolution time.Duration
	// Counts is what a token window counts of an attempt (CountsAll, the
	// zero value, when the provider type does not say).
	Counts Counts
	// Passed is, for a reset stated as an instant that had already passed
	// when the answer was given (Reset 0), how long before it (the Date
	// header, see RefTime) that instant was; 0 otherwise. Anthropic
	// states its resets as RFC 3339 instants in whole seconds, so that an
	// answer read after a generation longer than the wait still says
	// when the window was full again: between the attempt's send and its
	// read, not at the read.
	Passed time.Duration
}

// Counts is what a provider's token window counts of one attempt, as the
// router estimates it at admission: its prompt (of which some tokens may
// be read from the prompt cache) and its output (max_tokens).
type Counts uint8

const (
	// CountsAll: the whole prompt, cache reads included, plus the output
	// (OpenAI's tokens per minute; the safe side for an unknown window).
	CountsAll Counts = iota
	// CountsUncached: the prompt less its cache reads, plus the output
	// (Anthropic's combined tokens window, the most restrictive of its
	// input and output windows, neither of which counts cache reads).
	CountsUncached
	// CountsUncachedInput: the prompt less its cache reads; cache writes
	// count (Anthropic's input tokens per minute: PROVIDERS.md, and
	// https://docs.anthropic.com/en/api/rate-limits#cache-aware-itpm).
	CountsUncachedInput
	// CountsOutput: the output alone, estimated from max_tokens at
	// admission (Anthropic's output tokens per minute).
	CountsOutput
)

// UnknownWindow is a Window with nothing stated.
var UnknownWindow = Window{Limit: Unknown, Remaining: Unknown, Reset: Unknown}

// Exhausted reports whether the window says nothing is left and when that ends.
func (w Window) Exhausted() bool { return w.Remaining == 0 && w.Reset > 0 }

// Observation is what a provider type decoded from one response (or
// transport failure): the error class, the rate-limit windows and any
// stated wait.
type Observation struct {
	Class    Class
	Requests Window
	Tokens   Window
	// RetryAfter is the wait the provider asked for: Retry-After (seconds or
	// HTTP-date), retry-after-ms, a body retry delay or a "try again in 20s"
	// hint. Unknown when none was given.
	RetryAfter time.Duration
	// Message is the provider's error message, for logs and for the client
	// when the error is passed on (never a key).
	Message string
	// Code is the provider's own machine-readable error code, when it
	// states one ("content_policy_violation", "INVALID_ARGUMENT",
	// "enforced_spend_limit_reached"); a client API that restates the error
	// may pass it on.
	Code string
}

// NewObservation returns an Observation of class c with nothing else known.
func NewObservation(c Class) Observation {
	return Observation{Class: c, Requests: UnknownWindow, Tokens: UnknownWindow, RetryAfter: Unknown}
}
