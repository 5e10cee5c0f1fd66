package router

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// Stream is a streaming answer whose first content has arrived: the
// deployment is chosen, and what follows is relayed as it comes, in the
// plan's format (Result.Format).
type Stream struct {
	r      *Router
	d      *Deployment
	claim  capacity.Attempt
	queue  *queue
	body   io.ReadCloser
	in     provider.Stream
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   Timer // idle_timeout between content events, made by the first Relay wait
	// idleLeft is what is left of idle_timeout since the last content.
	idleLeft time.Duration
	// pending holds what came before the first content (a native stream's
	// message_start), at most maxPending bytes; first the first content.
	pending      []provider.Event
	pendingBytes int
	first        provider.Event
	once         sync.Once
	// usage reads the usage of what is relayed, in the stream's format.
	usage *provider.UsageCounter
	// span is the attempt's trace span, ended with the stream (nil: not
	// traced); failure says how the stream broke, if it did.
	span    trace.Span
	failure *provider.Observation
	group   *Group // whose budget the answer counts against
}

// Usage is what the relayed answer used, as its provider counted it
// (whole once Relay returned); ok false when it stated none.
func (s *Stream) Usage() (u provider.Usage, ok bool) { return s.usage.Usage() }

// Close releases the upstream stream and the deployment's claim; Relay
// calls it.
func (s *Stream) Close() {
	s.once.Do(func() {
		u, ok := s.usage.Usage()
		if ok {
			s.r.spend(s.r.Clock.Now(), s.d, s.group, u)
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
			s.idle.Stop()
		}
		s.cancel(nil)
		s.body.Close()
	})
}

// StreamError is an in-band error that ended a stream after it began.
type StreamError struct {
	// Class is the failure's error class.
	Class provider.Class
	// Message says what happened, for the client and the logs (no secrets).
	Message string
}

func (e *StreamError) Error() string { return e.Message }

// Relay sends the stream to the client: event writes each event (valid
// until it returns) or, with done, the end of the stream, and flushes it.
// done comes once: after the terminator (whose own event, when it has one
// to relay, is written first), or when the stream ended complete without
// one. Relay returns nil when the stream completed, a *StreamError when the
// provider failed mid-stream (the caller ends the client's stream with an
// in-band error, never with a terminator), or the write error when the
// client went away.
func (s *Stream) Relay(event func(ev provider.Event, done bool) error) error {
	defer s.Close()
	relay := func(ev provider.Event, done bool) error {
		ev, ok := s.usage.Relay(ev)
		if !ok {
			return nil
		}
		return event(ev, done)
	}
	for _, ev := range s.pending {
		if err := relay(ev, false); err != nil {
			return err
		}
	}
	s.pending = nil
	// The first content may be progress with nothing to relay (a thinking
	// delta for a Chat Completions client).
	if len(s.first.Data) > 0 {
		if err := relay(s.first, false); err != nil {
			return err
		}
	}
	s.first = provider.Event{}
	for {
		ev, kind, obs, err := s.next()
		if err != nil {
			if err == io.EOF && s.in.Complete() {
				// Complete but without its terminator: finish it for the client.
				return event(provider.Event{}, true)
			}
			cause := context.Cause(s.ctx)
			if errors.Is(cause, context.Canceled) {
				return cause // the client went away
			}
			msg := "stream from the provider was cut"
			if errors.Is(cause, errIdleTimeout) {
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
		if len(ev.Data) > 0 {
			if err := relay(ev, false); err != nil {
				return err
			}
		}
		if kind == provider.EventDone {
			return event(provider.Event{}, true)
		}
	}
}

// next reads the next event, bounded by idle_timeout: the longest the
// provider may take, waiting time only (not the client's), from one
// content event to the next. Keep-alives and pings do not count, so that a
// provider that only sends them cannot hold a client forever.
func (s *Stream) next() (provider.Event, provider.EventKind, provider.Observation, error) {
	idle := s.d.IdleTimeout
	if idle <= 0 {
		return s.in.Next()
	}
	if s.idleLeft <= 0 {
		s.idleLeft = idle
	}
	if s.idle == nil {
		s.idle = s.r.Clock.AfterFunc(s.idleLeft, func() { s.cancel(errIdleTimeout) })
	} else {
		s.idle.Reset(s.idleLeft)
	}
	began := s.r.Clock.Now()
	ev, kind, obs, err := s.in.Next()
	s.idle.Stop()
	if kind == provider.EventData || kind == provider.EventFinal {
		s.idleLeft = idle
	} else if s.idleLeft -= s.r.Clock.Now().Sub(began); s.idleLeft <= 0 {
		s.idleLeft = time.Nanosecond // spent: the next wait ends at once
	}
	return ev, kind, obs, err
}

func (s *Stream) failed(obs provider.Observation, msg string) error {
	obs.Message = redact(msg, s.d.Secrets)
	msg = obs.Message
	s.failure = &obs
	observed := s.d.State.ObserveAttempt(s.claim, s.r.Clock.Now(), obs, s.r.Policy)
	if !s.r.logDisabled(s.d, obs, observed) {
		s.r.Logger.Warn("stream failed after it began",
			zap.String("deployment", s.d.Name), zap.Stringer("class", obs.Class), zap.String("message", msg))
	}
	return &StreamError{Class: obs.Class, Message: msg}
}
