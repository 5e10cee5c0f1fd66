package api

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// The router's own errors keep <, > and & as they are in every client
// format: encoding/json's HTML escaping (\u003e) is for HTML pages, and
// a provider's or an SDK's error shows the bytes it got.
func TestErrorsKeepTheirCharacters(t *testing.T) {
	const msg = "max_tokens must be > 0 & <= 8192"
	for _, a := range []API{Chat{}, Messages{}, Responses{}, Embeddings{}, Completions{}} {
		w := httptest.NewRecorder()
		a.WriteError(w, Errorf(400, InvalidValue, "max_tokens", msg))
		if body := w.Body.String(); !strings.Contains(body, msg) || strings.Contains(body, `\u00`) {
			t.Errorf("%T: expected the message %q as it is, got %s", a, msg, body)
		}
	}
}
