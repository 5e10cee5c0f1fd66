package jsonbody

import (
	"math"
	"testing"
)

// Marshal writes what json.Marshal does but for <, > and &, which it
// keeps; an error leaves the next call's bytes clean.
func TestMarshalKeepsHTMLCharacters(t *testing.T) {
	if _, err := Marshal(math.NaN()); err == nil {
		t.Error("expected NaN refused, as json.Marshal refuses it")
	}
	got, err := Marshal(map[string]any{"m": "a > b && c < d", "n": 1})
	if want := `{"m":"a > b && c < d","n":1}`; err != nil || string(got) != want {
		t.Errorf("expected %s, got %s (%v)", want, got, err)
	}
}
