package redact

import (
	"bytes"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	if len(forms.s) == 0 {
		return r
	}
	return &reader{r: r, forms: forms}
}

// Answer is b (a routed answer, a stream's event, read whole) with the
// secrets Reader finds replaced as Reader replaces them; b itself when it
// shows none.
func Answer(b []byte, secrets []string) []byte {
	copied := false
	for _, f := range answerForms(secrets).b {
		if !copied && bytes.Contains(b, f) {
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
func replaceForm(b, f []byte) {
	for i := 0; ; {
		j := bytes.Index(b[i:], f)
		if j < 0 {
			return
		}
		copy(b[i+j:], sameLength(len(f)))
		i += j + len(f)
	}
}

// answerForms are what Reader and Answer look for: each secret of
// AnywhereLength bytes or more, whole, URL-encoded and in base64.
func answerForms(secrets []string) *formList {
	if len(secrets) == 0 {
		return &noForms
	}
	key := &secrets[0] // a deployment's secrets: one slice, set once
	if v, ok := answerFormsOf.Load(key); ok {
		if c := v.(*cachedForms); slices.Equal(c.secrets, secrets) {
			return &c.forms
		}
	}
	forms := newAnswerForms(secrets)
	fl := formList{s: forms, b: make([][]byte, len(forms))}
	for i, f := range forms {
		fl.b[i] = []byte(f)
	}
	if answerFormsN.Add(1) > maxCachedForms {
		answerFormsOf.Clear() // lists of configs reloaded long ago
		answerFormsN.Store(1)
	}
	c := &cachedForms{secrets: slices.Clone(secrets), forms: fl}
	answerFormsOf.Store(key, c)
	return &c.forms
}

// answerFormsOf keeps each list of secrets' answerForms, by the address of
// its first element: Answer looks for a deployment's secrets in every
// event of its streams, and computing their forms cost an event about ten
// allocations. A list is taken for the one cached only when it holds the
// same secrets still. At most maxCachedForms lists are kept.
var (
	answerFormsOf sync.Map // *string to *cachedForms
	answerFormsN  atomic.Int64
)

const maxCachedForms = 4096

type cachedForms struct {
	secrets []string
	forms   formList
}

// formList is a list of forms, as strings and as bytes (what Answer looks
// for in an event without converting each form again).
type formList struct {
	s []string
	b [][]byte
}

var noForms formList

func newAnswerForms(secrets []string) []string {
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
	forms *formList
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
	for i, f := range x.forms.s {
		replaceForm(rest, x.forms.b[i])
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
