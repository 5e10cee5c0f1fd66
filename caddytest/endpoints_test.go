package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// A provider's count_tokens answer is passed on with its key redacted.
func TestCountTokensRedacts(t *testing.T) {
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		provider claude {
			type anthropic
			base_url http://localhost:9083/v1
			api_key sk-ant-api03-secretsecretsecretsecret
		}
		model claude {
			deployment claude count-model
		}
	}
}
http://localhost:9083 {
	respond `+"`"+`{"type":"error","error":{"type":"invalid_request_error","message":"invalid x-api-key sk-ant-api03-secretsecretsecretsecret"}}`+"`"+` 400
}
`)
	resp, err := http.Post(routerURL+"/v1/messages/count_tokens", "application/json",
		strings.NewReader(`{"model":"claude","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || strings.Contains(string(body), "secretsecret") || !strings.Contains(string(body), "[redacted]") {
		t.Errorf("expected the provider's 400 with its key redacted, got %d %s", resp.StatusCode, body)
	}
}

// count_tokens: counted by an Anthropic deployment of the group, passed on
// as it answered; with none, the router's estimate, marked as one.
func TestCountTokens(t *testing.T) {
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		provider claude {
			type anthropic
			base_url http://localhost:9081/v1
			api_key sk-ant
		}
		provider oai {
			type openai
			base_url http://localhost:9082/v1
			api_key sk-oai
		}
		model claude {
			deployment claude count-model
		}
		model gpt {
			deployment oai count-gpt
		}
	}
}
http://localhost:9081 {
	llm_mock {
		dialect anthropic
		api_key sk-ant
	}
}
http://localhost:9082 {
	llm_mock
}
`)
	body := `{"model":"claude","messages":[{"role":"user","content":"Count these words, please."}]}`
	post := func(body string) (*http.Response, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, routerURL+"/v1/messages/count_tokens", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		return resp, out
	}
	before := stats(t, 9081).CountTokens
	resp, out := post(body)
	// The mock counts (body with the upstream model) bytes / 4.
	upstream := strings.Replace(body, `"claude"`, `"count-model"`, 1)
	if resp.StatusCode != 200 || out["input_tokens"] != float64((len(upstream)+3)/4) ||
		resp.Header.Get("X-LLM-Router-Deployment") != "claude/count-model" || resp.Header.Get("X-LLM-Router-Token-Count") != "" {
		t.Errorf("expected the provider's count, got %d %v %v", resp.StatusCode, out, resp.Header)
	}
	if n := stats(t, 9081).CountTokens; n != before+1 {
		t.Errorf("expected one count_tokens at the provider, got %d", n-before)
	}
	if h := stats(t, 9081).LastHeaders["Anthropic-Version"]; h != "2023-06-01" {
		t.Errorf("expected the client's anthropic-version upstream, got %q", h)
	}

	resp, out = post(`{"model":"gpt","messages":[{"role":"user","content":"Count these words, please."}]}`)
	if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Token-Count") != "estimate" {
		t.Errorf("expected the router's estimate, marked, got %d %v", resp.StatusCode, resp.Header)
	}
	if n, _ := out["input_tokens"].(float64); n < 5 || n > 40 {
		t.Errorf("expected an estimate of the text's tokens, got %v", out)
	}

	resp, out = post(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 404 || out["type"] != "error" {
		t.Errorf("expected a Messages 404, got %d %v", resp.StatusCode, out)
	}
	resp, out = post(`{"model":"claude","messages":[]}`)
	if resp.StatusCode != 400 || out["type"] != "error" {
		t.Errorf("expected a Messages 400, got %d %v", resp.StatusCode, out)
	}
}

// A path under the router's matcher that it does not serve is a 404 that
// names what it serves, in the client's format; never an empty 200.
func TestUnknownEndpointIs404(t *testing.T) {
	load(t, twoProviders("", "unk", "unk-a", "unk-b", "", ""))
	for _, c := range []struct {
		path, anthropic string
		openai          bool
	}{
		{"/v1/images/generations", "", true},
		{"/v1/audio/speech", "", true},
		{"/v1/messages/batches", "2023-06-01", false},
	} {
		req, _ := http.NewRequest(http.MethodPost, routerURL+c.path, strings.NewReader(`{"model":"unk"}`))
		req.Header.Set("Content-Type", "application/json")
		if c.anthropic != "" {
			req.Header.Set("anthropic-version", c.anthropic)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			Type  string `json:"type"`
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &out)
		if resp.StatusCode != 404 || !strings.Contains(out.Error.Message, "/responses") || !strings.Contains(out.Error.Message, ".../responses/{id}/cancel") ||
			c.openai != (out.Type == "") || !c.openai && out.Error.Type != "not_found_error" {
			t.Errorf("%s: expected a 404 listing the endpoints, got %d %s", c.path, resp.StatusCode, raw)
		}
	}
}

// Model names as agents send them: a pattern takes dated ids, an alias an
// exact other name, for chat, messages and responses alike; /v1/models
// lists the names.
func TestModelPatternsAndAliases(t *testing.T) {
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		provider a {
			type openai
			base_url http://localhost:9081/v1
			api_key sk-a
		}
		model claude-sonnet-* {
			alias sonnet
			deployment a pattern-upstream
		}
	}
}
http://localhost:9081 {
	llm_mock
}
`)
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"claude-sonnet-4-5-20250929","messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/messages", `{"model":"sonnet","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"claude-sonnet-4-6","input":"hi"}`},
	} {
		resp, err := http.Post(routerURL+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-LLM-Router-Group") != "claude-sonnet-*" {
			t.Errorf("%s: expected the pattern's group to answer, got %d %v %s", c.path, resp.StatusCode, resp.Header, body)
		}
		if m := stats(t, 9081).LastModel; m != "pattern-upstream" {
			t.Errorf("%s: expected the deployment's upstream model, got %q", c.path, m)
		}
	}
	resp, err := http.Post(routerURL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"claude-opus-4","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("expected a name no group takes to be a 404, got %d", resp.StatusCode)
	}
	resp, _ = http.Get(routerURL + "/v1/models")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"id":"claude-sonnet-*"`) || !strings.Contains(string(body), `"id":"sonnet"`) {
		t.Errorf("expected the pattern and the alias listed, got %s", body)
	}
	resp, _ = http.Get(routerURL + "/v1/models/claude-sonnet-4-5-20250929")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("expected a dated id the pattern takes to exist, got %d", resp.StatusCode)
	}
	// The admin endpoint, its actions and the metrics name groups, never
	// aliases.
	for _, c := range []struct{ method, url, want string }{
		{http.MethodGet, "http://localhost:2999/llm_router/deployments", `"a/pattern-upstream"`},
		{http.MethodPost, "http://localhost:2999/llm_router/deployments/a/pattern-upstream/disable", ""},
		{http.MethodPost, "http://localhost:2999/llm_router/deployments/a/pattern-upstream/enable", ""},
		{http.MethodGet, "http://localhost:2999/metrics", `model_group="claude-sonnet-*"`},
	} {
		req, _ := http.NewRequest(c.method, c.url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.url, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), c.want) {
			t.Errorf("%s %s: expected 200 with %q, got %d %.300s", c.method, c.url, c.want, resp.StatusCode, body)
		}
	}
}

// pass_through: what the router does not serve goes to one provider as it
// came, under its API root, with the provider's key and never the client's
// (and the provider's key is not passed back to the client).
func TestPassThrough(t *testing.T) {
	load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		pass_through oai
		provider oai {
			type openai
			base_url http://localhost:9083/v1
			api_key sk-pass-through
		}
		model m {
			deployment oai m-up
		}
	}
}
http://localhost:9083 {
	respond "path={http.request.uri} auth={http.request.header.Authorization} xkey={http.request.header.X-Api-Key} body={http.request.body}" 201
}
`)
	req, _ := http.NewRequest(http.MethodPost, routerURL+"/v1/audio/speech?voice=alloy&key=client-secret-3", strings.NewReader(`{"input":"hi"}`))
	req.Header.Set("Authorization", "Bearer client-secret")
	req.Header.Set("X-Api-Key", "client-secret-2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The provider got its key (sk-pass-through); its echo of it is
	// redacted on the way back, at its length.
	want := `path=/v1/audio/speech?voice=alloy auth=Bearer [redacted]xxxxx xkey= body={"input":"hi"}`
	if resp.StatusCode != 201 || string(body) != want {
		t.Errorf("expected %q (201), got %d %q", want, resp.StatusCode, body)
	}
	if strings.Contains(string(body), "client-secret") {
		t.Error("the client's credentials reached the provider")
	}
}

// A pass_through provider that refuses the router's key and echoes it
// (llm_mock's 401, as OpenAI's: a key of up to 12 characters whole, a
// longer one's first 8 and last 4 around stars) reaches the client with
// the provider's 401 and none of the key.
func TestPassThroughRedactsTheEchoedKey(t *testing.T) {
	for _, key := range []string{"sk-7Qx9pL2", "sk-proj-PassThrough0123456789wxyz"} {
		t.Run(key, func(t *testing.T) {
			load(t, `
http://localhost:9080 {
	llm_router /v1/* {
		pass_through oai
		provider oai {
			type openai
			base_url http://localhost:9083/v1
			api_key `+key+`
		}
		model m {
			deployment oai m-up
		}
	}
}
http://localhost:9083 {
	llm_mock {
		api_key sk-the-mocks-own-key
	}
}
`)
			req, _ := http.NewRequest(http.MethodPost, routerURL+"/v1/audio/speech", strings.NewReader(`{"model":"tts-1","input":"hi","voice":"alloy"}`))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readBody(t, resp)
			if resp.StatusCode != 401 || !strings.Contains(body, "Incorrect API key provided: [redacted]") ||
				strings.Contains(body, key[:8]) || strings.Contains(body, key[len(key)-4:]) {
				t.Errorf("expected the provider's 401 without the key, got %d %s", resp.StatusCode, body)
			}
		})
	}
}

// Legacy completions go to the group's OpenAI-format deployments as they
// came, with failover, streamed or not; a group with none answers 400.
func TestLegacyCompletions(t *testing.T) {
	load(t, twoProviders("", "legacy", "legacy-a", "legacy-b",
		"fault rate_limit {\n header Retry-After 30\n }", "reply \"Once upon a time.\"\n chunks 3"))
	resp, err := http.Post(routerURL+"/v1/completions", "application/json", strings.NewReader(`{"model":"legacy","prompt":"Tell a story","max_tokens":20}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"text":"Once upon a time."`) ||
		resp.Header.Get("X-LLM-Router-Deployment") != "b/legacy-b" || resp.Header.Get("X-LLM-Router-Attempts") != "2" {
		t.Errorf("expected b's completion after a's 429, got %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if s := stats(t, 9082); !strings.Contains(s.LastBody, `"prompt":"Tell a story"`) || s.LastModel != "legacy-b" {
		t.Errorf("expected the body as it came, with b's model, got %q %s", s.LastModel, s.LastBody)
	}
	resp, err = http.Post(routerURL+"/v1/completions", "application/json", strings.NewReader(`{"model":"legacy","prompt":"Tell a story","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Count(string(body), `"text":`) < 3 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Errorf("expected the completion streamed, got %d %s", resp.StatusCode, body)
	}
	resp, err = http.Post(routerURL+"/v1/completions", "application/json", strings.NewReader(`{"model":"legacy"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "prompt") {
		t.Errorf("expected a 400 naming prompt, got %d %s", resp.StatusCode, body)
	}
}
