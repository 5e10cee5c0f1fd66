package llmrouter

import (
	"net/http"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
)

// serveUnknown answers a path under the router's matcher that it does not
// serve: through the pass_through provider when there is one (but for
// what a page on another origin sent unasked: passRefusal's 403); else
// 404. Errors in the Messages format for a client that speaks it (it
// sends anthropic-version), else OpenAI's.
func (h *Handler) serveUnknown(w http.ResponseWriter, r *http.Request) {
	if h.passProxy != nil {
		if e := passRefusal(r); e != nil {
			h.logger.Debug("pass_through: refused a request from another origin", zap.String("method", r.Method),
				zap.String("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")))
			unknownAPI(r).WriteError(w, e)
			return
		}
		h.passProxy.ServeHTTP(w, r)
		return
	}
	path := r.URL.Path
	if len(path) > 100 {
		path = path[:100] + "..."
	}
	unknownAPI(r).WriteError(w, api.Errorf(http.StatusNotFound, api.NotFound, "",
		"llm_router does not serve %s %s; it serves %s", r.Method, strconv.Quote(path), api.Served()))
}

// unknownAPI is the client API that answers a path the router does not
// serve: Messages for a client that speaks it, else Chat.
func unknownAPI(r *http.Request) api.API {
	if r.Header.Get("Anthropic-Version") != "" || strings.Contains(r.URL.Path, "/messages") {
		return api.Messages{}
	}
	return api.Chat{}
}
