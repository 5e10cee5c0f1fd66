package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Bounds on what is read from a provider.
const (
	maxErrorBody    = 64 << 10 // error bodies: enough for any provider's JSON error
	maxResponseBody = 32 << 20 // a non-streaming answer
)

var (
	errAttemptTimeout = errors.New("provider timeout")
	errRequestTimeout = errors.New("request deadline")
	errIdleTimeout    = errors.New("stream idle timeout")
)

// outcome is the result of one attempt.
type outcome struct {
	d      *Deployment
	obs    provider.Observation
	status int
	header http.Header
	body   []byte
	stream *Stream
	took   time.Duration // until the answer was read, or a stream's first content
	native bool          // the request went in the client's own format (adapters.Native)
	// untranslatable: the adapter could not express the request; no
	// exchange happened.
	untranslatable bool
	timeout        bool // the provider's own timeout ended it (a silent deployment)
	deadline       bool // the request's deadline ended it
	canceled       bool // the client went away
}

func (o *outcome) clientError() bool {
	return o.obs.Class == provider.ClientError || o.obs.Class == provider.ContextLength
}

// exchange makes one attempt on d. Its time limit is the smaller of the
// deployment's own (timeout, or ttft_timeout for a stream until its first
// event) and what is left until the request's deadline; which of the two
// ended it decides between a failover (the provider's fault) and a 504.
func (r *Router) exchange(parent context.Context, d *Deployment, req *Request, deadline time.Time) *outcome {
	limit, cause := d.Timeout, errAttemptTimeout
	if req.Stream && d.TTFTTimeout > 0 {
		limit = d.TTFTTimeout
	}
	if left := deadline.Sub(r.Clock.Now()); limit <= 0 || left <= limit {
		limit, cause = left, errRequestTimeout
	}
	began := time.Now()
	ctx, cancel := context.WithCancelCause(parent)
	timer := time.AfterFunc(limit, func() { cancel(cause) })
	finish := func() {
		timer.Stop()
		cancel(nil)
	}

	out := &outcome{d: d}
	fail := func(class provider.Class, err error) *outcome {
		finish()
		out.took = time.Since(began)
		switch {
		case parent.Err() != nil:
			out.canceled = true
		case errors.Is(context.Cause(ctx), errRequestTimeout):
			out.deadline = true
		case errors.Is(context.Cause(ctx), errAttemptTimeout):
			out.timeout = true
		}
		out.obs = provider.NewObservation(class)
		out.obs.Message = err.Error()
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			out.obs.Message = cause.Error()
		}
		return out
	}

	var upReq *http.Request
	var err error
	native, nativeOK := d.Adapter.(adapters.Native)
	out.native = nativeOK && req.NativeFormat != "" && native.NativeFormat() == req.NativeFormat
	switch {
	case req.Kind == Embeddings:
		upReq, err = d.Adapter.(adapters.Embedder).EmbeddingsRequest(ctx, d.Endpoint, d.Model, req.Body)
	case out.native:
		upReq, err = native.NativeRequest(ctx, d.Endpoint, d.Model, req.NativeBody, req.NativeHeader, req.Stream)
	default:
		upReq, err = d.Adapter.ChatRequest(ctx, d.Endpoint, d.Model, req.Body, req.Stream)
	}
	if err != nil {
		// This deployment's adapter cannot express the request (n > 1 for
		// Anthropic, say); another deployment may.
		finish()
		out.untranslatable = true
		out.obs = provider.NewObservation(provider.ClientError)
		out.obs.Message = err.Error()
		out.status = http.StatusBadRequest
		out.body = clientErrorBody(err.Error())
		return out
	}
	resp, err := d.Transport.RoundTrip(upReq)
	if err != nil {
		return fail(provider.Transport, err)
	}
	out.status, out.header = resp.StatusCode, resp.Header
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		if err != nil && len(body) == 0 {
			return fail(provider.Transport, err)
		}
		finish()
		out.took = time.Since(began)
		out.body = body
		out.obs = d.Adapter.Observe(resp.StatusCode, resp.Header, body, r.Clock.Now())
		if t, ok := d.Adapter.(adapters.ErrorTranslator); ok && !out.native && out.clientError() {
			// Passed on to the client: in the client's (OpenAI) format.
			out.body = t.ChatError(resp.StatusCode, body)
			out.header = http.Header{"Content-Type": {"application/json"}}
		}
		return out
	}
	if !req.Stream {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
		resp.Body.Close()
		if err != nil {
			return fail(provider.Transport, err)
		}
		finish()
		out.took = time.Since(began)
		if len(body) > maxResponseBody {
			out.obs = provider.NewObservation(provider.Server)
			out.obs.Message = "answer larger than 32 MiB"
			return out
		}
		out.obs = d.Adapter.Observe(resp.StatusCode, resp.Header, nil, r.Clock.Now())
		switch {
		case req.Kind == Embeddings:
			out.body, err = d.Adapter.(adapters.Embedder).EmbeddingsResponse(body)
		case out.native:
			// Checked by translating, but passed on as it came.
			if _, err = d.Adapter.ChatResponse(body); err == nil {
				out.body = body
			}
		default:
			out.body, err = d.Adapter.ChatResponse(body)
			if err == nil {
				out.body = nameModel(out.body, d.Model)
			}
		}
		if err != nil {
			out.obs = provider.NewObservation(provider.Server)
			out.obs.Message = "untranslatable answer: " + err.Error()
		} else {
			d.State.RecordLatency(out.took, 0)
		}
		return out
	}

	// A stream: read until the first event that is content. Comments and
	// pings do not count; an error event before any content is a failure
	// like an error status, and the router may still fail over.
	out.obs = d.Adapter.Observe(resp.StatusCode, resp.Header, nil, r.Clock.Now())
	s := &Stream{
		r: r, d: d, choices: req.Choices, includeUsage: req.IncludeUsage, body: resp.Body, sse: provider.NewSSEReader(resp.Body), dec: d.Adapter.NewStreamDecoder(),
		ctx: ctx, cancel: cancel, timer: timer, native: out.native,
	}
	for {
		ev, err := s.sse.Next()
		if err != nil {
			resp.Body.Close()
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // no content at all is no answer
			}
			return fail(provider.Transport, err)
		}
		data, kind, obs := s.dec.Event(ev)
		switch kind {
		case provider.EventSkip:
			if s.native && !ev.Comment {
				// message_start, ping...: the client needs them, but only
				// once this attempt is chosen.
				if len(s.pending)+len(ev.Data) > provider.MaxEventSize {
					resp.Body.Close()
					return fail(provider.Server, errors.New("too much before the first content"))
				}
				s.pending = append(s.pending, frame(nil, ev)...)
			}
			continue
		case provider.EventError, provider.EventDone:
			resp.Body.Close()
			finish()
			out.took = time.Since(began)
			if kind == provider.EventDone {
				obs = provider.NewObservation(provider.Server)
				obs.Message = "stream ended before any content"
			}
			out.obs = obs
			return out
		}
		// Committed: from now on silence is bounded by idle_timeout, and the
		// request deadline no longer applies.
		if s.native {
			s.first = frame(s.pending, ev)
		} else {
			s.first = append([]byte(nil), data...)
		}
		s.count(data, kind)
		timer.Stop()
		s.idle = time.AfterFunc(time.Hour, func() { cancel(errIdleTimeout) })
		s.idle.Stop()
		out.took = time.Since(began)
		d.State.RecordLatency(0, out.took)
		if r.Observer != nil {
			r.Observer.FirstToken(d, out.took)
		}
		out.stream = s
		return out
	}
}

// Stream is a streaming answer whose first content event has arrived: the
// deployment is chosen, and what follows is relayed as it comes.
type Stream struct {
	r      *Router
	d      *Deployment
	body   io.ReadCloser
	sse    *provider.SSEReader
	dec    adapters.StreamDecoder
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer // the attempt's timeout, stopped at commit
	idle   *time.Timer // idle_timeout between events
	// What completeness needs of the request (not the request itself, so
	// that a long stream does not keep the prompt in memory).
	choices      int
	includeUsage bool
	native       bool   // relaying the provider's own events (the client's format)
	pending      []byte // native: frames before the first content
	first        []byte
	finals       int  // events that finished a choice
	usage        bool // a chunk carried usage
	once         sync.Once
}

// count notes what a relayed event says about the stream's completeness.
func (s *Stream) count(data []byte, kind provider.EventKind) {
	if kind == provider.EventFinal {
		s.finals++
	}
	// An escaped quote inside content never reads as this key.
	if !s.usage && bytes.Contains(data, []byte(`"usage":{`)) {
		s.usage = true
	}
}

// complete reports whether everything the client asked for has arrived, so
// a missing "[DONE]" can be supplied: every choice finished, and usage too
// when it was asked for.
func (s *Stream) complete() bool {
	trails := false
	if t, ok := s.dec.(adapters.UsageTrailer); ok {
		trails = t.UsageTrails()
	}
	return s.finals >= max(s.choices, 1) && (s.usage || !s.includeUsage || !trails)
}

// Close releases the upstream stream and the deployment's claim; Relay
// calls it.
func (s *Stream) Close() {
	s.once.Do(func() {
		s.d.State.Release()
		s.timer.Stop()
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

// Native reports whether the stream relays the provider's own events (the
// client's format, see adapters.Native) rather than Chat Completions chunks.
func (s *Stream) Native() bool { return s.native }

// Relay sends the stream to the client: event writes each chunk's JSON (in
// native mode: each raw SSE frame, "event: ...\ndata: ...\n\n") or, with
// done, the end of the stream, and flushes it. done comes once, after a
// terminator ([DONE]; native: after the terminator's own frame, or instead
// of it when the stream was complete without one). It returns nil when the
// stream completed, a *StreamError when the provider failed mid-stream (the
// caller ends the client's stream with an in-band error, never with a
// terminator), or the write error when the client went away.
func (s *Stream) Relay(event func(data []byte, done bool) error) error {
	defer s.Close()
	// The first content may be progress with nothing to relay (a thinking
	// delta for a Chat Completions client).
	if len(s.first) > 0 {
		if err := event(s.first, false); err != nil {
			return err
		}
	}
	idle := s.d.IdleTimeout
	for {
		if idle > 0 {
			s.idle.Reset(idle)
		}
		ev, err := s.sse.Next()
		if idle > 0 {
			s.idle.Stop()
		}
		if err != nil {
			if err == io.EOF && s.complete() {
				// Complete but without "[DONE]": finish it for the client.
				return event(nil, true)
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
		data, kind, obs := s.dec.Event(ev)
		if s.native && kind != provider.EventError && !ev.Comment {
			s.count(data, kind)
			if err := event(frame(nil, ev), false); err != nil {
				return err
			}
			if kind == provider.EventDone {
				return event(nil, true)
			}
			continue
		}
		switch kind {
		case provider.EventSkip:
			continue
		case provider.EventDone:
			return event(nil, true)
		case provider.EventError:
			msg := obs.Message
			if msg == "" {
				msg = "provider error mid-stream"
			}
			return s.failed(obs, "stream failed: "+msg)
		}
		s.count(data, kind)
		if len(data) == 0 {
			continue // progress with nothing to relay
		}
		if err := event(data, false); err != nil {
			return err
		}
	}
}

func (s *Stream) failed(obs provider.Observation, msg string) error {
	obs.Message = msg
	s.d.State.Observe(s.r.Clock.Now(), obs, s.r.Policy)
	s.r.Logger.Warn("stream failed after it began",
		zap.String("deployment", s.d.Name), zap.String("class", obs.Class.String()), zap.String("message", msg))
	return &StreamError{Class: obs.Class, Message: msg}
}

// frame appends ev as an SSE frame to dst.
func frame(dst []byte, ev *provider.Event) []byte {
	if ev.Name != "" {
		dst = append(append(append(dst, "event: "...), ev.Name...), '\n')
	}
	for _, line := range bytes.Split(ev.Data, []byte("\n")) {
		dst = append(append(append(dst, "data: "...), line...), '\n')
	}
	return append(dst, '\n')
}

// clientErrorBody is an OpenAI error body for a request the router could
// not send.
func clientErrorBody(msg string) []byte {
	b, _ := json.Marshal(map[string]map[string]any{"error": {
		"message": msg, "type": "invalid_request_error", "param": nil, "code": "unsupported_request"}})
	return b
}

// nameModel fills an answer's empty "model" with the deployment's upstream
// model: the client's dashboards attribute tokens by it.
func nameModel(body []byte, model string) []byte {
	if v, ok := adapters.GetString(body, "model"); ok && v != "" {
		return body
	}
	if out, err := adapters.SetString(body, "model", model); err == nil {
		return out
	}
	return body
}
