package provider

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"sync"
)

// MaxEventSize bounds one server-sent event (all its lines), in bytes: a
// provider that streams a gigabyte without a blank line cannot exhaust memory.
const MaxEventSize = 1 << 20

// ErrEventTooLarge is returned by SSEReader.Next for an event over MaxEventSize.
var ErrEventTooLarge = errors.New("server-sent event exceeds 1 MiB")

// Event is one server-sent event, or one comment line.
type Event struct {
	// Name is the "event:" field ("" for the default "message").
	Name string
	// Data is the "data:" lines joined by "\n". It is only valid until the
	// next call to Next.
	Data []byte
	// Comment is true for a comment line (": keep-alive"); Data then holds
	// the comment text.
	Comment bool
	// Plain says that Data holds none of what a UsageCounter looks for
	// (`sage"`, the end of every spelling of a usage key; `_reason":"`, a
	// finish or stop reason's key with a string value): an adapter that
	// read the event whole (a Chat Completions chunk, checked as JSON)
	// says so, so that the counter does not search it again.
	Plain bool
}

// SSEReader reads server-sent events (https://html.spec.whatwg.org/multipage/server-sent-events.html).
type SSEReader struct {
	r    *bufio.Reader
	data []byte
	line []byte
	ev   Event
}

// sseBuffer is the SSE reader's buffer, in bytes. An event is a few
// hundred bytes, and the HTTP transport below buffers the connection
// already: a small buffer keeps an open stream's memory small (a longer
// line is read in pieces).
const sseBuffer = 512

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: bufio.NewReaderSize(r, sseBuffer)}
}

// Next returns the next event or comment. At the end of the stream it
// returns io.EOF after a complete event, or io.ErrUnexpectedEOF when the
// stream stops inside an event (a cut connection). Any read error of the
// underlying reader is returned as is.
func (s *SSEReader) Next() (*Event, error) {
	s.data = s.data[:0]
	s.ev = Event{}
	inEvent, hasData := false, false
	for {
		line, err := s.readLine()
		if err != nil {
			if err == io.EOF && inEvent {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if len(line) == 0 {
			if hasData {
				s.ev.Data = s.data
				return &s.ev, nil
			}
			// A blank line after only an "event:" or "id:" line, or between
			// events: nothing to dispatch.
			inEvent = false
			s.ev.Name = ""
			continue
		}
		if line[0] == ':' {
			if inEvent {
				continue
			}
			s.data = append(s.data, bytes.TrimPrefix(line[1:], []byte(" "))...)
			return &Event{Data: s.data, Comment: true}, nil
		}
		inEvent = true
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "data":
			if hasData {
				s.data = append(s.data, '\n')
			}
			if len(s.data)+len(value) > MaxEventSize {
				return nil, ErrEventTooLarge
			}
			s.data = append(s.data, value...)
			hasData = true
		case "event":
			s.ev.Name = string(value)
		}
	}
}

// readLine returns one line without its terminator (\n or \r\n).
func (s *SSEReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		chunk, err := s.r.ReadSlice('\n')
		if len(s.line)+len(chunk) > MaxEventSize {
			return nil, ErrEventTooLarge
		}
		switch err {
		case nil:
			if len(s.line) == 0 {
				return trimEOL(chunk), nil
			}
			s.line = append(s.line, chunk...)
			return trimEOL(s.line), nil
		case bufio.ErrBufferFull:
			s.line = append(s.line, chunk...)
		default:
			if err == io.EOF && len(s.line)+len(chunk) > 0 {
				// A last line without its terminator: the stream was cut.
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

func trimEOL(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n"))
	return bytes.TrimSuffix(b, []byte("\r"))
}

// WriteEvent writes one server-sent event to w, as AppendEvent frames it,
// in one Write: the frame is built in a pooled buffer, so a stream holds no
// buffer of its own between events (w, an http.ResponseWriter, is buffered).
func WriteEvent(w io.Writer, name string, data []byte) error {
	bp := eventBuffers.Get().(*[]byte)
	b := AppendEvent((*bp)[:0], name, data)
	_, err := w.Write(b)
	if cap(b) <= maxPooledEvent {
		*bp = b
		eventBuffers.Put(bp)
	}
	return err
}

// eventBuffers hold WriteEvent's frames; a buffer grown past
// maxPooledEvent bytes (a rare huge event) is left to the GC.
var eventBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

const maxPooledEvent = 64 << 10

// AppendEvent appends one server-sent event to dst: "event: <name>\n" when
// name is not empty (without line breaks: they would begin fields of
// their own), a "data: " line for each line of data (ended by CR, LF or
// CRLF), and the blank line that ends it.
func AppendEvent(dst []byte, name string, data []byte) []byte {
	if name != "" {
		if strings.ContainsAny(name, "\r\n") {
			// A line break would end the field and begin whatever
			// follows it as fields of the client's stream.
			name = strings.NewReplacer("\r", "", "\n", "").Replace(name)
		}
		dst = append(append(append(dst, "event: "...), name...), '\n')
	}
	// CR, LF and CRLF each end a line for the client (the SSE spec); a CR
	// is rare (JSON may hold one as whitespace), so LF alone is looked for
	// when there is none.
	cr := bytes.IndexByte(data, '\r') >= 0
	for {
		line := data
		var i int
		if cr {
			i = bytes.IndexAny(data, "\r\n")
		} else {
			i = bytes.IndexByte(data, '\n')
		}
		if i >= 0 {
			crlf := data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n'
			line, data = data[:i], data[i+1:]
			if crlf {
				data = data[1:]
			}
		}
		dst = append(append(append(dst, "data: "...), line...), '\n')
		if i < 0 {
			break
		}
	}
	return append(dst, '\n')
}
