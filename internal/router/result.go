package router

import (
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

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

	// others are what the request's attempts that are not its answer were
	// charged (Charged).
	others []Leg

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

// end ends the request with what res holds (an answer, a provider's
// client error passed on, or an error of the router's own), noting why its
// last failed attempt failed (FailoverReason).
func (res *Result) end(w *walk) *Result {
	if w.last != nil {
		res.FailoverReason = w.last.obs.Class
	}
	return res
}

// fail ends the request with err: an *Error of the router's own, or
// ErrClientGone.
func (res *Result) fail(err error, w *walk) *Result {
	res.Err = err
	return res.end(w)
}

// succeed ends the request with o's answer: a whole body, or a committed
// stream.
func (res *Result) succeed(o *outcome, w *walk) *Result {
	res.Deployment, res.Format = o.d, o.format
	res.Status, res.Body, res.Stream = o.status, o.body, o.stream
	return res.end(w)
}

// passOn ends the request with a provider's client error as the answer, as
// it is: its body when it is in the client's format (a native pass), its
// decoded class, code and message (Error) for the client API to restate.
func (res *Result) passOn(o *outcome, w *walk) *Result {
	res.Deployment, res.Format = o.d, o.format
	res.Status = o.status
	if o.native {
		res.Body = o.body
	}
	obs := o.obs
	res.Error = &obs
	return res.end(w)
}

// Charged returns what the request's attempts that are not its answer
// were charged on their deployments, as their budgets were: one the
// router left before its answer (its client gone, its deadline past, a
// hedge's loser), its prompt and max_tokens (the provider billed the
// prompt and went on generating: PROVIDERS.md, "Billing"); a hedge's
// loser that answered anyway, its stated usage; a hedge's losing stream,
// what Stream.Legs charges it. The answer's own usage is Usage or
// Stream.Usage; none when nothing else was charged.
func (res *Result) Charged() []Leg { return res.others }
