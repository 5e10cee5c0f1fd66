package integration

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// fallback_group: when every deployment of smart is rate-limited past the
// deadline, fast serves the request, within the same attempt budget, and
// the answer's headers say so; streams too.
func TestFallbackGroup(t *testing.T) {
	config := twoProviders("deadline 10s", "smart", "s-a", "unused", "fault rate_limit {\n header Retry-After 600\n }", "")
	// smart has only a; fast has only b.
	config = strings.Replace(config, "\t\t\tdeployment b unused {\n\t\t\t\tquality 0.5\n\t\t\t}\n\t\t}",
		"\t\t\tfallback_group fast\n\t\t}\n\t\tmodel fast {\n\t\t\tdeployment b f-b\n\t\t}", 1)
	if !strings.Contains(config, "fallback_group fast") {
		t.Fatal("the config has no fallback_group")
	}
	load(t, config)

	resp := chat(t, "smart", false)
	body := readBody(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Group") != "fast" ||
		resp.Header.Get("X-LLM-Router-Deployment") != "b/f-b" || resp.Header.Get("X-LLM-Router-Attempts") != "2" {
		t.Fatalf("expected fast's b to answer after a's 429 (2 attempts), got %d group %q deployment %q attempts %q: %s",
			resp.StatusCode, resp.Header.Get("X-LLM-Router-Group"), resp.Header.Get("X-LLM-Router-Deployment"),
			resp.Header.Get("X-LLM-Router-Attempts"), body)
	}
	// a is out for 600 s: the next requests go to fast at once, a untouched.
	resp = chat(t, "smart", true)
	body = readBody(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Group") != "fast" || resp.Header.Get("X-LLM-Router-Attempts") != "1" ||
		!strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") {
		t.Errorf("expected fast's stream at once, got %d group %q attempts %q: %s", resp.StatusCode,
			resp.Header.Get("X-LLM-Router-Group"), resp.Header.Get("X-LLM-Router-Attempts"), body)
	}
	if a, b := stats(t, 9081).Requests, stats(t, 9082).Requests; a != 1 || b != 2 {
		t.Errorf("expected a asked once and b twice, got %d and %d", a, b)
	}
	resp, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics := readBody(t, resp)
	m := regexp.MustCompile(`llm_router_fallbacks_total\{model_group="smart",to="fast"\} (\S+)`).FindStringSubmatch(metrics)
	if len(m) != 2 {
		t.Errorf("expected llm_router_fallbacks_total for smart to fast")
	} else if n, _ := strconv.ParseFloat(m[1], 64); n < 2 { // counters live as long as the process
		t.Errorf("expected at least 2 fallbacks from smart to fast counted, got %v", n)
	}
	// A request for fast itself says fast.
	resp = chat(t, "fast", false)
	readBody(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Group") != "fast" {
		t.Errorf("expected fast to answer for fast, got %d group %q", resp.StatusCode, resp.Header.Get("X-LLM-Router-Group"))
	}
}

// A provider key that resolves to nothing refuses the config, naming the
// placeholder; the config that runs stays. `api_key none` loads.
func TestUnsetKeyRefusesTheConfig(t *testing.T) {
	config := twoProviders("", "fast", "k-a", "k-b", "", "")
	load(t, config)
	bad := strings.Replace(global+config, "api_key sk-provider-a", "api_key {env.LLM_ROUTER_TEST_SURELY_UNSET}", 1)
	resp, err := http.Post("http://localhost:2999/load", "text/caddyfile", strings.NewReader(bad))
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 400 || !strings.Contains(body, "api_key {env.LLM_ROUTER_TEST_SURELY_UNSET} is empty once its placeholders are replaced") {
		t.Errorf("expected the load refused naming the placeholder, got %d %s", resp.StatusCode, body)
	}
	if resp := chat(t, "fast", false); resp.StatusCode != 200 {
		t.Errorf("expected the running config to serve, got %d", resp.StatusCode)
	} else {
		readBody(t, resp)
	}
	// No key at all: refused when adapted, with the line.
	missing := strings.Replace(global+config, "\t\t\tapi_key sk-provider-a\n", "", 1)
	resp, err = http.Post("http://localhost:2999/load", "text/caddyfile", strings.NewReader(missing))
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(body, "provider a: needs an api_key") || !strings.Contains(body, "Caddyfile:") {
		t.Errorf("expected a missing key refused with its line, got %d %s", resp.StatusCode, body)
	}
	load(t, strings.Replace(config, "api_key sk-provider-a", "api_key none", 1))
	if resp := chat(t, "fast", false); resp.StatusCode != 200 {
		t.Errorf("api_key none: expected 200, got %d", resp.StatusCode)
	} else {
		readBody(t, resp)
	}
	if s := stats(t, 9081); s.Requests > 0 && s.LastAuthorization != "" {
		t.Errorf("api_key none: expected no Authorization upstream, got %q", s.LastAuthorization)
	}
}
