// Package capacity holds what is known about each deployment's rate limits
// and health: the provider-agnostic Observation an adapter decodes from one
// response, and the State that accumulates observations per deployment.
//
// It imports nothing of this project and nothing of Caddy; time is always
// passed in, so callers control the clock.
package capacity

import "time"

// Unknown marks a count or duration that the provider did not state.
// Unknown is not zero: a missing x-ratelimit-remaining-requests header means
// "not said", never "no requests left".
const Unknown = -1

// MaxCooldown bounds any wait decoded from a provider (a Retry-After of a
// billion seconds is garbage, not advice). 24 hours covers daily quotas.
const MaxCooldown = 24 * time.Hour

// Class is the error class of one attempt, decided by the adapter and acted
// on by the router (see DESIGN.md, "Error classes").
type Class uint8

// The error classes. OK is a usable answer.
const (
	OK             Class = iota
	RateLimited          // 429 rate_limit_exceeded and kin: avoid until reset, try another deployment
	QuotaExhausted       // insufficient_quota, spend limit, 402: avoid for long
	Overloaded           // 503, 529, Groq 498: transient, try another deployment
	Server               // other 5xx: transient
	Transport            // refused, reset, TLS, timeout before headers: transient
	Auth                 // 401/403 from the provider: our key is bad, avoid for long
	ContextLength        // prompt too long for this deployment: try a larger context window
	ClientError          // any other 4xx: the client's fault, returned as is
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
}

// String returns the class name used in logs, metrics and fixtures
// ("rate_limited", "quota_exhausted", ...).
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "unknown"
}

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
	case OK, ContextLength, ClientError:
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
}

// UnknownWindow is a Window with nothing stated.
var UnknownWindow = Window{Limit: Unknown, Remaining: Unknown, Reset: Unknown}

// Exhausted reports whether the window says nothing is left and when that ends.
func (w Window) Exhausted() bool { return w.Remaining == 0 && w.Reset > 0 }

// Observation is what an adapter decoded from one response (or transport
// failure): the error class, the rate-limit windows and any stated wait.
type Observation struct {
	Class    Class
	Requests Window
	Tokens   Window
	// RetryAfter is the wait the provider asked for: Retry-After (seconds or
	// HTTP-date), retry-after-ms, a body retry delay or a "try again in 20s"
	// hint. Unknown when none was given.
	RetryAfter time.Duration
	// Message is the provider's error message, for logs (never a key).
	Message string
}

// NewObservation returns an Observation of class c with nothing else known.
func NewObservation(c Class) Observation {
	return Observation{Class: c, Requests: UnknownWindow, Tokens: UnknownWindow, RetryAfter: Unknown}
}

// Policy says how observations turn into waits.
type Policy struct {
	// BackoffBase is the floor of every wait after a failure, doubled per
	// consecutive failure: BackoffBase * 2^(n-1).
	BackoffBase time.Duration
	// BackoffMax caps the exponential backoff (not a provider-stated reset).
	BackoffMax time.Duration
	// Long is how long quota and auth failures keep a deployment out when the
	// provider states no reset.
	Long time.Duration
}

// DefaultPolicy matches the Caddyfile defaults: 500ms base, 30s cap, 1h long.
var DefaultPolicy = Policy{BackoffBase: 500 * time.Millisecond, BackoffMax: 30 * time.Second, Long: time.Hour}

// Backoff returns BackoffBase * 2^(n-1), capped at BackoffMax; n < 1 counts as 1.
func (p Policy) Backoff(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := p.BackoffBase
	for i := 1; i < n && d < p.BackoffMax; i++ {
		d *= 2
	}
	if p.BackoffMax > 0 && d > p.BackoffMax {
		d = p.BackoffMax
	}
	return d
}

// Cooldown is how long the deployment must be avoided after o, for the n-th
// consecutive failure (n >= 1). Zero means usable at once.
//
//   - rate_limited: the longest of Retry-After and the reset of every exhausted
//     window, floored by the backoff (a Retry-After of 0 does not invite a
//     blind retry loop);
//   - quota_exhausted: the stated reset of an exhausted window, else Long;
//   - auth: Long;
//   - overloaded, server, transport: the longer of Retry-After and the backoff;
//   - ok: until the reset of an exhausted window (a success saying
//     "remaining 0" predicts the next 429), else 0.
func (o Observation) Cooldown(p Policy, n int) time.Duration {
	var d time.Duration
	switch o.Class {
	case RateLimited:
		d = max(o.RetryAfter, o.exhaustedReset(), p.Backoff(n))
	case QuotaExhausted:
		d = o.exhaustedReset()
		if d <= 0 {
			d = p.Long
		}
	case Auth:
		d = p.Long
	case Overloaded, Server, Transport:
		d = max(o.RetryAfter, p.Backoff(n))
	default:
		d = o.exhaustedReset()
	}
	return min(max(d, 0), MaxCooldown)
}

func (o Observation) exhaustedReset() time.Duration {
	var d time.Duration = Unknown
	if o.Requests.Exhausted() {
		d = o.Requests.Reset
	}
	if o.Tokens.Exhausted() {
		d = max(d, o.Tokens.Reset)
	}
	return d
}
