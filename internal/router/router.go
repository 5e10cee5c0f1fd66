// Package router ranks a model group's deployments and walks them: one
// attempt at a time, failing over at once on transient failures, waiting
// max(Retry-After, backoff) only when the next attempt must go to a
// deployment that is cooling down, all inside one deadline for the request.
//
// It speaks no client's format: it takes a provider.Request from a client
// API and hands back the answer in the format the attempt's plan read it
// in, or an Error of its own (status, class, message, retry delay) that the
// client API writes. It imports neither Caddy nor the root package; all
// time (instants, waits and timers) comes from an injected Clock.
package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/estimate"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Defaults of the router's settings and of a provider's timeouts (the
// Caddyfile's defaults; the backoff's are capacity.DefaultPolicy's).
//
// DefaultTimeout is 0: a non-streaming attempt runs as long as the request's
// deadline allows, since a long answer (a minute of generation) is a working
// provider's, and cutting it only to retry elsewhere with less time left
// serves nothing. A silent provider is bounded by the deadline alone unless a
// timeout is set. Streams are bounded by DefaultTTFTTimeout until their first
// content and DefaultIdleTimeout between events after it.
const (
	DefaultDeadline    = 60 * time.Second
	DefaultMaxAttempts = 4
	DefaultTimeout     = time.Duration(0)
	DefaultTTFTTimeout = 15 * time.Second
	DefaultIdleTimeout = 30 * time.Second
	// DefaultMaxStreamBytes is Router.MaxStreamBytes's default: far more
	// than a long answer (100,000 output tokens are about 400 KB of text,
	// their events' JSON some ten times that as one small chunk a token),
	// so that only a provider that streams without end meets it.
	DefaultMaxStreamBytes = 64 << 20
)

// Deployment is a provider x an upstream model: the unit that is ranked,
// rate-limited and failed over.
type Deployment struct {
	// Name identifies the deployment to clients and operators:
	// "<provider>/<upstream model>".
	Name string
	// Model is the upstream model name the provider is asked for.
	Model string
	// Provider is the configured account that plans each attempt and
	// decodes each answer.
	Provider provider.Provider
	// Transport performs the upstream exchange (Caddy's HTTP transport).
	Transport http.RoundTripper
	// Timeout bounds one non-streaming attempt until its body is read; 0:
	// the request's deadline alone (DefaultTimeout).
	Timeout time.Duration
	// TTFTTimeout bounds a streaming attempt until its first content.
	TTFTTimeout time.Duration
	// IdleTimeout bounds the silence between two events of a stream.
	IdleTimeout time.Duration
	// Spending is the deployment's budget and what its answers spent (nil:
	// none): once spent, the deployment is out until it renews, as a spent
	// quota.
	Spending *capacity.Spending
	// ProviderType is the provider's type ("openai", "bedrock", ...), for
	// traces' gen_ai.provider.name.
	ProviderType string
	// CostInput and CostOutput are USD per 1M tokens; 0 = unknown.
	// CostCached is the price of input tokens read from the prompt cache
	// (USD per 1M tokens).
	CostInput, CostOutput, CostCached float64
	// CostCacheWrite and CostCacheWrite1h are the prices of input tokens
	// written to the prompt cache, to its 5-minute and its one-hour
	// lifetime (USD per 1M tokens).
	CostCacheWrite, CostCacheWrite1h float64
	// Quality is the operator's judgment, 0..1.
	Quality float64
	// ContextWindow is the largest prompt plus output, in tokens; 0 = unknown.
	ContextWindow int64
	// ExactTokens: the model counts with o200k_base (estimate.O200k), so
	// the context-window check may count the prompt exactly.
	ExactTokens bool
	// Weight shares the traffic among near-tied deployments, in proportion
	// (see pick); at least 1.
	Weight int
	// Tier orders the group: a deployment of tier n+1 is tried only when
	// none of tier n or lower can serve the request before its deadline
	// (see tiered); 0 counts as 1.
	Tier int
	// State is the deployment's capacity state, shared across requests and
	// config reloads.
	State *capacity.State
	// Secrets are values that must never leave the router (the provider's
	// key): where a provider's answer echoes one (an error naming the key it
	// got), whole or masked, it is redacted from what the router logs, keeps
	// and passes on, whatever its length (see package redact for the rules).
	Secrets []string

	// refusesPrefill is learned: the deployment refused a resume's
	// continuation as a model without prefill (see prefillRefusal), so it
	// is not asked for another (a replay it may still serve). It lasts as
	// long as the Deployment: a config reload makes it anew.
	refusesPrefill atomic.Bool
}

// Request is what the router needs of one client request: the request as
// providers read it, and its size in tokens.
type Request struct {
	*provider.Request
	// Tokens estimates prompt plus max_tokens, for token windows.
	Tokens int64
	// PromptTokens and OutputTokens (max_tokens; 0 when unset) price the
	// request for the cost feature.
	PromptTokens, OutputTokens int64
	// Priority orders the request among those waiting for capacity, from
	// MinPriority to MaxPriority (higher first); see Router.Reserve.
	Priority int
	// Consumer names who is asking ("" : anonymous, one consumer of its
	// own), and Weight is its share among the consumers whose requests
	// wait in the same queue at the same priority (0: 1). The queue
	// serves them by weighted fair queueing (queue.go): each backlogged
	// consumer gets at least Weight / (sum of the backlogged weights) of
	// the requests served.
	Consumer string
	Weight   float64
	// Pinned, when set, is the only deployment that may serve the request:
	// it continues state that deployment's provider account keeps (a
	// Responses previous_response_id). The request waits for it within the
	// deadline when it is cooling, and never fails over to another.
	Pinned *Deployment
	// Prefer, when set, is the deployment that served the request's
	// conversation last (affinity): taken whenever it is usable now, over
	// the ranking, so that its prompt cache stays warm.
	Prefer *Deployment
	// PreferMargin, when above 0, takes Prefer only while its score is
	// within that much of the best usable deployment's (scores are 0..1;
	// see Weights), so that a cache's savings do not outweigh capacity
	// or health: CacheMargin for a prompt-cache prefix's affinity.
	PreferMargin float64
	// NoHedge keeps the request from being hedged (HedgeAfter): the
	// provider runs what it accepts to its end whoever waits (a Responses
	// background create), so a twin would be a second job, billed too.
	NoHedge bool
	// Bound, when set, is what of the request only some deployments can
	// read (a Responses request's encrypted reasoning): see Bound.
	Bound *Bound
	// unbound is set once a provider refused the bound state: every
	// attempt after it is sent the request with all of it stripped.
	unbound atomic.Bool
	// exact caches the prompt's o200k_base count (estimate.Exact), nil
	// until counted; prefixes its cache prefix (CachePrefixes), nil until
	// hashed.
	exact    atomic.Pointer[exactCount]
	prefixes atomic.Pointer[cachePrefix]
	// resume narrows the attempts of a resume's request (Stream.resume);
	// nil for a client's.
	resume *resumeSpec
}

// exactCount is a count of a prompt's tokens: n, or more than n when not
// complete (the count stopped at its limit).
type exactCount struct {
	n        int64
	complete bool
}

// The exact count decides a deployment's context-window check when the
// estimate (bytes / 4) is between exactLow and exactHigh times its window:
// bytes / 4 can be a third too high for English and code, a quarter too
// low for Chinese, and three times too high for text JSON escapes
// ("\u4e2d"); outside those bounds the estimate decides alone.
const (
	exactLow  = 0.7
	exactHigh = 4.0
)

// fitsContext reports whether the request fits d's context window: by
// the exact count of its tokenizer for a model that counts with
// o200k_base near its window, else by the estimate. A window of 0
// (unknown) takes anything; when the count cannot be made (others are
// under way), the request is sent: the provider's own context_length
// answer fails it over.
func (req *Request) fitsContext(d *Deployment) bool {
	w := d.ContextWindow
	switch {
	case w <= 0:
		return true
	case req.OutputTokens >= w:
		return false
	case !d.ExactTokens || float64(req.Tokens) <= exactLow*float64(w):
		return req.Tokens <= w
	case float64(req.Tokens) > exactHigh*float64(w):
		return false
	}
	limit := w - req.OutputTokens
	c := req.exact.Load()
	if c == nil || !c.complete && c.n <= limit {
		if d.State.Disabled() {
			return true // left out anyway: not worth a count
		}
		n, complete, ok := estimate.Exact(req.Body, limit)
		if !ok {
			return true
		}
		c = &exactCount{n: n, complete: complete}
		req.exact.Store(c)
	}
	return c.complete && c.n <= limit
}

// Router walks a model group's deployments for one request. The zero value
// is not usable: set every field (see New).
type Router struct {
	// Deadline is the wall-clock budget of one request, all attempts and
	// waits included (until the first byte of a stream reaches the client).
	Deadline time.Duration
	// MaxAttempts bounds upstream attempts per request, over its group and
	// the fallback groups it goes on to. A certain refusal (401 or 403: the
	// key; a spent quota or balance: 402, insufficient_quota; too_large: a
	// request larger than the token window) spends none: it is instant,
	// and the deployment is out of the request after it (a bad key's or a
	// spent quota's circuit open), so each deployment refuses once at most
	// and a request makes at most MaxAttempts plus that many attempts.
	MaxAttempts int
	// Policy turns failures into waits (backoff base and cap, long cooldown).
	Policy capacity.Policy
	// Weights weigh the ranking's features (see Weights).
	Weights Weights
	// Reserve keeps a share of each window for high priorities.
	Reserve Reserve
	// Resume says which deployments may take up a stream whose provider
	// failed after the client began to read it (see Stream.Relay); New
	// sets ResumeSameModel.
	Resume ResumeMode
	// HedgeAfter, when positive, starts a second attempt on the next best
	// deployment with capacity when the first has produced no content by
	// then (see hedge.go); 0: no hedging.
	HedgeAfter time.Duration
	// MaxStreamBytes bounds what the router relays of one streamed answer,
	// in bytes of its events' data (over every attempt of a resumed
	// stream): past it the client's stream ends with an in-band error
	// (StreamError.Bounded) and the upstream is closed; what was relayed is
	// spent (as its provider stated it, else estimated). New sets
	// DefaultMaxStreamBytes; 0: no bound.
	MaxStreamBytes int64
	// FleetNaps is how many times a window a waiting request whose turn in
	// the fleet's queue has not come looks again while capacity is free
	// (see fleetTurn); New sets DefaultFleetNaps.
	FleetNaps int
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
	// Failover reports a move to another attempt after a failure on from,
	// of the given class.
	Failover(from *Deployment, class provider.Class)
	// Queue reports the number of requests waiting for capacity in g, each
	// time it changes.
	Queue(g *Group, waiting int)
	// QueueWait reports how long a request waited in g's queue, when it
	// leaves it (to an attempt, or answered without one).
	QueueWait(g *Group, waited time.Duration)
	// Unpredicted reports a 429 from d that the router's budget did not
	// predict (it let the attempt go).
	Unpredicted(d *Deployment)
	// Hedge reports a hedge started on d, for a request of g whose
	// attempt had produced no content after HedgeAfter; HedgeWon reports
	// that it answered first.
	Hedge(g *Group, d *Deployment)
	HedgeWon(g *Group, d *Deployment)
	// Resume reports a stream that broke on from and was taken up by an
	// attempt on to, how: "continued" (to went on from the client's text)
	// or "replayed" (to answered afresh, and its text began with the
	// client's).
	Resume(from, to *Deployment, how string)
}

// New returns a Router with the defaults: DefaultDeadline,
// DefaultMaxAttempts, capacity.DefaultPolicy, DefaultWeights, the wall
// clock and a no-op logger.
func New() *Router {
	return &Router{
		Deadline:       DefaultDeadline,
		MaxAttempts:    DefaultMaxAttempts,
		Policy:         capacity.DefaultPolicy,
		Weights:        DefaultWeights,
		Rand:           rand.Float64,
		Clock:          RealClock{},
		Logger:         zap.NewNop(),
		FleetNaps:      DefaultFleetNaps,
		Resume:         ResumeSameModel,
		MaxStreamBytes: DefaultMaxStreamBytes,
	}
}

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

// Result is the outcome of Serve.
type Result struct {
	// Group is the model group that answered, or the last one tried: the
	// group asked for, or one it fell back to (Group.Fallback); when no
	// group served, the one whose failure the client is told (see
	// betterFailure).
	Group *Group
	// Tried is the last model group the request was tried on: Group when
	// one answered, else perhaps a fallback group after it (metrics count
	// every request that went on to a fallback group by it).
	Tried *Group
	// Deployment answered (nil if none did).
	Deployment *Deployment
	// Attempts is the number of upstream attempts made.
	Attempts int
	// FailoverReason is the class of the last failed attempt, OK when no
	// attempt failed, whether another deployment then answered or not.
	FailoverReason provider.Class

	// Status and Body are the answer for a non-streaming success, or a
	// provider's client error passed on: Body as the provider sent it when
	// that is in Format, else nil (restate it from Error).
	Status int
	Body   []byte
	// Format is the format of Body and Stream: the client's own (a native
	// pass) or Chat.
	Format provider.Format
	// Error is the provider's client error (class, code, message) when
	// Status is one, for client APIs that restate it in their format.
	Error *provider.Observation
	// Hedge says whether a hedge was started (HedgeAfter), and which
	// attempt answered: "" none, HedgeLost (the first), HedgeWon (the
	// hedge). Attempts counts both.
	Hedge string
	// Waited is how long the request waited in its groups' queues for
	// capacity (0: it never slept there), for per-consumer queue waits.
	Waited time.Duration
	// Stream is a committed streaming answer: relay it with Stream.Relay
	// (its usage is known once relayed: Stream.Usage).
	Stream *Stream
	// Usage is what a non-streaming answer used, as its provider counted
	// it, when UsageStated (the deployment's State has recorded it, and
	// its cost: Deployment.Cost).
	Usage       provider.Usage
	UsageStated bool

	// lastEnd is when the request's last attempt ended (or it began):
	// what a trace tells as the wait before the next.
	lastEnd time.Time
	// refused counts the attempts a deployment refused for certain (its
	// key, its quota, too_large): they spend none of MaxAttempts (see
	// attemptsLeft).
	refused int
	// Err is set when the router answers with an error of its own (*Error),
	// or ErrClientGone.
	Err error
}

// attemptState is what one request learned about a deployment.
type attemptState struct {
	excluded bool // never again in this request (context_length, too_large, auth, quota, cannot express)
	tooSmall bool // its context_window is smaller than the request's estimate: never tried
	tooLarge bool // the request is larger than its token window's whole limit (stated, or too_large)
	silent   bool // timed out: only if nothing else is left
	failed   bool // it failed this request: tried again only if nothing else is left
	tried    bool // an attempt went out to it
}

// walk is one request's way through its group: what it learned of each
// deployment, and where it stands.
type walk struct {
	per        []attemptState
	last       *outcome       // the last failed attempt
	unplanned  *outcome       // the last deployment that could not express the request
	budget     *budgetRefusal // the last deployment whose budget could not hold the request
	failures   int
	limited    int      // failures that were rate limits or spent quotas
	minContext int64    // after a context_length failure: only larger windows; -1 none
	pending    *outcome // a failed attempt not yet logged (logPending)
	// widen: the deployments it has not tried cannot serve it in time, so
	// those it failed on are candidates again (see candidates).
	widen bool
	// prior is the last failed attempt of the group this one falls back
	// from: the first attempt here is its failover.
	prior *outcome
}

// Serve answers req from a group of deployments served once (its queue
// holds only this request): see ServeGroup.
func (r *Router) Serve(ctx context.Context, group []*Deployment, req *Request) *Result {
	return r.ServeGroup(ctx, &Group{Deployments: group}, req)
}

// ServeGroup answers req from g, trying the best-ranked usable deployment
// first, with failover. When no deployment has capacity it waits in g's
// queue for its turn (see queue). It spends no more than MaxAttempts
// attempts (certain refusals spend none) and never waits past the
// deadline: when every deployment is cooling past it, or its place in the
// queue cannot be served before it, it answers at once, with Retry-After
// set to when it could be; or, when g has a Fallback, goes on to that
// group (and its fallback, in turn) with what is left of the deadline and
// the attempts. A deployment that failed the request is tried again only
// when no other deployment of g, and no fallback group, is left.
func (r *Router) ServeGroup(ctx context.Context, g *Group, req *Request) *Result {
	res := &Result{lastEnd: r.Clock.Now()}
	deadline := res.lastEnd.Add(r.Deadline)
	var pending, prior *outcome // of the group before: its last failed attempt, if not yet logged; its last failed one
	var best Result             // the failure to answer with if no group serves (betterFailure)
	tooLarge := true            // every group failed for the prompt's size
	var perBuf [16]attemptState // what the request learned of each deployment of the group it is at
	for hop := range g.Chain() {
		if !Serves(hop.Deployments, req.Format) && (hop != g || g.Serves(req.Format)) {
			continue // a group that cannot take the request's API at all (embeddings to Anthropic)
		}
		clear(perBuf[:])
		w := walk{per: perBuf[:min(len(hop.Deployments), len(perBuf))], minContext: -1, pending: pending, prior: prior}
		if len(hop.Deployments) > len(perBuf) {
			w.per = make([]attemptState, len(hop.Deployments))
		}
		if res.Group != nil {
			r.debug("falling back to another model group", zap.String("from", res.Group.Name), zap.String("to", hop.Name),
				zap.Int("attempts", res.Attempts))
			*res = Result{Attempts: res.Attempts, FailoverReason: res.FailoverReason, lastEnd: res.lastEnd, refused: res.refused}
		}
		r.serve(ctx, hop, req, res, &w, deadline)
		res.Group = hop
		pending, w.pending = w.pending, nil
		prior = cmp.Or(w.last, w.prior)
		if !fallsBack(res) {
			break // an answer, or one no other group would change
		}
		tooLarge = tooLarge && failedForSize(res)
		if best.Group == nil || betterFailure(res, &best) {
			best = *res
		}
		if hop.Fallback == nil || !r.attemptsLeft(res) || ctx.Err() != nil || !r.Clock.Now().Before(deadline) {
			break
		}
	}
	r.logPending(&walk{pending: pending}, nil) // a failed attempt no other followed
	if res.Stream != nil {
		res.Stream.prepareResume(ctx, req, res.Attempts)
	}
	tried := res.Group
	if best.Group != nil && fallsBack(res) {
		attempts, reason := res.Attempts, res.FailoverReason
		*res = best
		res.Attempts, res.FailoverReason = attempts, reason
	}
	res.Tried = tried
	if e, ok := res.Err.(*Error); ok && tooLarge && e.Class == provider.ContextLength && g.Fallback != nil {
		// Too large for every group of the chain: say so of them all.
		largest := int64(0)
		for hop := range g.Chain() {
			for _, d := range hop.Deployments {
				if d.Provider.Serves(req.Format) {
					largest = max(largest, d.ContextWindow)
				}
			}
		}
		e.Message = contextMessage(req, "this model or its fallback groups", largest)
	}
	return res
}

// failedForSize reports whether a group's failure was the prompt's size:
// the context pre-check's 400, or a provider's context_length passed on.
func failedForSize(res *Result) bool {
	if e, ok := res.Err.(*Error); ok {
		return e.Class == provider.ContextLength
	}
	return res.Error != nil && res.Error.Class == provider.ContextLength
}

// betterFailure reports whether a group's failure a tells the client more
// than b, an earlier group's: one to retry (a 429, a 502, a 504) over one
// that refuses the request as it is (a 400: too large for that group,
// or not expressible there), since the earlier group would take it later;
// among those to retry, the one with the earlier Retry-After. Otherwise
// the earlier group's stands.
func betterFailure(a, b *Result) bool {
	retry := func(res *Result) (bool, time.Duration) {
		if e, ok := res.Err.(*Error); ok && e.Status >= 429 && e.Status != http.StatusNotImplemented {
			return true, e.RetryAfter
		}
		return false, 0
	}
	ra, wa := retry(a)
	rb, wb := retry(b)
	switch {
	case ra != rb:
		return ra
	case !ra:
		return false
	}
	return wa > 0 && (wb <= 0 || wa < wb)
}

// MaxFallbacks is the most fallback groups one request goes through (the
// config refuses longer chains and cycles; this keeps a group built by hand
// from looping).
const MaxFallbacks = 16

// fallsBack reports whether a group's answer lets its fallback group try:
// none of its deployments could serve the request (rate-limited, failing,
// out of time for it, its context too small, unable to express it), as
// opposed to an answer, a client that left, or a request the provider
// refused as it is.
func fallsBack(res *Result) bool {
	switch _, ok := res.Err.(*Error); { // the router's own errors are never wrapped
	case ok:
		return true
	case res.Err != nil:
		return false // the client went away
	case res.Error != nil:
		return res.Error.Class == provider.ContextLength // a larger model may take it
	}
	return false
}

// serve is ServeGroup's loop: it returns res once answered or failed.
func (r *Router) serve(ctx context.Context, g *Group, req *Request, res *Result, w *walk, deadline time.Time) *Result {
	group := g.Deployments
	need := capacity.Need{Tokens: req.Tokens, Output: req.OutputTokens, Prefixes: req.CachePrefixes(),
		Reserve: r.Reserve.share(req.Priority)}
	if err := r.groupBudget(g, req, need, r.Clock.Now(), deadline); err != nil {
		r.debug("the group's budget cannot hold the request", zap.String("group", g.Name), zap.String("why", err.Message))
		return res.fail(err, w)
	}
	for _, d := range group {
		r.checkBudget(d, r.Clock.Now())
	}
	var me *waiter // while the request waits in g's queue
	defer func() {
		if me != nil {
			res.Waited += r.leaveQueue(g, me)
		}
	}()
	var candBuf [16]scored
	for {
		if ctx.Err() != nil {
			return res.fail(ErrClientGone, w)
		}
		now := r.Clock.Now()
		if !r.attemptsLeft(res) {
			return r.giveUp(res, w, group, now, req)
		}
		cands, retry := candidates(candBuf[:0], group, w, now, deadline, req, need)
		if !now.Before(deadline) {
			if me != nil {
				return res.fail(queueError(cands, now), w) // waited its turn until the deadline
			}
			return res.fail(deadlineError(), w)
		}
		if len(cands) == 0 {
			return r.giveUp(res, w, group, now, req)
		}
		if retry && fallbackLeft(g, req, need, now, deadline) {
			// Only deployments that failed it or cool past its deadline are
			// left here: the fallback group, untried, before any of them.
			if w.last == nil {
				return res.fail(coolingError(cands, earliest(cands), now), w)
			}
			return r.giveUp(res, w, group, now, req)
		}
		cands = r.readers(g, cands, w.per, me, req, need, now, deadline)
		cands = r.tiered(g, cands, w.per, me, req, need, now, deadline)
		ready := readyFirst(cands, now)
		free := ready
		if ready > 0 && !g.queue.first(me, req.Priority) {
			// Others wait before it: it may go only past a head blocked for
			// capacity of its own, to deployments that head does not wait for.
			ready = 0
			if waitsFor, blocked := g.queue.headBlocked(me, now); blocked {
				ready = bypass(cands, free, waitsFor)
			}
		}
		if ready == 0 {
			if free == 0 && recovering(cands, w.per, now) && fallbackLeft(g, req, need, now, deadline) {
				// Its deployments cool down after failures, or failed this
				// request: the fallback group, rather than a wait for a
				// retry that may fail again.
				return res.fail(coolingError(cands, earliest(cands), now), w)
			}
			if me == nil {
				var limit int
				if me, limit = r.joinQueue(g, req, need, now, deadline); me == nil {
					return res.fail(queueFullError(g, cands, limit, now), w)
				}
				// Its tiers and its turn again, from its place: others
				// may have joined the queue since it chose them.
				continue
			}
			if err := r.wait(ctx, g, me, cands, free, w, need, now, deadline); err != nil {
				if _, late := err.(*Error); late && !retry && !w.widen && !fallbackLeft(g, req, need, now, deadline) {
					// Those it has not tried cannot serve it before its
					// deadline, and no fallback group is left: those it
					// failed on may.
					w.widen = true
					continue
				}
				return res.fail(err, w)
			}
			continue
		}
		if me != nil && g.Fleet != nil {
			// Its turn in the fleet's queue, not only in this instance's.
			if ok, err := r.fleetTurn(ctx, g, me, cands[:ready], need, now, deadline); err != nil {
				return res.fail(err, w)
			} else if !ok {
				continue
			}
		}
		k := probe(cands[:ready])
		if k < 0 && req.Prefer != nil {
			k = r.preferred(group, cands[:ready], req)
		}
		if k < 0 {
			r.score(group, cands[:ready])
			k = r.pick(group, cands[:ready])
		}
		i, d := cands[k].i, group[cands[k].i]
		if ce := r.Logger.Check(zapcore.DebugLevel, "routing decision"); ce != nil {
			ce.Write(zap.Int("attempt", res.Attempts+1), zap.String("chose", d.Name),
				zap.String("candidates", describe(group, cands, now)))
		}
		a, ok := r.plan(ctx, d, req, deadline)
		if ok && req.resume != nil && a.out.format != req.resume.format {
			// A resume reads on in the stream's format.
			a.finish()
			a.out.obs = provider.NewObservation(provider.ClientError)
			a.out.obs.Message = "the deployment answers in " + a.out.format.String() + ", the stream is in " + req.resume.format.String()
			ok = false
		}
		if !ok {
			w.per[i].excluded, w.unplanned = true, a.out
			continue
		}
		// Its worst case held of its budgets before it is sent.
		held, refused := r.hold(d, g, req, now)
		if refused != nil {
			a.finish()
			if !refused.group {
				// Its deployment's budget cannot take it: another may.
				w.per[i].excluded, w.budget = true, refused
				continue
			}
			if err := r.waitBudget(ctx, g, &me, req, need, refused, now, deadline); err != nil {
				return res.fail(err, w)
			}
			continue
		}
		a.out.holds = held
		// Claimed only for an attempt that goes out: a request the
		// provider cannot express spends none of its windows.
		if me != nil {
			me.taking.Store(true)
			// Out of the fleet's queue before it spends, as out of this
			// instance's places (taking): never counted twice.
			leaveFleet(g, me)
		}
		claim, ok := d.State.AcquireFor(now, need)
		if !ok {
			if me != nil {
				me.taking.Store(false) // back in its place (in the fleet's at its next look)
			}
			held.release(now, d, g)
			a.finish()
			continue // a half-open circuit's probe was taken meanwhile, or the fleet's budget
		}
		if me != nil {
			g.queue.served(me)
			res.Waited += r.leaveQueue(g, me) // its turn came: the next one may look
			me = nil
		}
		a.out.claim, a.out.queue, a.out.group, a.out.prefixes = claim, &g.queue, g, need.Prefixes
		r.logPending(w, d)
		from := provider.OK
		if last := cmp.Or(w.last, w.prior); last != nil {
			from = last.obs.Class
		}
		a.out.span = startSpan(ctx, d, req, a.plan, res.Attempts+1, from, r.Clock.Now().Sub(res.lastEnd))
		res.Attempts++
		w.per[i].tried = true
		var xbuf [2]exchanged
		outs := r.exchange(ctx, g, req, res, w, i, a, need, deadline, xbuf[:0])
		res.lastEnd = r.Clock.Now()
		if last := cmp.Or(w.last, w.prior); last != nil {
			last.d.State.RecordFailover(last.obs.Class)
			if r.Observer != nil {
				r.Observer.Failover(last.d, last.obs.Class)
			}
		}
		w.prior = nil
		for _, e := range outs {
			if done := r.settle(res, w, req, e.i, e.out); done {
				return res
			}
		}
	}
}

// joinQueue puts req in this instance's queue of g unless it is full
// (the fleet's queue at its first look: wait) and returns its place; nil
// and the queue's bound (max_queued) when it is full.
func (r *Router) joinQueue(g *Group, req *Request, need capacity.Need, now, deadline time.Time) (*waiter, int) {
	me := &waiter{priority: req.Priority, tokens: req.Tokens, reserve: need.Reserve, since: now, deadline: deadline}
	if g.Fleet == nil {
		// The fleet's queue orders by arrival alone: so does this one then.
		me.consumer, me.weight = req.Consumer, req.Weight
	}
	if limit := g.maxQueued(r.Deadline); !g.queue.join(me, limit) {
		r.debug("the group's queue is full", zap.String("group", g.Name), zap.Int("max_queued", limit))
		return nil, limit
	}
	r.observeQueue(g)
	return me, 0
}

// probe returns the first candidate whose half-open circuit waits for its
// probe, -1 when none does: a deployment that failed ranks low on
// reliability, and would never be found back if its probe had to win the
// ranking.
func probe(cands []scored) int {
	for k := range cands {
		if cands[k].f.Probe {
			return k
		}
	}
	return -1
}

// leaveQueue takes me out of g's queue and reports its wait, if it waited
// (a request answered 429 when it joined did not), and returns it (0
// when it did not).
func (r *Router) leaveQueue(g *Group, me *waiter) (waited time.Duration) {
	g.queue.leave(me)
	leaveFleet(g, me)
	me.mu.Lock()
	slept := me.slept
	me.mu.Unlock()
	if slept {
		waited = r.Clock.Now().Sub(me.since)
		g.waits.Add(1)
		g.waited.Add(int64(waited))
		if r.Observer != nil {
			r.Observer.QueueWait(g, waited)
		}
	}
	if r.Observer != nil {
		r.Observer.Queue(g, g.Queued())
	}
	return waited
}

func (r *Router) observeQueue(g *Group) {
	if r.Observer != nil {
		r.Observer.Queue(g, g.Queued())
	}
}

// settle folds an attempt's outcome into the request and the deployment's
// state: it reports whether the request is answered (res is set).
func (r *Router) settle(res *Result, w *walk, req *Request, i int, out *outcome) bool {
	d := out.d
	switch out.end {
	case clientGone, pastDeadline:
		if out.end == pastDeadline && out.took >= r.Deadline/2 {
			// It ran out most of the request's deadline without an
			// answer: a hang, a failure as a timeout is (by default no
			// timeout is set, and the deadline is the only bound).
			d.State.ObserveAttempt(out.claim, r.Clock.Now(), out.obs, r.Policy)
		}
		if out.stream == nil {
			r.chargeLeft(out)
			out.release(r.Clock.Now()) // the attempt ended unobserved
		}
		endSpan(out.span, provider.Transport, map[ending]string{clientGone: "the client went away", pastDeadline: "the request's deadline passed"}[out.end],
			provider.Usage{}, false, nil, "")
		if out.end == clientGone {
			res.fail(ErrClientGone, w)
		} else {
			res.fail(deadlineError(), w)
		}
		return true
	}
	out.redact(d.Secrets)
	class := out.obs.Class
	if r.Observer != nil {
		r.Observer.Attempt(d, class, out.took)
	}
	observed := d.State.ObserveAttempt(out.claim, r.Clock.Now(), out.obs, r.Policy)
	if observed.Learned && out.queue != nil {
		out.queue.kickAllBut(nil) // forecasts that could not tell may now
	}
	if out.stream == nil {
		defer out.release(r.Clock.Now()) // after its answer is spent; a stream releases when it ends
	}
	switch class {
	case provider.OK:
		res.Deployment, res.Format = d, out.format
		res.Status, res.Body, res.Stream = out.status, out.body, out.stream
		if out.stream == nil {
			if res.Usage, res.UsageStated = provider.UsageOf(out.format, out.body); res.UsageStated {
				r.spend(r.Clock.Now(), d, out.group, res.Usage, out.holds)
				d.State.RecordCache(r.Clock.Now(), out.prefixes, res.Usage)
			}
			if out.span != nil { // the answer read again only for a trace
				model, _ := jsonbody.GetString(out.body, "model")
				endSpan(out.span, class, "", res.Usage, res.UsageStated, provider.FinishReasons(out.format, out.body), model)
			}
		} else {
			out.stream.span = out.span // ended with the stream
		}
		res.fail(nil, w)
		return true
	case provider.ClientError:
		endSpan(out.span, class, out.obs.Message, provider.Usage{}, false, nil, "")
		if req.refusedBound(out) {
			// It could not read state another organization minted: once
			// more without any of it, elsewhere while another is left.
			r.logFailure(w, out, observed)
			w.last, w.per[i].failed = out, true
			w.failures++
			return false
		}
		res.passOn(out)
		res.fail(nil, w)
		return true
	}
	endSpan(out.span, class, out.obs.Message, provider.Usage{}, false, nil, "")
	if class == provider.RateLimited {
		r.unpredicted(out)
	}
	r.logFailure(w, out, observed)
	w.last = out
	switch class {
	case provider.ContextLength:
		w.per[i].excluded = true
		w.minContext = max(w.minContext, d.ContextWindow)
	case provider.TooLarge:
		// Larger than its window's whole limit: elsewhere, or the 413. It
		// failed nothing (no cooldown) and was certain: no attempt spent.
		w.per[i].excluded, w.per[i].tooLarge = true, true
		res.refused++
	case provider.Auth, provider.QuotaExhausted:
		w.per[i].excluded = true
		w.failures++
		res.refused++ // certain, and the deployment is out: no attempt spent
		if class == provider.QuotaExhausted {
			w.limited++
		}
	case provider.RateLimited:
		w.per[i].failed = true
		w.failures++
		w.limited++
	default:
		if out.end == timedOut {
			w.per[i].silent = true
		}
		w.per[i].failed = true
		w.failures++
	}
	return false
}

// attemptsLeft reports whether res may make another attempt: MaxAttempts
// bounds those made, less the certain refusals (a revoked key, a spent
// quota, too_large), which another deployment's attempt must not pay for. Each
// deployment refuses a request once at most (it is then excluded), so the
// attempts stay bounded by MaxAttempts plus the number of deployments.
func (r *Router) attemptsLeft(res *Result) bool {
	return res.Attempts-res.refused < r.MaxAttempts
}

// fallbackLeft reports whether the walk of g may go on to g's fallback
// group when g has nothing better left for req: whether that group, or one
// after it, has a deployment that serves req's format and may take it
// before its deadline (a fallback cooling past it is no way out). A
// request pinned to one deployment, or a resume's (it stays in the
// stream's group), has none.
func fallbackLeft(g *Group, req *Request, need capacity.Need, now, deadline time.Time) bool {
	if g.Fallback == nil || req.Pinned != nil || req.resume != nil {
		return false
	}
	var f capacity.Features
	for hop := range g.Fallback.Chain() {
		if over, _ := hop.Spending.Over(now); over {
			continue
		}
		for _, d := range hop.Deployments {
			if !d.Provider.Serves(req.Format) || !req.fitsContext(d) {
				continue
			}
			d.State.ReadFeaturesFor(&f, now, need, req.Stream)
			if !f.Disabled && !f.TooLarge && f.At.Before(deadline) {
				return true
			}
		}
	}
	return false
}

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

// fail ends the request with err (nil: an answer), noting why the last
// attempt failed.
func (res *Result) fail(err error, w *walk) *Result {
	res.Err = err
	if w.last != nil {
		res.FailoverReason = w.last.obs.Class
	}
	return res
}

// logFailure notes a failed attempt for the log. A bad key or a spent
// quota is an operator's problem: logged at error level, once, when its
// circuit opens (logDisabled). Any other failure is logged when what
// follows it is known (logPending): another attempt, or none.
func (r *Router) logFailure(w *walk, out *outcome, observed capacity.Observed) {
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

// giveUp ends a request whose attempts or eligible deployments ran out.
func (r *Router) giveUp(res *Result, w *walk, group []*Deployment, now time.Time, req *Request) *Result {
	switch {
	case w.last != nil && w.last.obs.Class == provider.ContextLength && !r.largerWindowLeft(w, group, req):
		res.passOn(w.last) // the provider's 400, as it is: no deployment could take the prompt
		return res.fail(nil, w)
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
		if !d.Provider.Serves(req.Format) {
			continue
		}
		switch p := w.per[i]; {
		case p.tooLarge:
			_, l := d.State.FitsTokens(req.Tokens)
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
		if !w.per[i].excluded && d.Provider.Serves(req.Format) && (d.ContextWindow == 0 || d.ContextWindow > w.minContext) {
			return true
		}
	}
	return false
}

// passOn makes a provider's client error the answer, as it is.
func (res *Result) passOn(o *outcome) {
	res.Deployment, res.Format = o.d, o.format
	res.Status = o.status
	if o.native {
		res.Body = o.body
	}
	obs := o.obs
	res.Error = &obs
}

// candidates collects into buf the deployments still eligible for the
// request of walk w, with their features. The retries (deployments that
// failed this request or cool past its deadline) are left out while any
// other remains, unless w.widen, and those that timed out on it (silent)
// while any retry remains; retry reports that retries are in.
func candidates(buf []scored, group []*Deployment, w *walk, now, deadline time.Time, req *Request, need capacity.Need) (cands []scored, retry bool) {
	cands = buf
	per, minContext := w.per, w.minContext
	pass := 0
	if w.widen {
		pass = 1
	}
	for ; pass < 3 && len(cands) == 0; pass++ {
		retry = pass > 0
		for i, d := range group {
			if per[i].excluded || !retry && per[i].failed || pass < 2 && per[i].silent || !d.Provider.Serves(req.Format) ||
				req.Pinned != nil && d != req.Pinned || req.resume != nil && req.resume.allow != nil && !req.resume.allow(d) {
				continue
			}
			if minContext >= 0 && d.ContextWindow != 0 && d.ContextWindow <= minContext {
				// Known to be no larger than one that was too small. An unknown
				// window may be larger: worth an attempt.
				continue
			}
			if !req.fitsContext(d) {
				per[i].tooSmall = true // the pre-check: it cannot take the request
				continue
			}
			cands = append(cands, scored{i: i, cost: estimateCost(d, req)})
			f := &cands[len(cands)-1].f
			d.State.ReadFeaturesFor(f, now, need, req.Stream)
			per[i].tooLarge = per[i].tooLarge || f.TooLarge // no wait would let it through there
			if f.Disabled || f.TooLarge || !retry && !f.At.Before(deadline) {
				cands = cands[:len(cands)-1] // drained by an operator, too large, or a retry
			}
		}
	}
	return cands, retry
}

// Serves reports whether the group, or one of its fallback groups, has a
// deployment that serves requests in format f at all.
func (g *Group) Serves(f provider.Format) bool {
	for hop := range g.Chain() {
		if Serves(hop.Deployments, f) {
			return true
		}
	}
	return false
}

// Chain yields g, then its fallback groups in turn, MaxFallbacks of them
// at most.
func (g *Group) Chain() iter.Seq[*Group] {
	return func(yield func(*Group) bool) {
		for hop, hops := g, 0; hop != nil && hops <= MaxFallbacks; hop, hops = hop.Fallback, hops+1 {
			if !yield(hop) {
				return
			}
		}
	}
}

// Serves reports whether some deployment of group serves requests in
// format f at all (see provider.Provider.Serves).
func Serves(group []*Deployment, f provider.Format) bool {
	for _, d := range group {
		if d.Provider.Serves(f) {
			return true
		}
	}
	return false
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
		msg = "every deployment of this model is out: its provider refused the router's key for it (401 or 403); an operator must fix the key, and a retry does not help"
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
// those that could not take the request).
func (r *Router) finalError(w *walk, group []*Deployment, now time.Time, req *Request) *Error {
	if w.last == nil {
		drained := false
		for _, d := range group {
			if d.Provider.Serves(req.Format) {
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
		at, why := d.State.AvailableAt(now, req.Tokens)
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
	if tried < len(group) {
		msg = fmt.Sprintf("the deployments tried (%d of %d) failed; retry later", tried, len(group))
	}
	return &Error{Status: http.StatusBadGateway, Class: provider.Server, Message: msg}
}

// Cost is what an answer that used u cost on d, in USD, as its provider
// bills it: the input tokens read from the prompt cache at CostCached,
// those written to it at CostCacheWrite (its one-hour lifetime at
// CostCacheWrite1h), the rest of the input at CostInput, and the output
// tokens at CostOutput, all per 1M tokens. The parts are bounded by the
// whole: a provider's garbage never prices a token twice.
func (d *Deployment) Cost(u provider.Usage) float64 {
	input := max(u.InputTokens, 0)
	cached := min(max(u.CachedInputTokens, 0), input)
	written := min(max(u.CacheWriteTokens, 0), input-cached)
	hour := min(max(u.CacheWrite1hTokens, 0), written)
	return (float64(input-cached-written)*d.CostInput + float64(cached)*d.CostCached +
		float64(written-hour)*d.CostCacheWrite + float64(hour)*d.CostCacheWrite1h +
		float64(max(u.OutputTokens, 0))*d.CostOutput) / 1e6
}

// Spend records what an answer of d, for group g (nil: none), used when
// the router learns it outside an attempt (a background response's usage,
// at the poll that finds it done): in d's usage and, at its cost, against
// d's budget and g's, as spend does, with nothing held.
func (r *Router) Spend(d *Deployment, g *Group, u provider.Usage) {
	r.spend(r.Clock.Now(), d, g, u, holds{})
}

// spend records what an answer of d, for group g, used: in d's usage and,
// at its cost, against d's budget and g's, settling what the attempt held
// of them (h); a deployment whose budget it spends is out until that
// renews.
func (r *Router) spend(now time.Time, d *Deployment, g *Group, u provider.Usage, h holds) {
	cost := d.Cost(u)
	d.State.RecordUsage(now, u, cost)
	if d.Spending != nil {
		d.Spending.Settle(now, h.d, cost)
		r.checkBudget(d, now)
	}
	if g != nil && g.Spending != nil {
		was, _ := g.Spending.Over(now)
		if over, until := g.Spending.Settle(now, h.g, cost); over && !was {
			r.Logger.Warn("model group budget spent: its requests are answered 429 until it renews",
				zap.String("group", g.Name), zap.String("budget", capacity.BudgetMessage(g.Spending.Limit(), until)))
		}
	}
}

// chargeLeft spends what a non-stream attempt the router left before
// its answer (its client gone, its deadline past, a hedge's loser) is
// charged, as a stream left so is (Stream.charge): its prompt and
// max_tokens (out.left). Its provider billed the prompt and may have
// generated on (PROVIDERS.md: Billing).
func (r *Router) chargeLeft(out *outcome) {
	if out.stream == nil && out.left != (provider.Usage{}) {
		r.spend(r.Clock.Now(), out.d, out.group, out.left, out.holds)
	}
}

// checkBudget tells d's State whether its budget is spent at now (it may
// have been raised by a reload, or spent by another instance of a fleet),
// and logs the moment it becomes spent. A deployment without a budget has
// nothing to check (the config that removed one cleared it at load).
func (r *Router) checkBudget(d *Deployment, now time.Time) {
	if d.Spending == nil {
		return
	}
	over, until := d.Spending.Over(now)
	if !over {
		d.State.BudgetSpent(now, time.Time{}, "")
		return
	}
	msg := capacity.BudgetMessage(d.Spending.Limit(), until)
	if d.State.BudgetSpent(now, until, msg) {
		r.Logger.Warn("deployment budget spent: it is skipped until it renews", zap.String("deployment", d.Name), zap.String("budget", msg))
	}
}
