package router

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// When the router gives up, its Retry-After means what it says: the real
// wait until capacity is back (a stated reset, a circuit's next probe), or
// none. A rate limit's reset; a failing deployment's next probe (after its
// backoff, or the provider's own Retry-After on a 503); the earliest of
// several; none for keys the providers refused (only an operator brings
// those back: the hour is the router's re-check, not a wait), for a
// deadline, or for deployments drained by their operator.
func TestGiveUpsRetryAfter(t *testing.T) {
	limited := provider.Observation{Class: provider.RateLimited, RetryAfter: 20 * time.Second}
	failed := provider.Observation{Class: provider.Server}
	overloaded := provider.Observation{Class: provider.Overloaded, RetryAfter: 10 * time.Second}
	refused := provider.Observation{Class: provider.Auth}
	ok := reply(200, okBody)
	for _, tc := range []struct {
		name       string
		a, b       *provider.Observation // observed before the request; nil: none
		disable    bool
		replies    func(*http.Request) (*http.Response, error)
		status     int
		retryAfter time.Duration
		says       string // in the message
	}{
		{"rate-limited", &limited, &limited, false, ok, 429, 20 * time.Second, ""},
		{"failing: the next probe, after the backoff", &failed, &failed, false, ok, 502, time.Second, ""},
		{"overloaded: the next probe, at the provider's Retry-After", &overloaded, &overloaded, false, ok, 502, 10 * time.Second, ""},
		{"failing and refused: the failing one's probe", &failed, &refused, false, ok, 502, time.Second, "failing; retry later"},
		{"keys refused", &refused, &refused, false, ok, 502, 0, "refused the router's key for it (401 or 403); an operator must fix the key, and a retry does not help"},
		{"drained by the operator", nil, nil, true, ok, 503, 0, ""},
		{"the deadline", nil, nil, false, hang, 504, 0, ""},
		// The first request to meet the refusals says so too, not "retry later".
		{"keys refused to this request", nil, nil, false, reply(401, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`), 502, 0, "refused the router's key for it (401 or 403); an operator must fix the key, and a retry does not help"},
		{"failed this request: their next probe", nil, nil, false, reply(500, `{"error":{"message":"down","type":"server_error"}}`), 502, time.Second, ""},
	} {
		c := newFakeClock()
		a := &script{replies: []func(*http.Request) (*http.Response, error){tc.replies}}
		b := &script{replies: []func(*http.Request) (*http.Response, error){tc.replies}}
		da, db := deployment("a", a), deployment("b", b)
		r := newRouter(c)
		r.Deadline = 300 * time.Millisecond
		for _, x := range []struct {
			d *Deployment
			o *provider.Observation
		}{{da, tc.a}, {db, tc.b}} {
			if x.o != nil {
				x.d.State.Observe(c.Now(), *x.o, r.Policy)
			}
			if tc.disable {
				x.d.State.Disable(c.Now(), true)
			}
		}
		done := make(chan *Result, 1)
		go func() { done <- r.Serve(context.Background(), []*Deployment{da, db}, chatReq) }()
		var res *Result
		for res == nil {
			select {
			case res = <-done:
			case <-time.After(time.Millisecond):
				c.Advance(10 * time.Millisecond)
			}
		}
		e, isErr := res.Err.(*Error)
		if !isErr || e.Status != tc.status || e.RetryAfter != tc.retryAfter {
			t.Errorf("%s: expected %d with Retry-After %s, got %v", tc.name, tc.status, tc.retryAfter, res.Err)
			if isErr {
				t.Errorf("%s: got %d with Retry-After %s", tc.name, e.Status, e.RetryAfter)
			}
		}
		if isErr && !strings.Contains(e.Message, tc.says) {
			t.Errorf("%s: expected the message to say %q, got %q", tc.name, tc.says, e.Message)
		}
	}
}
