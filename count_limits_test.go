package llmrouter

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// countLimitedAccount is an Anthropic account whose token counting has a
// rate limit of its own, as Anthropic states (token counting and message
// creation have separate, independent limits; docs.anthropic.com, "Token
// counting"): its first count_tokens request is answered 429 with the
// count's own headers (testdata/count/anthropic-count-429.http: requests
// limit 100, none remaining, retry-after 20), later ones
// {"input_tokens":7}; its Messages requests are answered 200, their
// limits untouched.
type countLimitedAccount struct {
	mu       sync.Mutex
	counts   int
	messages int
}

func (a *countLimitedAccount) serve(t *testing.T) http.HandlerFunc {
	raw, err := os.ReadFile("testdata/count/anthropic-count-429.http")
	if err != nil {
		t.Fatal(err)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/messages/count_tokens":
			if a.counts++; a.counts > 1 {
				_, _ = w.Write([]byte(`{"input_tokens":7}`))
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), r)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
		case "/v1/messages":
			a.messages++
			w.Header().Set("anthropic-ratelimit-requests-limit", "50")
			w.Header().Set("anthropic-ratelimit-requests-remaining", "49")
			w.Header().Set("anthropic-ratelimit-requests-reset", time.Now().Add(time.Second).UTC().Format(time.RFC3339))
			_, _ = fmt.Fprint(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":2}}`)
		default:
			http.NotFound(w, r)
		}
	}
}

// A count_tokens 429 is the count's own limit: it cools the deployment
// for counts (the next count goes elsewhere) but neither cools nor
// re-windows it for Messages, which it still serves at once.
func TestCountTokensLimitsAreTheirOwn(t *testing.T) {
	limited, other := &countLimitedAccount{}, &countLimitedAccount{counts: 1} // other's counts never 429
	ua, ub := httptest.NewServer(limited.serve(t)), httptest.NewServer(other.serve(t))
	defer ua.Close()
	defer ub.Close()
	h := handlerFromCaddyfile(t, `llm_router {
		provider a {
			type anthropic
			base_url `+ua.URL+`/v1
			api_key sk-ant-a
		}
		provider b {
			type anthropic
			base_url `+ub.URL+`/v1
			api_key sk-ant-b
		}
		model claude {
			deployment a claude-x {
				weight 100
			}
			deployment b claude-x
		}
		model solo {
			deployment a claude-x
		}
	}`)
	defer h.Cleanup()
	ask := func(path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON(path, body), nil)
		return w
	}
	const count = `{"model":"claude","messages":[{"role":"user","content":"Count these words."}]}`
	// Counts until one reaches a (weight 100: nearly every one), which
	// refuses it; each is counted (at b).
	for i := 0; limited.counts == 0; i++ {
		if w := ask("/v1/messages/count_tokens", count); w.Code != 200 || w.Header().Get(HeaderDeployment) != "b/claude-x" || i == 20 {
			t.Fatalf("count %d: expected b's count (a asked %d times), got %d %v %s", i+1, limited.counts, w.Code, w.Header(), w.Body)
		}
	}
	a := h.groups["solo"].Deployments[0]
	now := time.Now()
	if at, why := a.State.AvailableAt(now, 0); at.After(now) {
		t.Errorf("a's count 429 cooled it for Messages: available at %v (%s)", at.Sub(now).Round(time.Second), why)
	}
	snap := a.State.Snapshot(now)
	if snap.LastClass != nil && *snap.LastClass == provider.RateLimited || snap.LimitRequests == 100 || snap.RemainingRequests == 0 {
		t.Errorf("a's count 429 was read as its Messages state: %+v", snap)
	}
	start := time.Now()
	w := ask("/v1/messages", `{"model":"solo","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	if w.Code != 200 || w.Header().Get(HeaderAttempts) != "1" || time.Since(start) > 5*time.Second {
		t.Errorf("a Messages request to a: expected 200 at once, got %d after %v: %s", w.Code, time.Since(start), w.Body)
	}
	// The next counts do not ask a again while its count limit lasts.
	for range 3 {
		if w := ask("/v1/messages/count_tokens", count); w.Code != 200 || w.Header().Get(HeaderDeployment) != "b/claude-x" || w.Header().Get(HeaderAttempts) != "1" {
			t.Errorf("the next count: expected b at once, got %d %v", w.Code, w.Header())
		}
	}
	if limited.counts != 1 {
		t.Errorf("expected a's count limit remembered (asked once), got %d counts at a", limited.counts)
	}
}
