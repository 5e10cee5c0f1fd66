package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// twoOrganizations is a group of two equal OpenAI accounts of two
// organizations (two keys), on llm_mock sites that mint and check
// encrypted reasoning as OpenAI does (organization); faultA and faultB
// are their fault blocks, if any.
func twoOrganizations(faultA, faultB string) string {
	return fmt.Sprintf(`
http://localhost:9080 {
	llm_router /v1/* {
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-org-a
			responses native
		}
		provider b {
			type openai
			base_url http://localhost:9082/v1
			api_key sk-org-b
			responses native
		}
		model codex {
			deployment a gpt-5
			deployment b gpt-5
		}
	}
}
http://localhost:9081 {
	llm_mock {
		organization org-a
		reply "Hi from a."
		%s
	}
}
http://localhost:9082 {
	llm_mock {
		organization org-b
		reply "Hi from b."
		%s
	}
}
`, faultA, faultB)
}

// codexTurns plays Codex CLI's store:false turns through the router: each
// turn streamed, its input the whole conversation with the answers'
// items (their reasoning with encrypted_content among them). It returns
// the conversation and each turn's status.
func codexTurns(t *testing.T, input []json.RawMessage, turns int) ([]json.RawMessage, []int) {
	t.Helper()
	var codes []int
	for i := range turns {
		user, _ := json.Marshal(map[string]any{"type": "message", "role": "user",
			"content": []any{map[string]any{"type": "input_text", "text": fmt.Sprintf("turn %d", i)}}})
		input = append(input, user)
		body, _ := json.Marshal(map[string]any{"model": "codex", "store": false, "stream": true,
			"include": []string{"reasoning.encrypted_content"}, "input": input})
		resp, err := http.Post(routerURL+"/v1/responses", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode != 200 {
			t.Logf("turn %d: %d %s", i, resp.StatusCode, raw)
			continue
		}
		for line := range strings.Lines(string(raw)) {
			data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
			if !ok || !strings.Contains(data, `"response.completed"`) {
				continue
			}
			var ev struct {
				Response struct {
					Output []json.RawMessage `json:"output"`
				} `json:"response"`
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatal(err)
			}
			input = append(input, ev.Response.Output...)
		}
	}
	return input, codes
}

// Issue 29 (1), through a real Caddy: 20 Codex turns on two equal accounts
// of two organizations all succeed (they were 400 invalid_encrypted_content
// every second turn); once the minting account answers 429, the other
// serves the turn, sent the conversation without the reasoning it cannot
// read.
func TestCodexReasoningAcrossOrganizations(t *testing.T) {
	load(t, twoOrganizations("", ""))
	input, codes := codexTurns(t, nil, 20)
	for i, c := range codes {
		if c != 200 {
			t.Errorf("turn %d: %d", i, c)
		}
	}
	a, b := stats(t, 9081).Requests, stats(t, 9082).Requests
	if a+b != 20 {
		t.Errorf("expected 20 upstream requests, got a %d, b %d", a, b)
	}
	// The minting account rate-limited: the other, stripped.
	limited := "fault status {\n status 429\n }"
	other, faults := 9082, []string{limited, ""}
	if b > a {
		other, faults = 9081, []string{"", limited}
	}
	load(t, twoOrganizations(faults[0], faults[1]))
	before := stats(t, other).Requests
	_, codes = codexTurns(t, input, 1)
	if codes[0] != 200 {
		t.Fatalf("with the minting account limited: %v", codes)
	}
	s := stats(t, other)
	if s.Requests != before+1 || strings.Contains(s.LastBody, `"encrypted_content":`) || !strings.Contains(s.LastBody, "turn 19") {
		t.Errorf("expected one stripped request to the other account (%d): %s", s.Requests-before, s.LastBody)
	}
}
