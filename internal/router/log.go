package router

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// unpredicted notes a 429 the budget let through: the provider's count was
// the truth (Observe corrected the budget), the router's was not.
func (r *Router) unpredicted(out *outcome) {
	if r.Observer != nil {
		r.Observer.Unpredicted(out.d)
	}
	r.debug("rate-limited although the budget had room",
		zap.String("deployment", out.d.Name), zap.Int64("believed_requests", out.claim.Requests),
		zap.Int64("believed_tokens", out.claim.Tokens), zap.String("message", out.obs.Message))
}

// noteFailure keeps a failed attempt to be logged when what follows it is
// known (logPending): another attempt, or none. A bad key or a spent quota
// is an operator's problem: logged at once instead, at error level, once,
// when its circuit opens (logDisabled).
func (r *Router) noteFailure(w *walk, out *outcome, observed capacity.Observed) {
	if r.logDisabled(out.d, out.obs, observed) {
		return
	}
	switch out.obs.Class {
	case provider.Auth, provider.QuotaExhausted:
		return // logged when its circuit opened
	}
	w.pending = out
}

// logDisabled logs, at error level, a deployment whose circuit a bad key or
// a spent quota just opened, and reports whether obs is of that kind.
func (r *Router) logDisabled(d *Deployment, obs provider.Observation, observed capacity.Observed) bool {
	if obs.Class != provider.Auth && obs.Class != provider.QuotaExhausted {
		return false
	}
	if observed.Opened {
		r.Logger.Error("deployment disabled: the provider rejects our key or the quota is spent",
			zap.String("deployment", d.Name), zap.Stringer("class", obs.Class), zap.String("message", obs.Message),
			zap.Duration("for", observed.Cooldown),
			zap.String("to_clear", "once fixed: POST /llm_router/deployments/"+d.Name+"/reset on the admin endpoint (or reload with a new key); else it is tried again after this wait"))
	}
	return true
}

// logPending logs the failed attempt noted last, now that what follows is
// known: next is the deployment of the next attempt, nil when none follows.
func (r *Router) logPending(w *walk, next *Deployment) {
	out := w.pending
	if out == nil {
		return
	}
	w.pending = nil
	if !r.Logger.Core().Enabled(zapcore.InfoLevel) {
		return
	}
	fields := []zap.Field{zap.String("deployment", out.d.Name), zap.String("url", out.url), zap.Stringer("class", out.obs.Class),
		zap.Int("status", out.status), zap.String("message", out.obs.Message)}
	if out.obs.Message == "" && len(out.body) > 0 {
		// Nothing decoded: the first bytes of what the provider sent.
		fields = append(fields, zap.ByteString("body", out.body[:min(len(out.body), logBodyBytes)]))
	}
	switch {
	case next == nil:
		r.Logger.Info("attempt failed, no other attempt follows", fields...)
	case next == out.d:
		r.Logger.Info("attempt failed, trying the same deployment again", fields...)
	default:
		r.Logger.Info("attempt failed, failing over", append(fields, zap.String("to", next.Name))...)
	}
}

// logBodyBytes is how much of an undecodable error body a log line shows.
const logBodyBytes = 256

func (r *Router) debug(msg string, fields ...zap.Field) {
	if ce := r.Logger.Check(zapcore.DebugLevel, msg); ce != nil {
		ce.Write(fields...)
	}
}
