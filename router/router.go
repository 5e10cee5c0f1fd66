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
	"net/http"
	"sort"
	"strconv"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmrouter/caddy-llm-router/adapters"
	"github.com/llmrouter/caddy-llm-router/capacity"
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

// Request is what the router needs of one client request.
type Request struct {
	// Body is the client's Chat Completions JSON body.
	Body []byte
	// Stream is the body's "stream".
	Stream bool
	// Tokens estimates prompt plus max_tokens, for token windows.
	Tokens int64
	// Choices is the body's "n" (default 1): a stream is complete once that
	// many choices have finished.
	Choices int
	// IncludeUsage is the body's stream_options.include_usage: a stream that
	// asked for usage is complete only once the usage chunk arrived.
	IncludeUsage bool
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
	Clock  Clock
	Logger *zap.Logger
}

// New returns a Router with the Caddyfile defaults: 60 s deadline, 4
// attempts, 500 ms..30 s backoff, the wall clock and a no-op logger.
func New() *Router {
	return &Router{
		Deadline:    60 * time.Second,
		MaxAttempts: 4,
		Policy:      capacity.DefaultPolicy,
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
	// Err is set when the router answers with an error of its own.
	Err error
}

// candidate is a deployment as ranked for one choice.
type candidate struct {
	i        int
	at       time.Time // when it may be tried; <= now means at once
	why      capacity.Class
	headroom float64
}

// attemptState is what one request learned about a deployment.
type attemptState struct {
	excluded bool // never again in this request (context_length, auth, quota)
	silent   bool // timed out: only if nothing else is left
}

// Serve answers req from group, in rank order, with failover. It never makes
// more than MaxAttempts attempts and never waits past the deadline: when
// every deployment is cooling past it, it answers 429 at once, with
// Retry-After set to the earliest reset.
func (r *Router) Serve(ctx context.Context, group []*Deployment, req *Request) *Result {
	start := r.Clock.Now()
	deadline := start.Add(r.Deadline)
	res := &Result{}
	per := make([]attemptState, len(group))
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
			res.Err = r.finalError(last, group, per, now, req)
			if last != nil && last.clientError() {
				res.passOn(last)
			}
			return res
		}
		cands := r.rank(group, per, now, req, minContext)
		if len(cands) == 0 {
			res.Err = r.finalError(last, group, per, now, req)
			if last != nil && last.clientError() {
				res.passOn(last)
			}
			return res
		}
		c := cands[0]
		if c.at.After(now) {
			// Everything is cooling: wait for the first to come back, no
			// less than the backoff after a failure, if that fits.
			wait := c.at.Sub(now)
			if failures > 0 {
				wait = max(wait, r.Policy.Backoff(failures))
			}
			if !now.Add(wait).Before(deadline) {
				res.Err = coolingError(cands, now, last)
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

		d := group[c.i]
		if ce := r.Logger.Check(zapcore.DebugLevel, "routing"); ce != nil {
			fields := make([]zap.Field, 0, len(cands)+1)
			fields = append(fields, zap.Int("attempt", res.Attempts+1))
			for _, c := range cands {
				fields = append(fields, zap.String(group[c.i].Name, candidateInfo(c, now)))
			}
			ce.Write(fields...)
		}
		res.Attempts++
		out := r.exchange(ctx, d, req, deadline)
		if out.canceled {
			res.Err = ErrClientGone
			return res
		}
		if out.deadline {
			res.Err = deadlineError()
			return res
		}
		class := out.obs.Class
		d.State.Observe(r.Clock.Now(), out.obs, r.Policy)
		switch {
		case class == capacity.OK:
			res.Deployment = d
			res.Status, res.Header, res.Body, res.Stream = out.status, out.header, out.body, out.stream
			return res
		case class == capacity.ClientError:
			res.passOn(out)
			return res
		}
		r.Logger.Info("attempt failed, failing over",
			zap.String("deployment", d.Name), zap.String("class", class.String()),
			zap.Int("status", out.status), zap.String("message", out.obs.Message))
		last = out
		switch class {
		case capacity.ContextLength:
			per[c.i].excluded = true
			minContext = max(minContext, d.ContextWindow)
		case capacity.Auth, capacity.QuotaExhausted:
			per[c.i].excluded = true
			failures++
		default:
			if out.timeout {
				per[c.i].silent = true
			}
			failures++
		}
	}
}

// passOn makes a provider's client error the answer, as it is.
func (res *Result) passOn(o *outcome) {
	res.Deployment = o.d
	res.Status, res.Header, res.Body, res.Err = o.status, o.header, o.body, nil
}

// rank orders the deployments still eligible for this request: those usable
// now first, by capacity headroom, quality, cost and weight; then the
// cooling ones by when they come back. Timed-out (silent) deployments are
// left out while any other remains.
func (r *Router) rank(group []*Deployment, per []attemptState, now time.Time, req *Request, minContext int64) []candidate {
	cands := make([]candidate, 0, len(group))
	silent := make([]candidate, 0)
	for i, d := range group {
		if per[i].excluded {
			continue
		}
		if minContext >= 0 && d.ContextWindow != 0 && d.ContextWindow <= minContext {
			// Known to be no larger than one that was too small. An unknown
			// window may be larger: worth an attempt.
			continue
		}
		at, why := d.State.AvailableAt(now, req.Tokens)
		c := candidate{i: i, at: at, why: why, headroom: d.State.Headroom(now)}
		if per[i].silent {
			silent = append(silent, c)
			continue
		}
		cands = append(cands, c)
	}
	if len(cands) == 0 {
		cands = silent
	}
	sort.SliceStable(cands, func(a, b int) bool {
		ca, cb := cands[a], cands[b]
		readyA, readyB := !ca.at.After(now), !cb.at.After(now)
		if readyA != readyB {
			return readyA
		}
		if !readyA {
			return ca.at.Before(cb.at)
		}
		if ha, hb := headroomBucket(ca.headroom), headroomBucket(cb.headroom); ha != hb {
			return ha > hb
		}
		da, db := group[ca.i], group[cb.i]
		if da.Quality != db.Quality {
			return da.Quality > db.Quality
		}
		if costA, costB := da.CostInput+da.CostOutput, db.CostInput+db.CostOutput; costA != costB {
			return costA < costB
		}
		return da.Weight > db.Weight
	})
	return cands
}

// headroomBucket turns remaining/limit into tenths, so that 4,998 vs 4,999
// left is a tie; unknown capacity counts as half full (neutral).
func headroomBucket(h float64) int {
	if h < 0 {
		h = 0.5
	}
	return int(math.Floor(h * 10))
}

func candidateInfo(c candidate, now time.Time) string {
	s := "headroom=" + strconv.FormatFloat(c.headroom, 'f', 2, 64)
	if c.at.After(now) {
		s += " cooling=" + c.at.Sub(now).String() + " reason=" + c.why.String()
	}
	return s
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
func coolingError(cands []candidate, now time.Time, last *outcome) *Error {
	retry := retryAfterSeconds(cands[0].at.Sub(now))
	for _, c := range cands {
		if c.why != capacity.RateLimited && c.why != capacity.QuotaExhausted {
			return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unavailable",
				Message: "every deployment of this model is failing; retry later", RetryAfter: retry}
		}
	}
	return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
		Message: "every deployment of this model is rate-limited; retry after the given time", RetryAfter: retry}
}

// finalError answers when attempts or eligible deployments ran out.
func (r *Router) finalError(last *outcome, group []*Deployment, per []attemptState, now time.Time, req *Request) error {
	if last == nil {
		return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unavailable",
			Message: "no deployment could serve this request"}
	}
	switch last.obs.Class {
	case capacity.ContextLength:
		return nil // the provider's 400 is passed on
	case capacity.RateLimited, capacity.QuotaExhausted:
		earliest := time.Time{}
		for _, d := range group {
			if at, _ := d.State.AvailableAt(now, req.Tokens); earliest.IsZero() || at.Before(earliest) {
				earliest = at
			}
		}
		return &Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
			Message:    "every deployment of this model is rate-limited; retry after the given time",
			RetryAfter: retryAfterSeconds(earliest.Sub(now))}
	}
	return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unavailable",
		Message: "every deployment of this model failed; retry later"}
}
