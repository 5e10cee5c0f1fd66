//go:build agents

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The coding agents as clients (make agents): Claude Code and Codex CLI,
// installed from npm at pinned versions into AGENTS_DIR (the Makefile's
// .agents/), run non-interactively through the router against llm_mock
// providers: a plain answer, a tool call round trip, and a failover on a
// 429 in the middle of a session. What the agent printed and what the
// mocks saw are asserted.

// agent runs one agent's command line with its base URL pointed at the
// router; it returns what it printed.
func agent(t *testing.T, name string, args ...string) string {
	t.Helper()
	dir := os.Getenv("AGENTS_DIR")
	if dir == "" {
		t.Fatal("AGENTS_DIR is not set: run make agents")
	}
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "node_modules", ".bin", name), args...)
	cmd.Dir = home
	cmd.Env = append(os.Environ(), "HOME="+home,
		// Claude Code
		"ANTHROPIC_BASE_URL="+routerURL, "ANTHROPIC_API_KEY=client-key", "DISABLE_TELEMETRY=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1",
		// Codex CLI (its provider's env_key)
		"ROUTER_API_KEY=client-key", "CODEX_DISABLE_TELEMETRY=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func claude(t *testing.T, model, prompt string) string {
	return agent(t, "claude", "-p", prompt, "--model", model, "--allowedTools", "Bash(echo:*)")
}

func codex(t *testing.T, model, prompt string) string {
	return codexWith(t, "", model, prompt)
}

// codexWith is codex with more of its provider's options (TOML, each
// followed by a comma).
func codexWith(t *testing.T, options, model, prompt string) string {
	return agent(t, "codex", "exec", "--skip-git-repo-check", "-m", model,
		"-c", "model_provider=router",
		"-c", `model_providers.router={name="router",base_url="`+routerURL+`/v1",env_key="ROUTER_API_KEY",wire_api="responses",`+options+`request_max_retries=0,stream_max_retries=0}`,
		prompt)
}

// agentsConfig is a router with group "agent" over deployments a (first)
// and b, on mocks of the given dialects (openai, anthropic, responses: an
// openai mock the router reaches with `responses native`), each with mock
// options.
func agentsConfig(dialectA, optsA, dialectB, optsB string) string {
	provider := func(name, dialect string, port int) string {
		typ, extra := "openai", ""
		switch dialect {
		case "anthropic":
			typ = "anthropic"
		case "responses":
			extra = "responses native"
		}
		return fmt.Sprintf("provider %s {\n type %s\n base_url http://localhost:%d/v1\n api_key sk-%s\n %s\n }\n", name, typ, port, name, extra)
	}
	mock := func(dialect, opts string, port int) string {
		d := ""
		if dialect == "anthropic" {
			d = "dialect anthropic"
		}
		return fmt.Sprintf("http://localhost:%d {\n llm_mock {\n %s\n %s\n }\n}\n", port, d, opts)
	}
	return "http://localhost:9080 {\n llm_router /v1/* {\n" + provider("a", dialectA, 9081) + provider("b", dialectB, 9082) +
		"model agent {\n alias claude-sonnet-4-5 gpt-5\n deployment a agent-a {\n quality 0.9\n }\n deployment b agent-b {\n quality 0.5\n }\n }\n }\n}\n" +
		mock(dialectA, optsA, 9081) + mock(dialectB, optsB, 9082)
}

const (
	claudeTool = "tool_call Bash `{\"command\":\"echo tool-ran-ok\",\"description\":\"Print a marker\"}`"
	codexTool  = "tool_call exec_command `{\"cmd\":\"echo tool-ran-ok\"}`"
	failFirst  = "fault rate_limit {\n every 2\n header Retry-After 30\n }"
)

func expect(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: expected %q in what the agent printed:\n%s", what, w, out)
		}
	}
}

func TestAgentsClaudeCode(t *testing.T) {
	// A plain answer, natively from an Anthropic deployment.
	load(t, agentsConfig("anthropic", `reply "Plain from a."`, "openai", ""))
	expect(t, "plain", claude(t, "agent", "Say hi"), "Plain from a.")
	if n := stats(t, 9081).Requests; n != 1 {
		t.Errorf("plain: expected 1 request at a, got %d", n)
	}

	// A tool round trip, translated to Chat Completions.
	load(t, agentsConfig("openai", `reply "Done with the tool."`+"\n"+claudeTool, "openai", ""))
	expect(t, "tool", claude(t, "agent", "Print the marker"), "Done with the tool.")
	if s := stats(t, 9081); s.Requests != 2 || !strings.Contains(s.LastBody, "tool-ran-ok") {
		t.Errorf("tool: expected 2 requests at a, the second with the tool's output, got %d: %s", s.Requests, s.LastBody)
	}

	// a answers the tool call, then rate-limits: b finishes the session.
	load(t, agentsConfig("anthropic", `reply "From a."`+"\n"+claudeTool+"\n"+failFirst, "openai", `reply "Finished by b."`+"\n"+claudeTool))
	expect(t, "failover", claude(t, "claude-sonnet-4-5", "Print the marker"), "Finished by b.")
	a, b := stats(t, 9081), stats(t, 9082)
	if a.Requests != 2 || b.Requests != 1 || !strings.Contains(b.LastBody, "tool-ran-ok") {
		t.Errorf("failover: expected a asked twice (the second a 429) and b once with the tool's output, got %d and %d: %s", a.Requests, b.Requests, b.LastBody)
	}
}

func TestAgentsCodex(t *testing.T) {
	// A plain answer, translated to Chat Completions.
	load(t, agentsConfig("openai", `reply "Plain from a."`, "openai", ""))
	expect(t, "plain", codex(t, "agent", "Say hi"), "Plain from a.")
	if n := stats(t, 9081).Requests; n != 1 {
		t.Errorf("plain: expected 1 request at a, got %d", n)
	}

	// A tool round trip, natively on the Responses API.
	load(t, agentsConfig("responses", `reply "Done with the tool."`+"\n"+codexTool, "openai", ""))
	expect(t, "tool", codex(t, "agent", "Print the marker"), "tool-ran-ok", "Done with the tool.")
	if s := stats(t, 9081); s.Requests != 2 || !strings.Contains(s.LastBody, "tool-ran-ok") || !strings.Contains(s.LastBody, "function_call_output") {
		t.Errorf("tool: expected 2 Responses requests at a, the second with the tool's output, got %d: %s", s.Requests, s.LastBody)
	}

	// a (Responses, native) answers the tool call, then rate-limits: b
	// (Anthropic, through Chat Completions) finishes the session.
	load(t, agentsConfig("responses", `reply "From a."`+"\n"+codexTool+"\n"+failFirst, "anthropic", `reply "Finished by b."`+"\n"+codexTool))
	expect(t, "failover", codex(t, "gpt-5", "Print the marker"), "Finished by b.")
	a, b := stats(t, 9081), stats(t, 9082)
	if a.Requests != 2 || b.Requests != 1 || !strings.Contains(b.LastBody, "tool-ran-ok") || !strings.Contains(b.LastBody, "tool_result") {
		t.Errorf("failover: expected a asked twice (the second a 429) and b once with the tool's result, got %d and %d: %s", a.Requests, b.Requests, b.LastBody)
	}
}

// Codex CLI in WebSocket mode (its provider's supports_websockets): the
// router refuses HTTP turns in this run (a 503 before llm_router), so
// every turn is served on the socket: a tool round trip on a native
// Responses deployment, then, after a's 429, on Anthropic's through Chat
// Completions.
func TestAgentsCodexWebSocket(t *testing.T) {
	wsOnly := func(config string) string {
		config = strings.Replace(config, "llm_router /v1/* {", "route {\n @http_turn {\n method POST\n path /v1/responses\n }\n"+
			"respond @http_turn \"HTTP turns are refused in this run\" 503\n llm_router /v1/* {", 1)
		config = strings.Replace(config, "http://localhost:9081 {", "}\nhttp://localhost:9081 {", 1) // the route's end
		// Deployments of their own: TestAgentsCodex's a cools after its 429
		// (capacity state outlives a reload).
		return strings.NewReplacer(" agent-a {", " agent-ws-a {", " agent-b {", " agent-ws-b {").Replace(config)
	}
	ws := func(model, prompt string) string { return codexWith(t, "supports_websockets=true,", model, prompt) }
	load(t, wsOnly(agentsConfig("responses", `reply "Done with the tool."`+"\n"+codexTool, "openai", "")))
	expect(t, "tool", ws("agent", "Print the marker"), "tool-ran-ok", "Done with the tool.")
	if s := stats(t, 9081); s.Requests != 2 || !strings.Contains(s.LastBody, "tool-ran-ok") || strings.Contains(s.LastBody, "previous_response_id") {
		t.Errorf("tool: expected 2 requests at a, the second whole with the tool's output, got %d: %s", s.Requests, s.LastBody)
	}
	load(t, wsOnly(agentsConfig("responses", `reply "From a."`+"\n"+codexTool+"\n"+failFirst, "anthropic", `reply "Finished by b."`+"\n"+codexTool)))
	expect(t, "failover", ws("gpt-5", "Print the marker"), "Finished by b.")
	if a, b := stats(t, 9081), stats(t, 9082); a.Requests != 2 || b.Requests != 1 || !strings.Contains(b.LastBody, "tool_result") {
		t.Errorf("failover: expected a asked twice and b once with the tool's result, got %d and %d: %s", a.Requests, b.Requests, b.LastBody)
	}
}

// Claude Code on Claude across clouds: a session whose tool call comes
// from Bedrock (InvokeModel, signed) and which Vertex (rawPredict, with a
// token) finishes when Bedrock throttles; Anthropic's API is rate-limited
// throughout.
func TestAgentsClaudeCodeOnTheClouds(t *testing.T) {
	cloudCredentials(t, cloudSecret)
	load(t, threeClouds("agent", "fault rate_limit {\n header Retry-After 30\n }",
		claudeTool+"\n"+failFirst, claudeTool))
	expect(t, "clouds", claude(t, "claude", "Print the marker"), "Hello from vertex.")
	br, vx := cloudStats(t, 9082), cloudStats(t, 9083)
	if br.Requests != 2 || br.AuthAccepted != 2 || vx.Requests != 1 || !strings.Contains(vx.LastBody, "tool-ran-ok") ||
		!strings.Contains(vx.LastBody, `"anthropic_version":"vertex-2023-10-16"`) {
		t.Errorf("expected bedrock asked twice (the second throttled) and vertex once with the tool's output, got %+v and %+v", br, vx)
	}
}
