package api

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// The official SDKs (openai-node, anthropic-node, openai-python, the Go
// ones) retry 408, 409, 429 and 5xx twice more unless the response says
// x-should-retry: false, and sleep any Retry-After (PROVIDERS.md, "Clients'
// own retries"). Every error the router answers itself, in every client
// API, says false (it already walked the deployments within the deadline,
// or the request is refused as it is), with Retry-After only when the
// router gave a wait; a provider's own error passed on is its statement,
// and gets neither.
func TestTheRoutersOwnErrorsTellClientsNotToRetry(t *testing.T) {
	said := &provider.Observation{Class: provider.ClientError, Message: "bad"}
	for _, tc := range []struct {
		name       string
		res        *router.Result
		status     int
		retry      string // x-should-retry
		retryAfter string
	}{
		{"429 until a reset", &router.Result{Err: &router.Error{Status: 429, Class: provider.RateLimited, Message: "limited", RetryAfter: 7 * time.Second}}, 429, "false", "7"},
		{"502 until a probe", &router.Result{Err: &router.Error{Status: 502, Class: provider.Server, Message: "failing", RetryAfter: 2 * time.Second}}, 502, "false", "2"},
		{"502 with no wait", &router.Result{Err: &router.Error{Status: 502, Class: provider.Server, Message: "failed"}}, 502, "false", ""},
		{"503 drained", &router.Result{Err: &router.Error{Status: 503, Class: provider.Server, Message: "disabled"}}, 503, "false", ""},
		{"504 deadline", &router.Result{Err: &router.Error{Status: 504, Class: provider.Transport, Message: "late"}}, 504, "false", ""},
		{"400 context length", &router.Result{Err: &router.Error{Status: 400, Class: provider.ContextLength, Message: "too long"}}, 400, "false", ""},
		{"an untranslatable answer", &router.Result{Status: 200, Format: provider.Chat, Body: []byte(`{"choices":[]}`)}, 502, "false", ""},
		{"a provider's client error, restated", &router.Result{Status: 400, Format: provider.Chat, Error: said}, 400, "", ""},
	} {
		for _, a := range []API{Chat{}, Messages{}, Embeddings{}, Completions{}, Responses{}} {
			if tc.name == "an untranslatable answer" && (a.Format() == provider.Chat || a.Format() == provider.Embeddings) {
				continue // a Chat answer goes to a Chat client as it is; Embeddings has no Chat form
			}
			w := httptest.NewRecorder()
			if err := a.Write(w, tc.res); err != nil {
				t.Fatalf("%s, %T: %v", tc.name, a, err)
			}
			if w.Code != tc.status || w.Header().Get("X-Should-Retry") != tc.retry || w.Header().Get("Retry-After") != tc.retryAfter {
				t.Errorf("%s, %T: expected %d, x-should-retry %q, Retry-After %q; got %d, %q, %q", tc.name, a,
					tc.status, tc.retry, tc.retryAfter, w.Code, w.Header().Get("X-Should-Retry"), w.Header().Get("Retry-After"))
			}
		}
	}
	w := httptest.NewRecorder()
	Chat{}.WriteError(w, Errorf(http.StatusRequestEntityTooLarge, BodyTooLarge, "", "too large"))
	if w.Header().Get("X-Should-Retry") != "false" {
		t.Errorf("a refusal before routing: expected x-should-retry false, got %q", w.Header().Get("X-Should-Retry"))
	}
	w = httptest.NewRecorder()
	e := Errorf(http.StatusBadGateway, Unavailable, "", "one attempt, not retried")
	e.Retryable = true
	Chat{}.WriteError(w, e)
	if _, set := w.Header()["X-Should-Retry"]; set || w.Code != http.StatusBadGateway {
		t.Errorf("a Retryable error: expected 502 and no x-should-retry, got %d %q", w.Code, w.Header().Get("X-Should-Retry"))
	}
}
