package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A reload with changed weights keeps what was learned: the deployment that
// answered 429 (Retry-After 30) is still skipped, untouched, afterwards.
func TestReloadKeepsCooldown(t *testing.T) {
	load(t, twoProviders("weights cost 1 latency 1 reliability 1 quality 1 capacity 2", "rl", "rl-a", "rl-b",
		"fault rate_limit {\n header Retry-After 30\n }", ""))
	resp := chat(t, "rl", false)
	readBody(t, resp)
	if resp.Header.Get("X-LLM-Router-Deployment") != "b/rl-b" || resp.Header.Get("X-LLM-Router-Attempts") != "2" {
		t.Fatalf("expected the failover to b, got %q after %q", resp.Header.Get("X-LLM-Router-Deployment"), resp.Header.Get("X-LLM-Router-Attempts"))
	}

	// Reload: new weights, and a no longer faulty a (its mock restarts).
	load(t, twoProviders("weights cost 0 latency 2 reliability 1 quality 3 capacity 1", "rl", "rl-a", "rl-b", "", ""))
	for i := 0; i < 3; i++ {
		resp := chat(t, "rl", false)
		readBody(t, resp)
		if resp.Header.Get("X-LLM-Router-Deployment") != "b/rl-b" || resp.Header.Get("X-LLM-Router-Attempts") != "1" {
			t.Errorf("after the reload, expected b at once (a still cooling), got %q after %q",
				resp.Header.Get("X-LLM-Router-Deployment"), resp.Header.Get("X-LLM-Router-Attempts"))
		}
	}
	if n := stats(t, 9081).Requests; n != 0 {
		t.Errorf("expected the cooling a untouched after the reload, got %d requests", n)
	}

	// A changed identity (another key) starts fresh.
	load(t, strings.Replace(twoProviders("", "rl", "rl-a", "rl-b", "", ""), "sk-provider-a", "sk-rotated-a", 1))
	resp = chat(t, "rl", false)
	readBody(t, resp)
	if resp.Header.Get("X-LLM-Router-Deployment") != "a/rl-a" {
		t.Errorf("with a new key, expected a (fresh state, higher quality) to answer, got %q", resp.Header.Get("X-LLM-Router-Deployment"))
	}
}

type deploymentStatus struct {
	Name              string   `json:"name"`
	Type              string   `json:"type"`
	BaseURL           string   `json:"base_url"`
	ModelGroups       []string `json:"model_groups"`
	Circuit           string   `json:"circuit"`
	OpenUntil         string   `json:"open_until"`
	OpenReason        string   `json:"open_reason"`
	LimitRequests     int64    `json:"limit_requests"`
	RemainingRequests int64    `json:"remaining_requests"`
	LatencyMS         float64  `json:"latency_ewma_ms"`
	SuccessRate       float64  `json:"success_rate"`
	InFlight          int      `json:"in_flight"`
	LastClass         string   `json:"last_class"`
}

func TestAdminDeploymentsAndMetrics(t *testing.T) {
	load(t, twoProviders("", "ops", "ops-a", "ops-b",
		"fault rate_limit {\n header Retry-After 30\n }",
		"rate_limit {\n requests 100\n window 1m\n }"))
	for i := 0; i < 3; i++ {
		readBody(t, chat(t, "ops", false))
	}

	resp, err := http.Get("http://localhost:2999/llm_router/deployments")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("expected 200 from the admin API, got %d: %s", resp.StatusCode, raw)
	}
	if strings.Contains(string(raw), "sk-provider") {
		t.Fatalf("the admin API must never show a key: %s", raw)
	}
	var out struct {
		Deployments []deploymentStatus `json:"deployments"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	byName := map[string]deploymentStatus{}
	for _, d := range out.Deployments {
		byName[d.Name] = d
	}
	a, b := byName["a/ops-a"], byName["b/ops-b"]
	if a.Circuit != "open" || a.OpenReason != "rate_limited" || a.OpenUntil == "" || a.LastClass != "rate_limited" {
		t.Errorf("expected a open for rate_limited, got %+v", a)
	}
	if b.Circuit != "closed" || b.LimitRequests != 100 || b.RemainingRequests != 97 || b.LatencyMS <= 0 || b.SuccessRate != 1 {
		t.Errorf("expected b closed with 97 of 100 left, a latency and full success, got %+v", b)
	}
	if len(a.ModelGroups) != 1 || a.ModelGroups[0] != "ops" || a.Type != "openai" || a.BaseURL != "http://localhost:9081/v1" {
		t.Errorf("expected a's identity shown, got %+v", a)
	}

	resp, err = http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []struct {
		re  string
		min float64
	}{
		{`llm_router_failovers_total\{class="rate_limited",deployment="a/ops-a"\} (\S+)`, 1},
		{`llm_router_attempts_total\{class="rate_limited",deployment="a/ops-a"\} (\S+)`, 1},
		{`llm_router_attempts_total\{class="ok",deployment="b/ops-b"\} (\S+)`, 3},
		{`llm_router_requests_total\{deployment="b/ops-b",model_group="ops",status="200"\} (\S+)`, 3},
		{`llm_router_circuit_state\{deployment="a/ops-a"\} (\S+)`, 2},
		{`llm_router_remaining\{deployment="b/ops-b",kind="requests"\} (\S+)`, 97},
		{`llm_router_upstream_latency_seconds_count\{deployment="b/ops-b"\} (\S+)`, 3},
	} {
		m := regexp.MustCompile(want.re).FindSubmatch(metrics)
		if m == nil {
			t.Errorf("metric %s missing", want.re)
			continue
		}
		if v, _ := strconv.ParseFloat(string(m[1]), 64); v < want.min {
			t.Errorf("metric %s: expected at least %v, got %v", want.re, want.min, v)
		}
	}
}
