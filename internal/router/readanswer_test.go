package router

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/iotest"
)

// An answer is read whole whatever its Content-Length says (exact, short
// of the body, past it, absent), a read in small pieces included; a read
// that fails fails the answer.
func TestReadAnswerWhateverItsLength(t *testing.T) {
	body := bytes.Repeat([]byte(`{"a":"answer"}`), 100)
	for _, cl := range []int64{int64(len(body)), 10, int64(len(body)) + 500, -1, 0} {
		for _, half := range []bool{false, true} {
			var r io.Reader = bytes.NewReader(body)
			if half {
				r = iotest.HalfReader(r)
			}
			got, err := readAnswer(&http.Response{ContentLength: cl, Body: io.NopCloser(r)})
			if err != nil || !bytes.Equal(got, body) {
				t.Errorf("Content-Length %d (half reads %v): %d bytes, %v; want %d", cl, half, len(got), err, len(body))
			}
		}
	}
	cut := io.MultiReader(bytes.NewReader(body[:100]), iotest.ErrReader(io.ErrUnexpectedEOF))
	if _, err := readAnswer(&http.Response{ContentLength: int64(len(body)), Body: io.NopCloser(cut)}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a cut answer: %v, want io.ErrUnexpectedEOF", err)
	}
}
