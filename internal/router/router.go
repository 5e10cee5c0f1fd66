// Package router ranks a model group's deployments and walks them: one
// attempt at a time, failing over at once on transient failures, waiting
// max(Retry-After, backoff) only when the next attempt must go to a
// deployment that is cooling down, all inside one deadline for the request.
//
// It imports neither Caddy nor the root package; time comes from an
// injected Clock.
package router

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Deployment is a provider x an upstream model: the unit that is ranked,
// rate-limited and failed over.
type Deployment struct {
	// Name identifies the deployment to clients and operators:
	// "<provider>/<upstream model>".
	Name string
	// Model is the upstream model name put in the request body.
	Model    string
	Adapter  adapters.Adapter
	Endpoint *adapters.Endpoint
	// Transport performs the upstream exchange (Caddy's HTTP transport).
	Transport http.RoundTripper
	// Timeout bounds one non-streaming attempt until its body is read.
	Timeout time.Duration
	// TTFTTimeout bounds a streaming attempt until its first event.
	TTFTTimeout time.Duration
	// IdleTimeout bounds the silence between two events of a stream.
	IdleTimeout time.Duration
	// CostInput and CostOutput are USD per 1M tokens; 0 = unknown.
	CostInput, CostOutput float64
	// Quality is the operator's judgment, 0..1.
	Quality float64
	// ContextWindow is the largest prompt plus output, in tokens; 0 = unknown.
	ContextWindow int64
	// Weight is a tie-breaker: higher first.
	Weight int
	// State is the deployment's capacity state, shared across requests and
	// config reloads.
	State *capacity.State
}

// Kind is what a request asks for.
type Kind uint8

const (
	// Chat is a Chat Completions request (streaming or not).
	Chat Kind = iota
	// Embeddings is an embeddings request; only deployments whose adapter
	// implements adapters.Embedder serve it.
	Embeddings
)

// Request is what the router needs of one client request.
type Request struct {
	// Kind is Chat unless set.
	Kind Kind
	// Body is the client's Chat Completions JSON body.
	Body []byte
	// Stream is the body's "stream".
	Stream bool
	// Tokens estimates prompt plus max_tokens, for token windows.
	Tokens int64
	// PromptTokens and OutputTokens (max_tokens; 0 when unset) price the
	// request for the cost feature.
	PromptTokens, OutputTokens int64
	// Choices is the body's "n" (default 1): a stream is complete once that
	// many choices have finished.
	Choices int
	// IncludeUsage is the body's stream_options.include_usage: a stream that
	// asked for usage is complete only once the usage chunk arrived.
	IncludeUsage bool
	// NativeFormat and NativeBody are the client's request as it came, when
	// its format is not Chat Completions ("anthropic"): deployments whose
	// adapter speaks that format natively (adapters.Native) get NativeBody,
	// and their answers pass through untranslated (Result.Native).
	NativeFormat string
	NativeBody   []byte
	// NativeHeader holds the client's headers of that format
	// (adapters.NativeHeaders), for native passes only.
	NativeHeader http.Header
}

// Router walks a model group's deployments for one request. The zero value
// is not usable: set every field (see New).
type Router struct {
	// Deadline is the wall-clock budget of one request, all attempts and
	// waits included (until the first byte of a stream reaches the client).
	Deadline time.Duration
	// MaxAttempts bounds upstream attempts per request.
	MaxAttempts int
	// Policy turns failures into waits (backoff base and cap, long cooldown).
	Policy capacity.Policy
	// Weights weigh the ranking's features (see Weights).
	Weights Weights
	// Rand returns a number in [0, 1) to share near-ties; safe for
	// concurrent use unless the router serves one request at a time.
	Rand     func() float64
	Clock    Clock
	Logger   *zap.Logger
	Observer Observer
}

// Observer is told about attempts as they happen (metrics). Calls must be
// cheap and safe for concurrent use.
type Observer interface {
	// Attempt reports one attempt's class and how long it took until its
	// answer was read (for a stream: until its first event of content).
	Attempt(d *Deployment, class provider.Class, took time.Duration)
	// FirstToken reports a stream's time to first content.
	FirstToken(d *Deployment, ttft time.Duration)
	// Failover reports a move to another attempt after a failure on from.
	Failover(from *Deployment, reason provider.Class)
}

// New returns a Router with the Caddyfile defaults: 60 s deadline, 4
// attempts, 500 ms..30 s backoff, the wall clock and a no-op logger.
func New() *Router {
	return &Router{
		Deadline:    60 * time.Second,
		MaxAttempts: 4,
		Policy:      capacity.DefaultPolicy,
		Weights:     DefaultWeights,
		Rand:        rand.Float64,
		Clock:       RealClock{},
		Logger:      zap.NewNop(),
	}
}

// Error is a failure the router answers itself (not a provider's answer
// passed on): the client sees Status and an error body of Type and Code.
type Error struct {
	Status  int
	Type    string // OpenAI error type: "rate_limit_error", "server_error", "timeout"
	Code    string // "rate_limit_exceeded", "upstream_unavailable", "deadline_exceeded"
	Message string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds).
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// ErrClientGone is returned when the client's context ended the request.
var ErrClientGone = errors.New("client went away")

// Result is the outcome of Serve.
type Result struct {
	// Deployment answered (nil if none did).
	Deployment *Deployment
	// Attempts is the number of upstream attempts made.
	Attempts int
	// FailoverReason is the class of the last failed attempt ("" when no
	// attempt failed), whether another deployment then answered or not.
	FailoverReason string

	// Status, Header and Body are the answer for a non-streaming success, or
	// a provider's client error passed on as it is.
	Status int
	Header http.Header
	Body   []byte
	// Stream is a committed streaming answer: relay it with Stream.Relay.
	Stream *Stream
	// Native is true when Body (or Stream) is in the request's NativeFormat,
	// passed through from a deployment that speaks it; else Body is in the
	// Chat Completions format (an answer, or an OpenAI error body).
	Native bool
	// Err is set when the router answers with an error of its own.
	Err error
}

// attemptState is what one request learned about a deployment.
type attemptState struct {
	excluded bool // never again in this request (context_length, auth, quota)
	silent   bool // timed out: only if nothing else is left
}

// Serve answers req from group, trying the best-ranked usable deployment
// first, with failover. It never makes more than MaxAttempts attempts and
// never waits past the deadline: when every deployment is cooling past it,
// it answers 429 at once, with Retry-After set to the earliest reset.
func (r *Router) Serve(ctx context.Context, group []*Deployment, req *Request) *Result {
	start := r.Clock.Now()
	deadline := start.Add(r.Deadline)
	res := &Result{}
	var perBuf [16]attemptState
	per := perBuf[:min(len(group), len(perBuf))]
	if len(group) > len(perBuf) {
		per = make([]attemptState, len(group))
	}
	var candBuf [16]scored
	var last *outcome
	defer func() {
		// Also on an error answer: why the last attempt failed.
		if last != nil {
			res.FailoverReason = last.obs.Class.String()
		}
	}()
	failures := 0
	var minContext int64 = -1 // after a context_length failure: only larger windows

	for {
		if ctx.Err() != nil {
			res.Err = ErrClientGone
			return res
		}
		now := r.Clock.Now()
		if !now.Before(deadline) {
			res.Err = deadlineError()
			return res
		}
		if res.Attempts >= r.MaxAttempts {
			return r.giveUp(res, last, group, now, req)
		}
		cands := candidates(candBuf[:0], group, per, now, req, minContext)
		if len(cands) == 0 {
			return r.giveUp(res, last, group, now, req)
		}
		ready := readyFirst(cands, now)
		if ready == 0 {
			// Everything is cooling: wait for the first to come back, no
			// less than the backoff after a failure, if that fits.
			c := earliest(cands)
			wait := c.f.At.Sub(now)
			if failures > 0 {
				wait = max(wait, r.Policy.Backoff(failures))
			}
			if !now.Add(wait).Before(deadline) {
				res.Err = coolingError(cands, c, now)
				return res
			}
			r.debug("waiting for a cooling deployment",
				zap.String("deployment", group[c.i].Name), zap.Duration("wait", wait))
			if err := r.Clock.Sleep(ctx, wait); err != nil {
				res.Err = ErrClientGone
				return res
			}
			continue
		}
		r.score(group, cands[:ready])
		k := r.pick(group, cands[:ready])
		i, d := cands[k].i, group[cands[k].i]
		if ce := r.Logger.Check(zapcore.DebugLevel, "routing decision"); ce != nil {
			ce.Write(zap.Int("attempt", res.Attempts+1), zap.String("chose", d.Name),
				zap.String("candidates", describe(group, cands, now)))
		}
		if !d.State.Acquire(now, req.Tokens) {
			continue // a half-open circuit's probe was taken meanwhile
		}
		if last != nil && r.Observer != nil {
			r.Observer.Failover(last.d, last.obs.Class)
		}
		res.Attempts++
		out := r.exchange(ctx, d, req, deadline)
		if out.stream == nil {
			d.State.Release() // a stream releases when it ends
		}
		if out.untranslatable {
			res.Attempts-- // nothing was sent
			per[i].excluded = true
			last = out
			continue
		}
		if out.canceled {
			res.Err = ErrClientGone
			return res
		}
		if out.deadline {
			res.Err = deadlineError()
			return res
		}
		class := out.obs.Class
		if r.Observer != nil {
			r.Observer.Attempt(d, class, out.took)
		}
		observed := d.State.Observe(r.Clock.Now(), out.obs, r.Policy)
		switch class {
		case provider.OK:
			res.Deployment = d
			res.Status, res.Header, res.Body, res.Stream, res.Native = out.status, out.header, out.body, out.stream, out.native
			return res
		case provider.ClientError:
			res.passOn(out)
			return res
		}
		r.logFailure(d, out, observed)
		last = out
		switch class {
		case provider.ContextLength:
			per[i].excluded = true
			minContext = max(minContext, d.ContextWindow)
		case provider.Auth, provider.QuotaExhausted:
			per[i].excluded = true
			failures++
		default:
			if out.timeout {
				per[i].silent = true
			}
			failures++
		}
	}
}

// logFailure logs a failed attempt. A bad key or a spent quota is an
// operator's problem: logged at error level, once, when its circuit opens.
func (r *Router) logFailure(d *Deployment, out *outcome, observed capacity.Observed) {
	class := out.obs.Class
	fields := []zap.Field{zap.String("deployment", d.Name), zap.String("class", class.String()),
		zap.Int("status", out.status), zap.String("message", out.obs.Message)}
	switch class {
	case provider.Auth, provider.QuotaExhausted:
		if observed.Opened {
			r.Logger.Error("deployment disabled: the provider rejects our key or the quota is spent",
				append(fields, zap.Duration("for", observed.Cooldown))...)
		}
	default:
		r.Logger.Info("attempt failed, failing over", fields...)
	}
}

// giveUp ends a request whose attempts or eligible deployments ran out.
func (r *Router) giveUp(res *Result, last *outcome, group []*Deployment, now time.Time, req *Request) *Result {
	res.Err = r.finalError(last, group, now, req)
	if last != nil && last.clientError() {
		res.passOn(last)
	}
	return res
}

// passOn makes a provider's client error the answer, as it is.
func (res *Result) passOn(o *outcome) {
	res.Deployment = o.d
	res.Status, res.Header, res.Body, res.Native, res.Err = o.status, o.header, o.body, o.native, nil
}

// candidates collects into buf the deployments still eligible for this
// request, with their features. Timed-out (silent) deployments are left out
// while any other remains.
func candidates(buf []scored, group []*Deployment, per []attemptState, now time.Time, req *Request, minContext int64) []scored {
	cands := buf
	for pass := 0; pass < 2 && len(cands) == 0; pass++ {
		for i, d := range group {
			if per[i].excluded || per[i].silent != (pass == 1) || !supports(d, req) {
				continue
			}
			if minContext >= 0 && d.ContextWindow != 0 && d.ContextWindow <= minContext {
				// Known to be no larger than one that was too small. An unknown
				// window may be larger: worth an attempt.
				continue
			}
			cands = append(cands, scored{i: i, cost: estimateCost(d, req)})
			d.State.ReadFeatures(&cands[len(cands)-1].f, now, req.Tokens, req.Stream)
		}
	}
	return cands
}

// supports reports whether d can serve req's kind.
func supports(d *Deployment, req *Request) bool {
	if req.Kind == Embeddings {
		_, ok := d.Adapter.(adapters.Embedder)
		return ok
	}
	return true
}

// readyFirst moves the candidates usable at now to the front and returns
// how many there are.
func readyFirst(cands []scored, now time.Time) int {
	n := 0
	for k := range cands {
		if !cands[k].f.At.After(now) {
			cands[n], cands[k] = cands[k], cands[n]
			n++
		}
	}
	return n
}

// earliest returns the candidate that comes back first.
func earliest(cands []scored) scored {
	e := cands[0]
	for _, c := range cands[1:] {
		if c.f.At.Before(e.f.At) {
			e = c
		}
	}
	return e
}

func (r *Router) debug(msg string, fields ...zap.Field) {
	if ce := r.Logger.Check(zapcore.DebugLevel, msg); ce != nil {
		ce.Write(fields...)
	}
}

func deadlineError() *Error {
	return &Error{Status: http.StatusGatewayTimeout, Type: "timeout", Code: "deadline_exceeded",
		Message: "no deployment answered before the request deadline"}
}

// retryAfterSeconds rounds a wait up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) time.Duration {
	s := max(1, int64(math.Ceil(d.Seconds())))
	return time.Duration(s) * time.Second
}

// coolingError answers when every eligible deployment is cooling past the
// deadline: 429 when they are all rate-limited or out of quota, else 502;
// both with Retry-After until the earliest comes back.
func coolingError(cands []scored, first scored, now time.Time) *Error {
	retry := retryAfterSeconds(first.f.At.Sub(now))
	for _, c := range cands {
		if c.f.Why != provider.RateLimited && c.f.Why != provider.QuotaExhausted {
			return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unavailable",
				Message: "every deployment of this model is failing; retry later", RetryAfter: retry}
		}
	}
	return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
		Message: "every deployment of this model is rate-limited; retry after the given time", RetryAfter: retry}
}

// finalError answers when attempts or eligible deployments ran out.
func (r *Router) finalError(last *outcome, group []*Deployment, now time.Time, req *Request) error {
	if last == nil {
		return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unavailable",
			Message: "no deployment could serve this request"}
	}
	switch last.obs.Class {
	case provider.ContextLength:
		return nil // the provider's 400 is passed on
	case provider.RateLimited, provider.QuotaExhausted:
		// A 429 tells the client that the capacity is spent: only when every
		// deployment is rate-limited or out of quota. One that failed
		// otherwise (or is free) makes this a 502.
		earliest, limited := time.Time{}, true
		for _, d := range group {
			at, why := d.State.AvailableAt(now, req.Tokens)
			if !at.After(now) || (why != provider.RateLimited && why != provider.QuotaExhausted) {
				limited = false
			}
			if earliest.IsZero() || at.Before(earliest) {
				earliest = at
			}
		}
		if limited {
			return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
				Message:    "every deployment of this model is rate-limited; retry after the given time",
				RetryAfter: retryAfterSeconds(earliest.Sub(now))}
		}
	}
	return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unavailable",
		Message: "every deployment of this model failed; retry later"}
}
