//go:build agents

package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The official Node SDKs (openai, @anthropic-ai/sdk: pinned in the
// Makefile, installed by make agents into AGENTS_DIR) parse what the router
// translates: a Messages client of an OpenAI deployment that calls a tool
// (its stream helper parses every input_json_delta), a Responses client and a Chat client of an Anthropic
// deployment, each answered and streamed. Every call must parse, and the
// parsed values must hold what the provider said.
func TestNodeSDKsParseTranslatedAnswers(t *testing.T) {
	dir := os.Getenv("AGENTS_DIR")
	if dir == "" {
		t.Fatal("AGENTS_DIR is not set: run make agents")
	}
	// Group tools on an openai mock that calls a tool; group claude on an
	// anthropic mock.
	cfg := "http://localhost:9080 {\n llm_router /v1/* {\n" +
		" provider oa {\n type openai\n base_url http://localhost:9081/v1\n api_key sk-oa\n }\n" +
		" provider an {\n type anthropic\n base_url http://localhost:9082/v1\n api_key sk-an\n }\n" +
		" model tools {\n deployment oa up-tools\n }\n model claude {\n deployment an up-claude\n }\n }\n}\n" +
		"http://localhost:9081 {\n llm_mock {\n reply \"Checking.\"\n tool_call get_weather `{\"city\":\"Paris\"}`\n }\n}\n" +
		"http://localhost:9082 {\n llm_mock {\n dialect anthropic\n reply \"Hi from Claude.\"\n }\n}\n"
	load(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join("testdata", "node-sdks.cjs"))
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"), "ROUTER_URL="+routerURL,
		"MESSAGES_MODEL=tools", "RESPONSES_MODEL=claude")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	got := map[string]json.RawMessage{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r struct {
			Name  string          `json:"name"`
			OK    bool            `json:"ok"`
			Value json.RawMessage `json:"value"`
			Error string          `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("node printed %q: %v", line, err)
		}
		if !r.OK {
			t.Errorf("%s: the SDK failed: %s", r.Name, r.Error)
			continue
		}
		got[r.Name] = r.Value
	}
	for _, name := range []string{"messages.create", "messages.stream"} {
		var m struct {
			ID      string `json:"id"`
			Content []struct {
				Type  string          `json:"type"`
				ID    string          `json:"id"`
				Input json.RawMessage `json:"input"`
			} `json:"content"`
		}
		if err := json.Unmarshal(got[name], &m); err != nil || !strings.HasPrefix(m.ID, "msg_") {
			t.Errorf("%s: expected a msg_ message, got %s", name, got[name])
			continue
		}
		var tool bool
		for _, c := range m.Content {
			if c.Type == "tool_use" {
				tool = true
				if !strings.HasPrefix(string(c.Input), "{") || !strings.Contains(string(c.Input), "Paris") {
					t.Errorf("%s: expected tool_use.input the object the model wrote, got %s", name, c.Input)
				}
			}
		}
		if !tool {
			t.Errorf("%s: expected a tool_use block, got %s", name, got[name])
		}
	}
	for _, name := range []string{"responses.create", "responses.stream"} {
		var r struct {
			OutputText   string `json:"output_text"`
			Instructions string `json:"instructions"`
		}
		if err := json.Unmarshal(got[name], &r); err != nil || r.OutputText != "Hi from Claude." || r.Instructions != "Be brief." {
			t.Errorf("%s: expected output_text %q and the instructions restated, got %s", name, "Hi from Claude.", got[name])
		}
	}
	for _, name := range []string{"chat.create", "chat.stream"} {
		var c struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(got[name], &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Message.Content != "Hi from Claude." {
			t.Errorf("%s: expected the answer %q, got %s", name, "Hi from Claude.", got[name])
		}
	}
}
