package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/redact"
	"github.com/llmrouter/caddy-llm-router/internal/wire/resume"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Stream is a streaming answer whose first content has arrived: the
// deployment is chosen, and what follows is relayed as it comes, in the
// plan's format (Result.Format). When the provider fails mid-stream, the
// router may resume it on another attempt (see Router.Resume): the
// client reads one answer.
type Stream struct {
	r *Router
	leg
	// pending holds what came before the first content (a native stream's
	// message_start), at most maxPending bytes; first the first content.
	pending      []provider.Event
	pendingBytes int
	first        provider.Event
	once         sync.Once
	format       provider.Format // what the plan relays in: Result.Format

	// What a resume needs (see resume.go): set by ServeGroup once the
	// stream is its answer; req nil when the stream is not resumed.
	req      *Request
	parent   context.Context // the client's request
	attempts int             // attempts the request made, resumes included
	resumes  int             // resumes that took up the stream
	model    string          // the upstream model of the first attempt (ResumeSameModel)
	// transcript is what the client received; splice rewrites a
	// resumed attempt's events for it (nil on the first).
	transcript *resume.Transcript
	splice     *resume.Splice
	// done holds the attempts ended before this one: what each used.
	done []Leg
	// refused holds the deployments that refused a continuation in this
	// request: not asked for another.
	refused []*Deployment
	// textAt is the length of the transcript's text when this attempt
	// took up the stream: what it relayed is what follows.
	textAt int
	// pendingResume is the resume under way, told once it took.
	pendingResume *pendingResume
	// broke is how the stream ended when it broke and was not resumed.
	broke *StreamError
	// sent counts the bytes of event data relayed to the client
	// (Router.MaxStreamBytes).
	sent int64
	// flush sends what was written to the client (FlushWaits); nil: the
	// event callback flushes each event.
	flush func() error
}

// FlushWaits has Relay call flush (which sends what the event callback
// wrote to the client) whenever the stream is about to read from its
// provider, which may wait, and before it takes up a broken stream on
// another attempt: what was written reaches the client before any wait,
// and the events that came in one read of the provider's stream go out in
// one write, as a proxy copies them. The event callback then need not
// flush each event (the end of the stream is still for it to flush). A
// flush that fails ends the stream as a client gone away. Call it before
// Relay.
func (s *Stream) FlushWaits(flush func() error) { s.flush = flush }

// waitFlush is a streamed answer's body as its reader reads it: each read,
// which may wait for the provider, sends what the client was written
// first (Stream.FlushWaits). A read that finds what it needs buffered
// already (an event that came with the one before) is no read of the body.
type waitFlush struct {
	r      io.Reader
	cancel context.CancelCauseFunc // the attempt's: a failed flush ends it
	flush  func() error            // the stream's, set by Stream.next
}

// Read implements io.Reader.
func (w *waitFlush) Read(p []byte) (int, error) {
	if w.flush != nil {
		if err := w.flush(); err != nil {
			w.cancel(context.Canceled) // the client went away, not the provider
			return 0, context.Canceled
		}
	}
	return w.r.Read(p)
}

// Broke returns how the stream ended when its provider failed and it was
// not resumed (the client got the in-band error), nil otherwise; valid
// once Relay returned.
func (s *Stream) Broke() *StreamError { return s.broke }

// Deployment returns the deployment whose attempt the stream ended on: the
// one that answered, or the last to take it up.
func (s *Stream) Deployment() *Deployment { return s.d }

// leg is one attempt's part of a stream: its deployment, claim and
// upstream body.
type leg struct {
	d      *Deployment
	claim  capacity.Attempt
	holds  holds // what the attempt holds of its budgets until it is spent
	queue  *queue
	body   io.ReadCloser
	in     provider.Stream
	wait   *waitFlush // the body as in reads it
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   *idleWatch // idle_timeout between content events, made by the first Relay wait
	// idleLeft is what is left of idle_timeout since the last content.
	idleLeft time.Duration
	// usage reads the usage of what is relayed, in the stream's format.
	usage *provider.UsageCounter
	// What the attempt is charged when its stream does not end whole
	// (see charge): the request's prompt estimate and max_tokens (0:
	// unset), the content events relayed, and whether the provider's
	// stream reached its end.
	promptTokens, maxTokens int64
	contentEvents           int64
	ended                   bool
	// span is the attempt's trace span, ended with the stream (nil: not
	// traced); failure says how the stream broke, if it did.
	span    trace.Span
	failure *provider.Observation
	group   *Group // whose budget the answer counts against
	closed  bool
	// prefixes are the request's cache prefixes (outcome.prefixes).
	prefixes []uint64
}

// Leg is what one attempt of a stream used: the deployment, and its usage
// as its provider stated it (Stated: it stated some), or, for an attempt
// that did not end whole, what it is charged (Stream.charge): the
// router's estimate where its provider stated less.
type Leg struct {
	Deployment *Deployment
	Usage      provider.Usage
	Stated     bool
}

// Usage is what the relayed answer used, summed over its attempts (whole
// once Relay returned); ok false when none stated or estimated any.
func (s *Stream) Usage() (u provider.Usage, ok bool) {
	for _, l := range s.Legs() {
		u = addUsage(u, l.Usage)
		ok = true
	}
	return u, ok
}

// Legs returns what each attempt of the stream used, in order: one for a
// stream that was not resumed (none when its provider stated no usage
// and it ended whole).
func (s *Stream) Legs() []Leg {
	legs := s.done
	if s.usage == nil {
		return legs // the current attempt is counted in done
	}
	if u, ok := s.charge(s.failure == nil); ok {
		_, stated := s.usage.Usage()
		legs = append(legs[:len(legs):len(legs)], Leg{Deployment: s.d, Usage: u, Stated: stated})
	}
	return legs
}

// charge is what the current attempt is charged: what its provider stated
// when its stream ended whole. One that did not is charged at least its
// prompt (the provider's stated input, else the request's estimate) and
// what it relayed (the transcript's text at 4 bytes a token, and at
// least a token per content event); one the router left before its end
// (left: its client went away, a hedge's loser, a resumed answer given
// up, the answer cut at max_stream_bytes) at least max_tokens of output
// too, when the request set it: the provider processed the prompt and
// went on generating until it noticed the closed connection
// (PROVIDERS.md, "Billing"), up to max_tokens. One that broke (a cut, an
// error event, silence) ended on the provider's side: what it relayed.
// ok is false when there is nothing to charge (a whole stream whose
// provider stated no usage).
func (s *Stream) charge(left bool) (provider.Usage, bool) {
	u, ok := s.usage.Usage()
	if s.ended {
		return u, ok
	}
	if !ok || u.InputTokens == 0 {
		u.InputTokens = max(u.InputTokens, s.promptTokens)
	}
	out := s.contentEvents
	if s.transcript != nil {
		out = max(out, int64(len(s.transcript.Text())-s.textAt+3)/4)
	}
	if left {
		out = max(out, s.maxTokens)
	}
	u.OutputTokens = max(u.OutputTokens, out)
	return u, true
}

// Resumes reports how many times the stream was taken up by another
// attempt after its provider failed mid-stream.
func (s *Stream) Resumes() int { return s.resumes }

// PromptTokens is the request's prompt estimate, in tokens (0 when
// unknown): what a translated stream can state of its input before its
// provider's usage comes at the end (a Messages message_start).
func (s *Stream) PromptTokens() int64 { return s.promptTokens }

func addUsage(a, b provider.Usage) provider.Usage {
	return provider.Usage{InputTokens: a.InputTokens + b.InputTokens, CachedInputTokens: a.CachedInputTokens + b.CachedInputTokens,
		CacheWriteTokens: a.CacheWriteTokens + b.CacheWriteTokens, CacheWrite1hTokens: a.CacheWrite1hTokens + b.CacheWrite1hTokens,
		OutputTokens:    a.OutputTokens + b.OutputTokens,
		ReasoningTokens: a.ReasoningTokens + b.ReasoningTokens}
}

// Close releases the upstream stream and the deployment's claim; Relay
// calls it.
func (s *Stream) Close() {
	s.once.Do(s.closeLeg)
}

// closeLeg ends the current attempt: its charge (what it stated, or its
// estimate when it did not end whole) is spent, its span ended, its claim
// released and its body closed. It was left by the router unless it
// failed.
func (s *Stream) closeLeg() { s.closeCharged(s.charge(s.failure == nil)) }

// closeCharged is closeLeg with the attempt's charge u (none: !ok).
func (s *Stream) closeCharged(u provider.Usage, ok bool) {
	if s.closed {
		return // a broken attempt no resume took up: closed then
	}
	s.closed = true
	if ok {
		s.r.spend(s.r.Clock.Now(), s.d, s.group, u, s.holds)
	}
	s.holds.release(s.r.Clock.Now(), s.d, s.group) // what it did not spend
	if stated, ok := s.usage.Usage(); ok {
		// what the provider said of its cache, not the router's estimate
		s.d.State.RecordCache(s.r.Clock.Now(), s.prefixes, stated)
	}
	class, msg := provider.OK, ""
	if s.failure != nil {
		class, msg = s.failure.Class, s.failure.Message
	}
	endSpan(s.span, class, msg, u, ok, s.usage.FinishReasons(), "")
	s.d.State.ReleaseAttempt(s.claim)
	if s.queue != nil {
		s.queue.kickHead() // capacity may be back
	}
	if s.idle != nil {
		s.idle.stop()
	}
	s.cancel(nil)
	s.body.Close()
}

// StreamError is an in-band error that ended a stream after it began.
type StreamError struct {
	// Class is the failure's error class.
	Class provider.Class
	// Message says what happened, for the client and the logs (no secrets).
	Message string
	// Bounded: the router ended the stream at Router.MaxStreamBytes, no
	// failure of its provider; Message says so as it is.
	Bounded bool
	// final: no other attempt is asked (a resumed attempt's answer
	// departed from the client's text, or the stream met its bound).
	final bool
}

func (e *StreamError) Error() string { return e.Message }

// errTooLate ends a resumed attempt that gave the client no new text
// within idle_timeout of the break.
var errTooLate = errors.New("the new answer gave nothing past the text the client already has within idle_timeout")

// owes reports whether the current attempt took up a broken stream and
// has given the client no new text yet.
func (s *Stream) owes() bool { return s.splice != nil && s.splice.Owes() }

// errOwed ends a replay that ended before giving all of the text the
// client has.
var errOwed = errors.New("the new answer ended within the text the client already has")

// Relay sends the stream to the client: event writes each event (valid
// until it returns) or, with done, the end of the stream, and flushes it.
// done comes once: after the terminator (whose own event, when it has one
// to relay, is written first), or when the stream ended complete without
// one. When the provider fails mid-stream, the stream is resumed where
// the router can (Router.Resume): the client reads on, from another
// attempt. Relay returns nil when the stream completed, a *StreamError
// when it broke and was not resumed (the caller ends the client's stream
// with an in-band error, never with a terminator), or the write error when
// the client went away.
func (s *Stream) Relay(event func(ev provider.Event, done bool) error) error {
	defer s.Close()
	for {
		err := s.relayLeg(event)
		var se *StreamError
		if !errors.As(err, &se) {
			return err
		}
		if s.flush != nil && s.flush() != nil {
			return context.Canceled // the client went away
		}
		if se.final || !s.resume(se) {
			s.broke = se
			return err
		}
	}
}

// relay sends one event of the current attempt: read for its usage,
// spliced into what the client has when the attempt took up a broken
// stream, kept in the transcript, without the usage the client did not
// ask for.
func (s *Stream) relay(event func(provider.Event, bool) error, ev provider.Event) error {
	s.usage.Add(ev)
	if s.splice != nil {
		owed := s.owes()
		outs, err := s.splice.Event(ev)
		if owed && !s.owes() {
			s.idleLeft = s.d.IdleTimeout // new text reaches the client: its silence ends here
		}
		return s.sendSpliced(event, outs, err)
	}
	if s.transcript != nil {
		s.transcript.Add(ev)
	}
	return s.send(event, ev)
}

// sendSpliced sends the events a splice let through (outs), then ends the
// attempt on the splice's error (err): its answer cannot be spliced in.
func (s *Stream) sendSpliced(event func(provider.Event, bool) error, outs []provider.Event, err error) error {
	for _, out := range outs {
		s.announce()
		if err := s.send(event, out); err != nil {
			return err
		}
	}
	if err != nil {
		return s.failed(provider.NewObservation(provider.OK), "resumed stream: "+err.Error())
	}
	return nil
}

// send writes one event to the client, without the usage it did not ask
// for, unless it would take the stream past Router.MaxStreamBytes.
func (s *Stream) send(event func(provider.Event, bool) error, ev provider.Event) error {
	ev, ok := s.usage.Hide(ev)
	if !ok {
		return nil
	}
	if limit := s.r.MaxStreamBytes; limit > 0 && s.sent+int64(len(ev.Data)) > limit {
		return s.tooLong(limit)
	}
	s.sent += int64(len(ev.Data))
	ev.Data = redact.Answer(ev.Data, s.d.Secrets) // a key within one event; one split across two is not found
	return event(ev, false)
}

// tooLong ends a stream whose next event would take what the client got
// past limit (Router.MaxStreamBytes): the attempt is closed and what it
// relayed spent, and the client's stream ends with an in-band error, not
// resumed (another attempt would only relay more). Its deployment is not
// failed: a long answer may be what was asked for.
func (s *Stream) tooLong(limit int64) error {
	s.failure = &provider.Observation{Class: provider.Server, Message: "answer cut at max_stream_bytes"}
	s.cutLeg(true) // its provider was still generating
	s.r.Logger.Warn("stream cut at max_stream_bytes", zap.String("deployment", s.d.Name), zap.Int64("max_stream_bytes", limit))
	return &StreamError{Class: provider.Server, Bounded: true, final: true,
		Message: fmt.Sprintf("the answer was cut at the router's max_stream_bytes (%d bytes); ask for a shorter answer (max_tokens)", limit)}
}

// cutLeg ends the current attempt before its end: its charge (charge;
// left: the router left it while its provider generated) is spent and
// kept in done.
func (s *Stream) cutLeg(left bool) {
	u, _ := s.charge(left)
	_, stated := s.usage.Usage()
	s.done = append(s.done, Leg{Deployment: s.d, Usage: u, Stated: stated})
	s.closeCharged(u, true)
	s.usage = nil // counted in done
}

// relayLeg relays the current attempt's stream until it ends.
func (s *Stream) relayLeg(event func(ev provider.Event, done bool) error) error {
	for _, ev := range s.pending {
		if err := s.relay(event, ev); err != nil {
			return err
		}
	}
	s.pending = nil
	// The first content may be progress with nothing to relay (a thinking
	// delta for a Chat Completions client).
	if len(s.first.Data) > 0 {
		s.contentEvents++
		if err := s.relay(event, s.first); err != nil {
			return err
		}
	}
	s.first = provider.Event{}
	for {
		ev, kind, obs, err := s.next()
		if err != nil {
			if err == io.EOF && s.in.Complete() {
				// Complete but without its terminator: finish it for the client.
				s.ended = true
				return s.end(event)
			}
			cause := context.Cause(s.ctx)
			if errors.Is(cause, context.Canceled) {
				return cause // the client went away
			}
			msg := "stream from the provider was cut"
			if errors.Is(cause, errIdleTimeout) {
				if s.owes() {
					// Its provider answers; the resume gave the client nothing in time.
					return s.failed(provider.NewObservation(provider.OK), "resumed stream: "+errTooLate.Error())
				}
				msg = "stream from the provider went silent"
			}
			return s.failed(provider.NewObservation(provider.Transport), msg)
		}
		if kind == provider.EventError {
			msg := obs.Message
			if msg == "" {
				msg = "provider error mid-stream"
			}
			return s.failed(obs, "stream failed: "+msg)
		}
		if kind == provider.EventData {
			s.contentEvents++
		}
		s.ended = kind == provider.EventDone
		if len(ev.Data) > 0 {
			if err := s.relay(event, ev); err != nil {
				return err
			}
		}
		if s.ended {
			return s.end(event)
		}
	}
}

// end finishes the client's stream, after what a resumed attempt's
// splice still held: unless a replay ended before giving all of the text
// the client has.
func (s *Stream) end(event func(provider.Event, bool) error) error {
	if s.splice != nil {
		outs, err := s.splice.End()
		if err := s.sendSpliced(event, outs, err); err != nil {
			return err
		}
		if s.owes() {
			return s.failed(provider.NewObservation(provider.OK), "resumed stream: "+errOwed.Error())
		}
	}
	s.announce()
	return event(provider.Event{}, true)
}

// next reads the next event, bounded by idle_timeout: the longest the
// provider may take, waiting time only (not the client's), from one
// content event to the next. Keep-alives and pings do not count, so that a
// provider that only sends them cannot hold a client forever; nor does a
// resumed attempt's content that gives the client nothing new (a
// replay's repeat of the client's text, a continuation held until it is
// checked): the client's silence is bounded as the provider's.
func (s *Stream) next() (provider.Event, provider.EventKind, provider.Observation, error) {
	if s.wait != nil {
		s.wait.flush = s.flush // this leg's body: a resume put it in place
	}
	idle := s.d.IdleTimeout
	if idle <= 0 {
		return s.in.Next()
	}
	if s.idleLeft <= 0 {
		s.idleLeft = idle
	}
	if s.idle == nil {
		// The watch belongs to this leg: it cancels this leg's attempt
		// even if it fires after a resume put another leg in its place.
		s.idle = newIdleWatch(s.r.Clock, s.cancel, s.idleLeft)
	}
	began := s.r.Clock.Now()
	s.idle.begin(began, s.idleLeft)
	ev, kind, obs, err := s.in.Next()
	if (kind == provider.EventData || kind == provider.EventFinal) && !s.owes() {
		s.idleLeft = idle
	} else if s.idleLeft -= s.r.Clock.Now().Sub(began); s.idleLeft <= 0 {
		s.idleLeft = time.Nanosecond // spent: the next wait ends at once
	}
	s.idle.end(s.idleLeft)
	return ev, kind, obs, err
}

// failed notes how the current attempt's stream broke: obs's class (OK: a
// resumed attempt whose answer could not be spliced in, no fault of its
// deployment) is observed on its deployment.
func (s *Stream) failed(obs provider.Observation, msg string) error {
	obs.Message = redact.String(msg, s.d.Secrets)
	msg = obs.Message
	s.failure = &obs
	if obs.Class == provider.OK {
		s.failure = nil
		s.r.Logger.Info("resumed stream given up", zap.String("deployment", s.d.Name), zap.String("message", msg))
		return &StreamError{Class: provider.Server, Message: msg, final: true}
	}
	observed := s.d.State.ObserveAttempt(s.claim, s.r.Clock.Now(), obs, s.r.Policy)
	if !s.r.logDisabled(s.d, obs, observed) {
		s.r.Logger.Warn("stream failed after it began",
			zap.String("deployment", s.d.Name), zap.Stringer("class", obs.Class), zap.String("message", msg))
	}
	return &StreamError{Class: obs.Class, Message: msg}
}
