package llmrouter

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/estimate"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/redact"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// HeaderTokenCount says how a count_tokens answer was made: "estimate"
// when no deployment of the group could count (the router's own count,
// by OpenAI's o200k_base tokenizer over the request's text, which differs
// from Claude's by some percent); absent when a provider counted.
const HeaderTokenCount = "X-LLM-Router-Token-Count"

// countTokensTimeout bounds one provider's count.
const countTokensTimeout = 10 * time.Second

// serveCountTokens answers POST .../messages/count_tokens: counted by the
// first deployment of the group (then its fallback groups) whose provider
// counts tokens (anthropic), passed on as it answered (its secrets
// redacted); the provider's client error (a 4xx but 429) is passed on too.
// When none is configured or none answers (rate-limited, down, drained)
// within the router's deadline (10 s at most each), the router's
// estimate, marked by HeaderTokenCount. Errors in the Messages format.
func (h *Handler) serveCountTokens(w http.ResponseWriter, r *http.Request) {
	a := api.Messages{}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		a.WriteError(w, api.MethodError)
		return
	}
	body, e := api.ReadBody(w, r, h.maxBody())
	if e != nil {
		a.WriteError(w, e)
		return
	}
	model, e := api.ParseCountTokens(body)
	if e != nil {
		a.WriteError(w, e)
		return
	}
	group, ok := h.lookup.group(model)
	if !ok {
		a.WriteError(w, api.ModelNotFoundError(model))
		return
	}
	header := api.MessagesHeaders(r.Header)
	// The whole count within the router's deadline, as any request.
	ctx, cancel := context.WithTimeout(r.Context(), h.router.Deadline)
	defer cancel()
	for g := range group.Chain() {
		for _, d := range g.Deployments {
			tc, ok := d.Provider.(provider.TokenCounter)
			if !ok || d.State.Disabled() || ctx.Err() != nil {
				continue
			}
			status, answer := h.countAt(ctx, tc, d.Model, d.Transport, body, header)
			answer = redact.JSON(answer, d.Secrets)
			if status == http.StatusOK || status >= 400 && status < 500 && status != http.StatusTooManyRequests &&
				status != http.StatusUnauthorized && status != http.StatusForbidden && status != http.StatusNotFound {
				w.Header().Set(HeaderDeployment, d.Name)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = w.Write(answer)
				return
			}
			h.logger.Debug("count_tokens: the provider could not count", zap.String("deployment", d.Name), zap.Int("status", status))
		}
	}
	n, _, ok := estimate.Exact(body, 1<<31)
	if !ok {
		n = estimate.Prompt(body)
	}
	w.Header().Set(HeaderTokenCount, "estimate")
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"input_tokens":` + strconv.FormatInt(n, 10) + `}`))
}

// countAt asks one provider to count: the status (0 when it could not be
// asked or did not answer) and, for a 200 with input_tokens or a client
// error, its body.
func (h *Handler) countAt(ctx context.Context, tc provider.TokenCounter, model string, rt http.RoundTripper, body []byte, header http.Header) (int, []byte) {
	ctx, cancel := context.WithTimeout(ctx, countTokensTimeout)
	defer cancel()
	req, err := tc.CountTokensRequest(ctx, model, body, header)
	if err != nil {
		return 0, nil
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || !json.Valid(answer) {
		return 0, nil
	}
	if resp.StatusCode == http.StatusOK {
		start, _, _ := jsonbody.FindMember(answer, "input_tokens")
		if start < 0 || answer[start] < '0' || answer[start] > '9' {
			return 0, nil
		}
	}
	return resp.StatusCode, bytes.Clone(answer)
}

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
