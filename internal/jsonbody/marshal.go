package jsonbody

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
)

// Marshal is json.Marshal without its HTML escaping: <, > and & stay as
// they are (json.Marshal writes \u003c, \u003e, \u0026, meant for JSON
// put in an HTML page), as providers write them and as a client shows
// an error or an answer's text. Every JSON the router writes, and the
// MarshalJSON methods of what it writes (encoding/json keeps a nested
// Marshaler's bytes as they are), use it. Errors: json.Marshal's.
func Marshal(v any) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer e.put()
	if err := e.enc.Encode(v); err != nil {
		return nil, err
	}
	b := e.buf.Bytes()
	return append([]byte(nil), b[:len(b)-1]...), nil // without Encode's newline
}

// NewEncoder is json.NewEncoder without HTML escaping (see Marshal).
func NewEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}

// encoder is a pooled buffer and its encoder: Marshal is on the path of
// every translated stream event.
type encoder struct {
	buf bytes.Buffer
	enc *json.Encoder
}

var encoders = sync.Pool{New: func() any {
	e := new(encoder)
	e.enc = NewEncoder(&e.buf)
	return e
}}

// put gives e back, unless a large value grew its buffer past what is
// worth keeping.
func (e *encoder) put() {
	if e.buf.Cap() > 64<<10 {
		return
	}
	e.buf.Reset()
	encoders.Put(e)
}
