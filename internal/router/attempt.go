package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Bounds on what is read from a provider.
const (
	maxErrorBody    = 64 << 10 // error bodies: enough for any provider's JSON error
	maxResponseBody = 32 << 20 // a non-streaming answer
	// maxPending bounds what a native stream may send before its first
	// content (message_start, pings), held until the attempt is chosen.
	maxPending = provider.MaxEventSize
)

var (
	errAttemptTimeout = errors.New("provider timeout")
	errRequestTimeout = errors.New("request deadline")
	errIdleTimeout    = errors.New("stream idle timeout")
)

// ending says how an attempt ended.
type ending uint8

const (
	// answered: the provider answered (any class, in obs).
	answered ending = iota
	// timedOut: the provider's own timeout ended it, a silent deployment
	// (class transport).
	timedOut
	// pastDeadline: the request's deadline ended it.
	pastDeadline
	// clientGone: the client went away.
	clientGone
)

// outcome is the result of one attempt.
type outcome struct {
	d      *Deployment
	end    ending
	obs    provider.Observation
	status int
	body   []byte
	format provider.Format
	native bool // the plan's format is the provider's own: error bodies are in it
	stream *Stream
	claim  capacity.Attempt // when it was sent (what a success speaks for), whether it is the probe
	st     *capacity.State  // the state it claimed (Deployment.stateFor); nil: d.State
	queue  *queue           // the group's queue, woken when the attempt ends
	group  *Group           // the group it was made for
	url    string           // the URL requested, for the logs: scheme, host and path (no query: it may hold a key)
	took   time.Duration    // until the answer was read, or a stream's first content
	span   trace.Span       // the attempt's trace span; nil when the request is not traced
	holds  holds            // what it holds of its budgets until its answer is spent
	left   provider.Usage   // what it costs when the router leaves it before its answer: its prompt and max_tokens
	// prefixes are the request's cache prefixes (capacity.Need.Prefixes),
	// for what its answer reports of the prompt cache.
	prefixes []uint64
}

// claimed records what an attempt took before it is sent: its claim on
// the deployment, the group (and its queue) it was made for, its budget
// holds and the request's cache prefixes (what its answer reports of the
// prompt cache is recorded against them). Every attempt that goes out,
// a hedge's too, is claimed through it.
func (o *outcome) claimed(claim capacity.Attempt, st *capacity.State, g *Group, held holds, need capacity.Need) {
	o.claim, o.st, o.queue, o.group, o.holds, o.prefixes = claim, st, &g.queue, g, held, need.Prefixes
}

// state is the capacity state the attempt claimed, observes and records
// its latency in: its deployment's (Deployment.stateFor).
func (o *outcome) state() *capacity.State {
	if o.st != nil {
		return o.st
	}
	return o.d.State
}

// release ends the attempt's claim on its deployment and its holds on
// budgets (what its answer spent was settled before), and wakes the head
// of its group's queue: capacity may be back.
func (o *outcome) release(now time.Time) {
	o.state().ReleaseAttempt(o.claim)
	o.holds.release(now, o.d, o.group)
	if o.queue != nil {
		o.queue.kickHead()
	}
}

// attempt is one exchange under way: its context, its time limit, when it
// began, and the provider's plan.
type attempt struct {
	r      *Router
	d      *Deployment
	parent context.Context
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  Timer
	began  time.Time
	plan   provider.Plan
	out    *outcome
	stream bool // the request is streamed: its latency is to first content
}

// plan prepares one attempt on d: its clock and time limit, and the
// provider's plan. Its time limit is the smaller of the deployment's own
// (timeout, or ttft_timeout for a stream until its first content) and what
// is left until the request's deadline; which of the two ends it decides
// between a failover (the provider's fault) and a 504. It reports false,
// with the attempt's outcome, when the provider cannot express the request
// (n > 1 for Anthropic, say): nothing is sent, another deployment may.
func (r *Router) plan(parent context.Context, d *Deployment, req *Request, deadline time.Time) (*attempt, bool) {
	a := r.begin(parent, d, req, deadline)
	var err error
	a.plan, err = req.planOn(a.ctx, d)
	if err == nil && (a.plan == nil || a.plan.Request() == nil) {
		err = errors.New("the provider type planned no request") // its bug: try another deployment
	}
	if err != nil {
		a.finish()
		a.out.obs = provider.NewObservation(provider.ClientError)
		a.out.obs.Message = err.Error()
		return a, false
	}
	a.out.format, a.out.native = a.plan.Format(), a.plan.Native()
	a.out.left = provider.Usage{InputTokens: req.PromptTokens, OutputTokens: max(req.OutputTokens, 0)}
	if u := a.plan.Request().URL; u != nil {
		a.out.url = u.Scheme + "://" + u.Host + u.EscapedPath()
	}
	return a, true
}

// exchange sends the planned attempt and reads its answer: an error
// status, a whole answer, or a stream's first content.
func (a *attempt) exchange(req *Request) *outcome {
	resp, err := a.d.Transport.RoundTrip(a.plan.Request())
	if err != nil {
		return a.fail(provider.Transport, err)
	}
	a.out.status = resp.StatusCode
	switch {
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return a.errorAnswer(resp)
	case !req.Stream:
		return a.answer(resp)
	}
	return a.firstContent(resp, req)
}

// begin starts an attempt's clock and timer.
func (r *Router) begin(parent context.Context, d *Deployment, req *Request, deadline time.Time) *attempt {
	now := r.Clock.Now()
	limit, cause := d.Timeout, errAttemptTimeout
	if req.Stream && d.TTFTTimeout > 0 {
		limit = d.TTFTTimeout
	}
	if left := deadline.Sub(now); limit <= 0 || left <= limit {
		limit, cause = left, errRequestTimeout
	}
	a := &attempt{r: r, d: d, parent: parent, began: now, out: &outcome{d: d}, stream: req.Stream}
	a.ctx, a.cancel = context.WithCancelCause(parent)
	a.timer = r.Clock.AfterFunc(limit, func() { a.cancel(cause) })
	return a
}

// finish stops the attempt's timer and releases its context.
func (a *attempt) finish() {
	a.timer.Stop()
	a.cancel(nil)
	a.out.took = a.r.Clock.Now().Sub(a.began)
}

// fail ends the attempt without an answer: the client left, the deadline
// or the provider's timeout passed, or the exchange broke (class).
func (a *attempt) fail(class provider.Class, err error) *outcome {
	a.finish()
	out := a.out
	cause := context.Cause(a.ctx)
	switch {
	case a.parent.Err() != nil:
		out.end = clientGone
	case errors.Is(cause, errRequestTimeout):
		out.end = pastDeadline
		out.tookAtLeast(a.stream)
	case errors.Is(cause, errAttemptTimeout):
		out.end = timedOut
		out.tookAtLeast(a.stream)
	}
	out.obs = provider.NewObservation(class)
	out.obs.Message = err.Error()
	if cause != nil && !errors.Is(cause, context.Canceled) {
		out.obs.Message = cause.Error()
	}
	return out
}

// tookAtLeast records an attempt that ended before it answered (cut by a
// timeout or the deadline, or a hedge the other attempt won) as a
// censored latency sample: its deployment took at least o.took (to its
// first content, for a stream), so that one that hangs, or is slower than
// its peers, stops ranking first (without a timeout, the default, every
// request sent to a hanging one would wait out its deadline).
func (o *outcome) tookAtLeast(stream bool) {
	if stream {
		o.state().RecordAtLeast(0, o.took)
	} else {
		o.state().RecordAtLeast(o.took, 0)
	}
}

// errorAnswer reads an error status: its body says the class and the wait.
func (a *attempt) errorAnswer(resp *http.Response) *outcome {
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	if err != nil && len(body) == 0 {
		return a.fail(provider.Transport, err)
	}
	a.finish()
	a.out.body = body
	a.out.obs = a.d.Provider.Observe(resp.StatusCode, resp.Header, body, a.r.Clock.Now())
	if a.out.obs.Class == provider.OK {
		// A provider type's bug: an error status is no answer. Failing
		// over beats passing the error body on as one.
		a.out.obs.Class = provider.Server
		a.out.obs.Message = fmt.Sprintf("provider type classified status %d as ok", resp.StatusCode)
	}
	return a.out
}

// answer reads a non-streamed success into the plan's format; a body that
// is no answer is the deployment's failure.
func (a *attempt) answer(resp *http.Response) *outcome {
	body, err := readAnswer(resp)
	resp.Body.Close()
	if err != nil {
		return a.fail(provider.Transport, err)
	}
	a.finish()
	out := a.out
	if len(body) > maxResponseBody {
		out.obs = provider.NewObservation(provider.Server)
		out.obs.Message = "answer larger than 32 MiB"
		return out
	}
	out.obs = a.d.Provider.Observe(resp.StatusCode, resp.Header, nil, a.r.Clock.Now())
	if out.body, err = a.plan.Answer(body); err != nil {
		out.obs = provider.NewObservation(provider.Server)
		out.obs.Message = "untranslatable answer: " + err.Error()
		return out
	}
	out.state().RecordLatency(out.took, 0)
	return out
}

// readAnswer reads a whole answer, maxResponseBody+1 bytes at most: into
// one buffer of the length its Content-Length states (within the bound),
// where io.ReadAll grows one from 512 bytes, copying the answer again at
// each step. A Content-Length that is wrong only costs a buffer that grows.
func readAnswer(resp *http.Response) ([]byte, error) {
	r := io.LimitReader(resp.Body, maxResponseBody+1)
	n := resp.ContentLength
	if n <= 0 || n > maxResponseBody {
		return io.ReadAll(r)
	}
	buf := make([]byte, 0, n+1) // +1: room to see the end
	for {
		k, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		switch {
		case err == io.EOF:
			return buf, nil
		case err != nil:
			return buf, err
		case len(buf) == cap(buf): // longer than it said
			rest, err := io.ReadAll(r)
			return append(buf, rest...), err
		}
	}
}

// firstContent reads a stream until its first event of content. Comments
// and pings do not count; an error event before any content is a failure
// like an error status, and the router may still fail over. What a native
// stream sends before (message_start) is held for the client until then.
func (a *attempt) firstContent(resp *http.Response, req *Request) *outcome {
	out := a.out
	out.obs = a.d.Provider.Observe(resp.StatusCode, resp.Header, nil, a.r.Clock.Now())
	wait := &waitFlush{r: resp.Body, cancel: a.cancel} // stream.go
	s := &Stream{r: a.r, format: a.out.format, leg: leg{d: a.d, claim: a.out.claim, holds: a.out.holds, queue: a.out.queue, body: resp.Body,
		in: a.plan.Stream(wait), wait: wait, ctx: a.ctx, cancel: a.cancel, group: a.out.group, prefixes: a.out.prefixes,
		usage:        provider.NewUsageCounter(a.out.format, req.Format == a.out.format && !req.IncludeUsage),
		promptTokens: req.PromptTokens, maxTokens: req.OutputTokens}}
	if s.in == nil {
		resp.Body.Close()
		return a.fail(provider.Server, errors.New("the provider type reads no stream"))
	}
	for {
		ev, kind, obs, err := s.in.Next()
		if err != nil {
			resp.Body.Close()
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // no content at all is no answer
			}
			return a.fail(provider.Transport, err)
		}
		switch kind {
		case provider.EventSkip:
			if s.pendingBytes += len(ev.Data); s.pendingBytes > maxPending {
				resp.Body.Close()
				return a.fail(provider.Server, errors.New("too much before the first content"))
			}
			if len(ev.Data) > 0 {
				s.pending = append(s.pending, provider.Event{Name: ev.Name, Data: append([]byte(nil), ev.Data...)})
			}
			continue
		case provider.EventError, provider.EventDone:
			resp.Body.Close()
			a.finish()
			if kind == provider.EventDone {
				obs = provider.NewObservation(provider.Server)
				obs.Message = "stream ended before any content"
			}
			out.obs = obs
			return out
		}
		// Committed: from now on silence is bounded by idle_timeout, and the
		// request deadline no longer applies.
		a.timer.Stop()
		s.first = provider.Event{Name: ev.Name, Data: append([]byte(nil), ev.Data...)}
		out.took = a.r.Clock.Now().Sub(a.began)
		out.state().RecordLatency(0, out.took)
		if a.r.Observer != nil {
			a.r.Observer.FirstToken(a.d, out.took)
		}
		out.stream = s
		return out
	}
}
