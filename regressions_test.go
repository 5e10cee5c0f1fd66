package llmrouter

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
	h := handlerFromCaddyfile(t, `llm_router {
		provider an {
			type anthropic
			base_url `+upstream.URL+`/v1
			api_key sk-ant
		}
		provider oa {
			type openai
			base_url `+upstream.URL+`/v1
			api_key sk-oa
		}
		model claude {
			deployment an claude-x
		}
		model gpt {
			deployment oa gpt-x
		}
	}`)
	defer h.Cleanup()
	ask := func(path, body string) (int, map[string]any) {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, postJSON(path, body), nil)
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

// GET .../models/{id} answers a model group (by its name, an alias, or a
// name its pattern matches) as OpenAI's models.retrieve does, and 404 in
// OpenAI's error format for anything else.
func TestRetrieveAModel(t *testing.T) {
	h := handlerFromCaddyfile(t, `llm_router {
		provider p {
			type openai
			base_url http://127.0.0.1:1/v1
			api_key none
		}
		model fast {
			alias fast-2025
			deployment p x
		}
		model claude-sonnet-* {
			deployment p y
		}
	}`)
	defer h.Cleanup()
	for id, want := range map[string]int{"fast": 200, "fast-2025": 200, "claude-sonnet-4-5": 200, "gpt-9": 404} {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/models/"+id, nil), nil)
		var m map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil || w.Code != want {
			t.Errorf("%s: %d %s, want %d", id, w.Code, w.Body, want)
			continue
		}
		if want == 200 && (m["id"] != id || m["object"] != "model") {
			t.Errorf("%s: %v", id, m)
		}
		if e, _ := m["error"].(map[string]any); want == 404 && (e == nil || e["code"] != "model_not_found") {
			t.Errorf("%s: %v", id, m)
		}
	}
}
