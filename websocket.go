package llmrouter

import (
	"net/http"
	"strings"

	"github.com/llmrouter/caddy-llm-router/internal/api"
)

// isWebSocketUpgrade reports whether r asks to open a WebSocket (RFC 6455
// section 4.1: a GET with Upgrade: websocket and a Connection that
// includes Upgrade), as Codex CLI does for .../responses when its
// provider supports WebSockets.
func isWebSocketUpgrade(r *http.Request) bool {
	if r.Method != http.MethodGet || !headerHasToken(r.Header, "Upgrade", "websocket") {
		return false
	}
	return headerHasToken(r.Header, "Connection", "upgrade")
}

// headerHasToken reports whether the comma-separated header name holds
// token (case-insensitive).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// serveWebSocket answers an upgrade to the Responses API's WebSocket mode
// with 426 Upgrade Required and an error in OpenAI's format: Codex CLI
// falls back to HTTP at once on a 426, where it retries a 405 (issue 29).
func (h *Handler) serveWebSocket(w http.ResponseWriter, _ *http.Request, a api.API) {
	a.WriteError(w, api.Errorf(http.StatusUpgradeRequired, api.WebSocketRefused, "",
		"this router does not serve the Responses API's WebSocket mode: use POST .../responses with \"stream\": true"))
}
