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
	"math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
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
