package llmrouter

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/llmrouter/caddy-llm-router/internal/api"
)

// The Responses API's WebSocket mode
// (https://developers.openai.com/api/docs/guides/websocket-mode): a GET of
// .../responses that upgrades to a WebSocket, on which the client sends
// {"type":"response.create", ...the body of a POST .../responses...} text
// messages, one turn at a time, and gets each turn's stream events (those of
// the streaming API, one JSON object a message) back. Each turn is routed as
// a streamed POST .../responses would be (the same parse, ranking, capacity
// accounting, pinning, failover before its first event, usage and cost); the
// router reaches the deployment over HTTP streaming. A turn the router
// refuses or cannot serve is an error message in OpenAI's WebSocket shape,
// {"type":"error","status":429,"error":{"type","code","message","param"}},
// and the socket stays open for the next turn.
//
// An upgrade on a connection that cannot be handed over (HTTP/2) is
// answered 426 Upgrade Required in OpenAI's format: Codex CLI falls back to
// HTTP at once on a 426, where it retries a 405 (issue 29). Codex CLI uses this mode when
// its provider sets supports_websockets = true.

// isWebSocketUpgrade reports whether r asks to open a WebSocket (RFC 6455
// section 4.1: a GET with Upgrade: websocket and a Connection that
// includes Upgrade), as Codex CLI does for .../responses when its
// provider supports WebSockets.
func isWebSocketUpgrade(r *http.Request) bool {
	if r.Method != http.MethodGet || !headerHasToken(r.Header, "Upgrade", "websocket") {
		return false
	}
	return headerHasToken(r.Header, "Connection", "upgrade")
}

// headerHasToken reports whether the comma-separated header name holds
// token (case-insensitive).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// serveWebSocket serves WebSocket mode on r, an upgrade of .../responses:
// it accepts the socket (github.com/coder/websocket: the handshake, the
// framing, pings and closes), then serves each response.create message as
// a turn until the client closes the socket or goes away. An upgrade the
// connection cannot take (an HTTP/2 stream, no http.Hijacker) is answered
// 426 Upgrade Required in OpenAI's format, on which Codex CLI falls back to
// HTTP at once (a 405 it retries: issue 29).
func (h *Handler) serveWebSocket(w http.ResponseWriter, r *http.Request, a api.API) {
	if r.ProtoMajor != 1 || !canHijack(w) {
		a.WriteError(w, api.Errorf(http.StatusUpgradeRequired, api.WebSocketRefused, "",
			"this connection cannot serve the Responses API's WebSocket mode (it needs HTTP/1.1): use POST .../responses with \"stream\": true"))
		return
	}
	c, err := websocket.Accept(w, r, nil) // a page on another origin is refused (403)
	if err != nil {
		return // Accept answered the handshake's error itself
	}
	defer c.CloseNow()
	c.SetReadLimit(h.maxBody())
	// The socket is read all along, a turn or not, so that a client that
	// closes it or goes away mid-turn ends the turn (ctx): after the
	// upgrade, the server no longer watches the connection.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	msgs := make(chan wsMessage)
	go func() {
		defer cancel() // closed, gone, or a message over max_body (closed with 1009)
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			select {
			case msgs <- wsMessage{typ, data}:
			case <-ctx.Done():
				return
			}
		}
	}()
	var session api.WSSession
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-msgs:
			if h.serveTurn(ctx, c, r, a, &session, m.typ, m.data) != nil {
				return // the socket is gone
			}
		}
	}
}

// warmup answers a generate false turn itself, as OpenAI does
// (api.WarmupEvents): no provider is asked. It returns the completed event.
func warmup(ctx context.Context, c *websocket.Conn, body []byte, now time.Time) ([]byte, error) {
	created, completed := api.WarmupEvents(body, now)
	if err := c.Write(ctx, websocket.MessageText, created); err != nil {
		return nil, err
	}
	return completed, c.Write(ctx, websocket.MessageText, completed)
}

// wsMessage is one message a client sent.
type wsMessage struct {
	typ  websocket.MessageType
	data []byte
}

// serveTurn serves one client message msg of type typ on c: a turn
// continued from the socket's session and routed, a warm-up answered, or
// an error event. The error returned is the socket's (the client is gone),
// not the turn's.
func (h *Handler) serveTurn(ctx context.Context, c *websocket.Conn, up *http.Request, a api.API, s *api.WSSession, typ websocket.MessageType, msg []byte) error {
	ww := &wsWriter{ctx: ctx, c: c, header: http.Header{}}
	body, e := api.WSTurnBody(typ == websocket.MessageText, msg)
	if e == nil {
		body, e = s.Expand(body)
	}
	switch {
	case e != nil:
		a.WriteError(ww, e)
	case api.IsWarmup(body):
		completed, err := warmup(ctx, c, body, h.router.Clock.Now())
		s.Remember(body, completed)
		return err
	default:
		body = api.WSPostBody(body)
		if err := h.ServeHTTP(ww, turnRequest(ctx, up, body), nil); err != nil {
			return err
		}
	}
	if err := ww.finish(); err != nil {
		return err
	}
	s.Remember(body, ww.completed)
	return nil
}

// canHijack reports whether w, or a writer it wraps (Unwrap, as Caddy's
// wrappers have it), can hand over its connection.
func canHijack(w http.ResponseWriter) bool {
	for {
		if _, ok := w.(http.Hijacker); ok {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
}

// turnRequest is one turn as the handler's own POST .../responses: the
// upgrade's headers (its key, what priority placeholders read) less the
// handshake's, and its context.
func turnRequest(ctx context.Context, up *http.Request, body []byte) *http.Request {
	r := up.Clone(ctx)
	r.Method = http.MethodPost
	r.Body, r.ContentLength, r.GetBody = io.NopCloser(bytes.NewReader(body)), int64(len(body)), nil
	for _, k := range []string{"Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Extensions", "Sec-Websocket-Protocol"} {
		r.Header.Del(k)
	}
	r.Header.Set("Content-Type", "application/json")
	return r
}

// wsWriter is the http.ResponseWriter of one turn: it sends the data of
// each server-sent event written to it as one text message, and an answer
// that is not a stream (the router's refusal, a provider's error) as an
// error message when it is one.
type wsWriter struct {
	ctx    context.Context
	c      *websocket.Conn
	header http.Header
	status int
	buf    []byte // what is not sent yet: a partial event, or a whole body
	err    error  // the socket's first write error
	// completed is the turn's response.completed event, once sent.
	completed []byte
}

func (w *wsWriter) Header() http.Header { return w.header }

func (w *wsWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *wsWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.err != nil {
		return 0, w.err
	}
	w.buf = append(w.buf, p...)
	return len(p), nil
}

// FlushError sends each complete event buffered (http.ResponseController
// calls it after each event).
func (w *wsWriter) FlushError() error {
	if w.err != nil || !w.streaming() {
		return w.err
	}
	for {
		i := bytes.Index(w.buf, []byte("\n\n"))
		if i < 0 {
			return nil
		}
		ev := w.buf[:i]
		w.buf = w.buf[i+2:]
		if data := sseData(ev); len(data) > 0 && string(data) != "[DONE]" {
			if w.err = w.c.Write(w.ctx, websocket.MessageText, data); w.err != nil {
				return w.err
			}
			if api.IsCompletedEvent(data) {
				w.completed = data
			}
		}
	}
}

func (w *wsWriter) streaming() bool {
	return strings.HasPrefix(w.header.Get("Content-Type"), "text/event-stream")
}

// finish sends what the turn left: the rest of a stream, or an answer
// that is not one.
func (w *wsWriter) finish() error {
	if w.streaming() || w.err != nil {
		return w.FlushError()
	}
	if w.status >= 300 || w.status == 0 {
		return writeWSError(w.ctx, w.c, w.status, w.buf)
	}
	// A whole answer where a stream was asked for: its response, completed.
	msg, ok := api.WSCompleted(w.buf)
	if !ok {
		return writeWSError(w.ctx, w.c, http.StatusBadGateway, nil)
	}
	w.completed = msg
	return w.c.Write(w.ctx, websocket.MessageText, msg)
}

// sseData is the data of one server-sent event (its data lines joined
// with newlines, as the EventSource specification has it).
func sseData(ev []byte) []byte {
	var out []byte
	for line := range bytes.SplitSeq(ev, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		if out != nil {
			out = append(out, '\n')
		}
		out = append(out, bytes.TrimPrefix(v, []byte(" "))...)
	}
	return out
}

// writeWSError sends an HTTP error answer of status as OpenAI's WebSocket
// error event (api.WSError).
func writeWSError(ctx context.Context, c *websocket.Conn, status int, body []byte) error {
	return c.Write(ctx, websocket.MessageText, api.WSError(status, body))
}
