package llmrouter

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// A provider's client error is restated in the client's format: an OpenAI
// client gets OpenAI's error object for Anthropic's 400, and an Anthropic
// client Anthropic's for OpenAI's, the status and message kept. (Bug, issue
// 18: OpenAI clients received Anthropic's error body.)
func TestClientErrorsAreRestatedInTheClientsFormat(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		if strings.HasSuffix(r.URL.Path, "/messages") {
			_, _ = w.Write([]byte(`{"type":"error","error":{"type":"invalid_request_error","message":"messages.0.content: field required"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"error":{"message":"Invalid value for 'temperature'.","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}`))
	}))
	defer upstream.Close()
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_router {
		provider an {
			type anthropic
			base_url ` + upstream.URL + `/v1
			api_key sk-ant
		}
		provider oa {
			type openai
			base_url ` + upstream.URL + `/v1
			api_key sk-oa
		}
		model claude {
			deployment an claude-x
		}
		model gpt {
			deployment oa gpt-x
		}
	}`)); err != nil {
		t.Fatal(err)
	}
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	ask := func(path, body string) (int, map[string]any) {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)), nil)
		var m map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
			t.Fatalf("%s: %v: %s", path, err, w.Body)
		}
		return w.Code, m
	}
	code, m := ask("/v1/chat/completions", `{"model":"claude","messages":[{"role":"user","content":"hi"}]}`)
	e, _ := m["error"].(map[string]any)
	if code != 400 || m["type"] != nil || e == nil || e["type"] != "invalid_request_error" || e["message"] != "messages.0.content: field required" {
		t.Errorf("OpenAI client, Anthropic's 400: %d %v", code, m)
	}
	code, m = ask("/v1/messages", `{"model":"gpt","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	e, _ = m["error"].(map[string]any)
	if code != 400 || m["type"] != "error" || e == nil || e["type"] != "invalid_request_error" || e["message"] != "Invalid value for 'temperature'." {
		t.Errorf("Anthropic client, OpenAI's 400: %d %v", code, m)
	}
}
