// Package capacity holds what is known about each deployment's rate limits
// and health: the State that folds every attempt's provider.Observation
// into a circuit, rate-limit windows, declared limits and health, and the
// Policy that turns failures into waits.
//
// It imports nothing of Caddy; time is always passed in, so callers
// control the clock.
package capacity

import (
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

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
	n = max(n, 1)
	d := p.BackoffBase
	for i := 1; i < n && d < p.BackoffMax; i++ {
		d *= 2
	}
	if p.BackoffMax > 0 {
		d = min(d, p.BackoffMax)
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
//   - too_large: 0 (the request can never fit; smaller ones still do);
//   - ok: until the reset of an exhausted window (a success saying
//     "remaining 0" predicts the next 429), else 0.
func (p Policy) Cooldown(o provider.Observation, n int) time.Duration {
	var d time.Duration
	switch o.Class {
	case provider.RateLimited:
		d = max(o.RetryAfter, exhaustedReset(o), p.Backoff(n))
	case provider.QuotaExhausted:
		d = exhaustedReset(o)
		if d <= 0 {
			d = p.Long
		}
	case provider.Auth:
		d = p.Long
	case provider.Overloaded, provider.Server, provider.Transport:
		d = max(o.RetryAfter, p.Backoff(n))
	case provider.TooLarge:
		d = 0
	default:
		d = exhaustedReset(o)
	}
	return min(max(d, 0), provider.MaxCooldown)
}

// exhaustedReset is the latest reset of o's exhausted windows, Unknown when
// none is exhausted.
func exhaustedReset(o provider.Observation) time.Duration {
	var d time.Duration = provider.Unknown
	if o.Requests.Exhausted() {
		d = o.Requests.Reset
	}
	if o.Tokens.Exhausted() {
		d = max(d, o.Tokens.Reset)
	}
	return d
}
