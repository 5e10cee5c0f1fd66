package redact

import (
	"bytes"
	"io"
	"net/url"
	"strings"
)

// Reader is r (an answer passed on as it flows: a download, a stream)
// with every configured secret of AnywhereLength bytes or more replaced,
// whole, URL-encoded or in base64 (see encodedForms), by Placeholder cut
// or padded with 'x' to the secret's length, so that the answer keeps its
// length (Content-Length, a Range). Bytes flow as they come but for a
// tail that may be the start of a secret, held until the next read tells.
// Shorter secrets and the masked and escaped shapes that String finds are
// not looked for: in a body of any kind they cannot be told from its
// content.
func Reader(r io.Reader, secrets []string) io.Reader {
	forms := answerForms(secrets)
	if len(forms) == 0 {
		return r
	}
	return &reader{r: r, forms: forms}
}

// Answer is b (a routed answer, a stream's event, read whole) with the
// secrets Reader finds replaced as Reader replaces them; b itself when it
// shows none.
func Answer(b []byte, secrets []string) []byte {
	copied := false
	for _, f := range answerForms(secrets) {
		if !copied && bytes.Contains(b, []byte(f)) {
			b, copied = bytes.Clone(b), true
		}
		if copied {
			replaceForm(b, f)
		}
	}
	return b
}

// replaceForm replaces each f in b, in place, by a placeholder of its
// length.
func replaceForm(b []byte, f string) {
	for i := 0; ; {
		j := bytes.Index(b[i:], []byte(f))
		if j < 0 {
			return
		}
		copy(b[i+j:], sameLength(len(f)))
		i += j + len(f)
	}
}

// answerForms are what Reader and Answer look for: each secret of
// AnywhereLength bytes or more, whole, URL-encoded and in base64.
func answerForms(secrets []string) []string {
	var forms []string
	for _, k := range secrets {
		if len(k) < AnywhereLength {
			continue
		}
		forms = append(forms, k, url.QueryEscape(k), url.PathEscape(k))
		forms = append(forms, encodedForms(k)...)
	}
	return forms
}

type reader struct {
	r     io.Reader
	forms []string
	buf   []byte // read, not yet given; buf[:ready] redacted for good
	ready int
	err   error
}

func (x *reader) Read(p []byte) (int, error) {
	for x.ready == 0 {
		if x.err != nil {
			return 0, x.err
		}
		chunk := make([]byte, 32<<10)
		n, err := x.r.Read(chunk)
		x.buf, x.err = append(x.buf, chunk[:n]...), err
		x.scan()
	}
	n := copy(p, x.buf[:x.ready])
	x.buf, x.ready = x.buf[n:], x.ready-n
	return n, nil
}

// scan redacts what is not ready yet, in place, and makes ready all but
// the longest tail that starts a secret's form (none at the end, where
// one of AnywhereLength bytes or more is redacted).
func (x *reader) scan() {
	rest := x.buf[x.ready:]
	hold := 0
	for _, f := range x.forms {
		replaceForm(rest, f)
		switch n := startsForm(rest, f); {
		case x.err == nil:
			hold = max(hold, n)
		case n >= AnywhereLength: // the answer ends in the middle of a secret
			copy(rest[len(rest)-n:], sameLength(n))
		}
	}
	x.ready = len(x.buf) - hold
}

// startsForm is the length of the longest tail of b that f starts with
// (shorter than f), or 0.
func startsForm(b []byte, f string) int {
	for i := max(0, len(b)-len(f)+1); i < len(b); i++ {
		if b[i] == f[0] && strings.HasPrefix(f, string(b[i:])) {
			return len(b) - i
		}
	}
	return 0
}

// sameLength is Placeholder cut or padded with 'x' to n bytes.
func sameLength(n int) string {
	if n <= len(Placeholder) {
		return Placeholder[:n]
	}
	return Placeholder + strings.Repeat("x", n-len(Placeholder))
}
