package mockllm

import (
	"context"
	"encoding/binary"
	"net/http"
	"time"
)

// Streamed answers: the streamFormat a dialect implements, the stream
// driver that paces chunks, delays slow faults' first chunk and strikes
// cut, error_event, stall and malformed faults, and the pacer every wait of a request goes through.

// streamFormat writes one stream in a dialect's wire format. Each
// method appends to b and returns it; the stream driver sends what it
// returns as one flushed write.
type streamFormat interface {
	contentType() string
	// head is sent with the response headers, before FirstTokenDelay.
	head(b []byte) []byte
	// keepAlive is sent every keepAliveInterval of FirstTokenDelay by
	// a keepalive fault; nil for none.
	keepAlive() []byte
	// chunk carries content piece i; last tells the last piece of a
	// stream that will end normally.
	chunk(b []byte, i int, piece string, last bool) []byte
	// end follows the last chunk of a stream no fault struck.
	end(b []byte) []byte
	// errorEvent carries payload, the error of an error_event fault.
	errorEvent(b []byte, payload []byte) []byte
	// malformed is the event of a malformed fault: the next content
	// event, its data JSON cut short.
	malformed(b []byte) []byte
}

// streamFormat returns the wire format of a's stream.
func (h *Handler) streamFormat(a answer, c call) streamFormat {
	switch {
	case h.dialect == dlBedrock && c.wire == wireConverse:
		return newConverseStream(a)
	case h.dialect == dlBedrock:
		return newInvokeStream(a, &anthropicStream{a: a, id: h.st.ids.Add(1)})
	case c.wire == wireAnthropic:
		return &anthropicStream{a: a, id: h.st.ids.Add(1)}
	case c.wire == wireGemini:
		return &geminiStream{a: a, array: c.array}
	}
	if c.ep == epResponses {
		return &responsesStream{h: h, a: a, id: h.newResponseID()}
	}
	if c.ep == epCompletions {
		return &completionsStream{openaiStream: h.newOpenAIStream(a)}
	}
	return h.newOpenAIStream(a)
}

// stream sends a streamed answer.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, p *pacer, a answer, sf streamFormat) {
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", sf.contentType())
	hdr.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := sendEvent
	if sf.contentType() == eventStreamContentType {
		send = sendFrames // flushed one message at a time
	}
	ev := sf.head(make([]byte, 0, 512))
	if len(ev) > 0 {
		if !send(w, rc, ev) {
			return
		}
	} else if rc.Flush() != nil {
		return
	}

	ftd := time.Duration(h.FirstTokenDelay) + a.fault.slowDelay()
	if ka := sf.keepAlive(); ka != nil && a.fault != nil && a.fault.Kind == FaultKeepAlive {
		end := time.Now().Add(ftd)
		for {
			left := time.Until(end)
			if left <= 0 {
				break
			}
			if !send(w, rc, ka) {
				return
			}
			if !p.wait(min(left, keepAliveInterval)) {
				h.abandon(r)
				return
			}
		}
	} else if !p.wait(ftd) {
		h.abandon(r)
		return
	}

	strike := -1 // chunk index before which a cut, error_event, stall or malformed fault strikes
	if f := a.fault; f != nil && (f.Kind == FaultCut || f.Kind == FaultErrorEvent || f.Kind == FaultStall || f.Kind == FaultMalformed) {
		strike = 1
		if f.After != nil {
			strike = *f.After
		}
		strike = min(strike, len(a.pieces))
	}

	last := len(a.pieces) - 1
	for i, piece := range a.pieces {
		if i == strike {
			h.strike(w, r, rc, sf, a, send, func() []byte { return sf.chunk(nil, i, piece, false) })
			return
		}
		if i > 0 && !p.wait(time.Duration(h.ChunkInterval)) {
			h.abandon(r)
			return
		}
		ev = sf.chunk(ev[:0], i, piece, i == last && strike < 0)
		if !send(w, rc, ev) {
			return
		}
	}
	if strike == len(a.pieces) {
		h.strike(w, r, rc, sf, a, send, func() []byte { return sf.end(nil) })
		return
	}
	if ev = sf.end(ev[:0]); len(ev) > 0 {
		send(w, rc, ev)
	}
}

// strike ends a stream with a cut, error_event, stall or malformed
// fault. next is what the stream would have sent next: an event stream
// cut sends the first half of its first message, so the cut falls
// mid-frame.
func (h *Handler) strike(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, sf streamFormat, a answer,
	send func(http.ResponseWriter, *http.ResponseController, []byte) bool, next func() []byte) {
	f := a.fault
	switch f.Kind {
	case FaultStall:
		// What was sent is flushed; then nothing until the client
		// leaves or the mock closes.
		h.hang(r)
		return
	case FaultMalformed:
		send(w, rc, sf.malformed(nil))
		return
	case FaultCut:
		if sf.contentType() == eventStreamContentType {
			if b := next(); len(b) >= 4 {
				n := min(int(binary.BigEndian.Uint32(b)), len(b))
				_, _ = w.Write(b[:n/2])
			}
		}
		_ = rc.Flush()
		panic(http.ErrAbortHandler)
	}
	send(w, rc, sf.errorEvent(nil, h.errorPayload(f, a.wire)))
}

// keepAliveComment is the SSE comment of keepalive faults (openai,
// gemini).
var keepAliveComment = []byte(": keep-alive\n\n")

func sendEvent(w http.ResponseWriter, rc *http.ResponseController, ev []byte) bool {
	if _, err := w.Write(ev); err != nil {
		return false
	}
	return rc.Flush() == nil
}

// sendFrames sends event-stream messages one by one, each flushed:
// every message starts with its total length (a big-endian uint32).
func sendFrames(w http.ResponseWriter, rc *http.ResponseController, ev []byte) bool {
	for len(ev) >= 4 {
		n := min(int(binary.BigEndian.Uint32(ev)), len(ev))
		if n < 4 {
			n = len(ev) // not a message: send it all
		}
		if !sendEvent(w, rc, ev[:n]) {
			return false
		}
		ev = ev[n:]
	}
	if len(ev) > 0 {
		return sendEvent(w, rc, ev)
	}
	return true
}

// pacer waits on one reusable timer, giving up when the request's
// context ends or the handler is cleaned up.
type pacer struct {
	ctx  context.Context
	done <-chan struct{}
	t    *time.Timer
}

// wait pauses for d and reports whether the request should go on.
func (p *pacer) wait(d time.Duration) bool {
	if d <= 0 {
		select {
		case <-p.ctx.Done():
			return false
		case <-p.done:
			return false
		default:
			return true
		}
	}
	if p.t == nil {
		p.t = time.NewTimer(d)
	} else {
		p.t.Reset(d)
	}
	select {
	case <-p.t.C:
		return true
	case <-p.ctx.Done():
		return false
	case <-p.done:
		return false
	}
}

func (p *pacer) stop() {
	if p.t != nil {
		p.t.Stop()
	}
}
