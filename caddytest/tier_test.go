package integration

import (
	"strings"
	"testing"
)

// TestTiers: b is tier 1 and a, which the score prefers (quality 0.9),
// tier 2. Every request goes to b while b can serve it; once b is
// rate-limited past the deadline, to a, at once.
func TestTiers(t *testing.T) {
	config := twoProviders("deadline 10s", "fast", "t-a", "t-b", "", "fault rate_limit {\n every 4\n header Retry-After 30\n }")
	config = strings.Replace(config, "deployment a t-a {\n\t\t\t\tquality 0.9", "deployment a t-a {\n\t\t\t\ttier 2\n\t\t\t\tquality 0.9", 1)
	if !strings.Contains(config, "tier 2") {
		t.Fatal("the config has no tier")
	}
	load(t, config)
	for i := range 3 {
		resp := chat(t, "fast", false)
		readBody(t, resp)
		if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Deployment") != "b/t-b" {
			t.Errorf("request %d: expected b (tier 1), got %d from %q", i, resp.StatusCode, resp.Header.Get("X-LLM-Router-Deployment"))
		}
	}
	if n := stats(t, 9081).Requests; n != 0 {
		t.Errorf("expected a (tier 2) untouched while b serves, got %d requests", n)
	}
	// b's 4th answer is a 429 for 30 s, past the deadline: a serves.
	for i := range 3 {
		resp := chat(t, "fast", false)
		readBody(t, resp)
		if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Deployment") != "a/t-a" {
			t.Errorf("request %d after b's 429: expected a, got %d from %q", i, resp.StatusCode, resp.Header.Get("X-LLM-Router-Deployment"))
		}
	}
	if n := stats(t, 9082).Requests; n != 4 {
		t.Errorf("expected b asked 4 times (3 served, one 429), got %d", n)
	}
}
