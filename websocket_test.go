package llmrouter

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// An upgrade to WebSocket mode that the router does not serve is answered
// 426 Upgrade Required with an error in OpenAI's format, which Codex CLI
// takes as "fall back to HTTP" at once (a 405 it retries: issue 29).
func TestWebSocketUpgradeRefusedWith426(t *testing.T) {
	t.Setenv("LLM_ROUTER_TEST_KEY", "sk-from-env")
	h := handlerFromJSON(t, jsonConfig)
	if err := h.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	req := httptest.NewRequest(http.MethodGet, "/v1/responses", nil)
	req.Header.Set("Connection", "keep-alive, Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req, nil); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusUpgradeRequired ||
		body.Error.Code != "websocket_not_supported" || body.Error.Type != "invalid_request_error" || body.Error.Message == "" {
		t.Errorf("expected 426 with an OpenAI error, got %d %s", rec.Code, rec.Body)
	}
}
