package jsonbody

import (
	"bytes"
	"encoding/json"
	"io"
)

// Marshal is json.Marshal without its HTML escaping: <, > and & stay as
// they are (json.Marshal writes \u003c, \u003e, \u0026, meant for JSON
// put in an HTML page), as providers write them and as a client shows
// an error or an answer's text. Every JSON the router writes, and the
// MarshalJSON methods of what it writes (encoding/json keeps a nested
// Marshaler's bytes as they are), use it. Errors: json.Marshal's.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := NewEncoder(&buf).Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// NewEncoder is json.NewEncoder without HTML escaping (see Marshal).
func NewEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}
