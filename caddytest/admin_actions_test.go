package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func adminPost(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://localhost:2999"+path, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func servedBy(t *testing.T) string {
	t.Helper()
	resp := chat(t, "fast", false)
	readBody(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("expected 200, got %d", resp.StatusCode)
	}
	return resp.Header.Get("X-LLM-Router-Deployment")
}

// TestAdminActions: disable drains a deployment, enable puts it back, and
// reset forgets a circuit a 429 opened, each on Caddy's admin endpoint.
func TestAdminActions(t *testing.T) {
	load(t, twoProviders("", "fast", "ad-a", "ad-b", "fault rate_limit {\n every 3\n header Retry-After 600\n }", ""))
	if got := servedBy(t); got != "a/ad-a" {
		t.Fatalf("expected a (quality 0.9), got %q", got)
	}
	if code, body := adminPost(t, "/llm_router/deployments/a/ad-a/disable"); code != 200 || !strings.Contains(body, `"deployments":1`) {
		t.Fatalf("disable: %d %s", code, body)
	}
	if got := servedBy(t); got != "b/ad-b" {
		t.Errorf("a disabled: expected b, got %q", got)
	}
	if code, _ := adminPost(t, "/llm_router/deployments/a/ad-a/enable"); code != 200 {
		t.Fatalf("enable: %d", code)
	}
	if got := servedBy(t); got != "a/ad-a" {
		t.Errorf("a enabled: expected a, got %q", got)
	}
	// a's 3rd request is a 429 for 10 minutes: b serves, a stays out...
	if got := servedBy(t); got != "b/ad-b" {
		t.Fatalf("after a's 429: expected b, got %q", got)
	}
	if got := servedBy(t); got != "b/ad-b" {
		t.Errorf("a rate-limited for 10 minutes: expected b, got %q", got)
	}
	// ...until an operator resets it.
	if code, _ := adminPost(t, "/llm_router/deployments/a/ad-a/reset"); code != 200 {
		t.Fatalf("reset: %d", code)
	}
	if got := servedBy(t); got != "a/ad-a" {
		t.Errorf("a reset: expected a, got %q", got)
	}
	if code, body := adminPost(t, "/llm_router/deployments/nope/x/reset"); code != 404 || !strings.Contains(body, "no deployment") {
		t.Errorf("an unknown deployment: expected 404, got %d %s", code, body)
	}
	if code, _ := adminPost(t, "/llm_router/deployments/a/ad-a/explode"); code != 404 {
		t.Errorf("an unknown action: expected 404, got %d", code)
	}
}
