package llmrouter

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Response headers that tell the client which deployment answered.
const (
	HeaderDeployment = "X-LLM-Router-Deployment"
	HeaderAttempts   = "X-LLM-Router-Attempts"
	// HeaderGroup names the model group that answered: the one asked for,
	// or its fallback group (ModelGroup.FallbackGroup).
	HeaderGroup = "X-LLM-Router-Group"
	// HeaderHedge says that a hedge was started (hedge_after) and which
	// attempt answered: "lost" (the first) or "won" (the hedge). Absent
	// when none was.
	HeaderHedge = "X-LLM-Router-Hedge"
)

// ServeHTTP answers the LLM API paths (see Handler); any other path under
// its matcher gets a 404 that lists them. The client API of the path parses the request and writes the
// answer; the router finds it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/messages/count_tokens") {
		h.serveCountTokens(w, r)
		return nil
	}
	if id, op, ok := responseFollowUp(r.URL.Path); ok {
		h.serveFollowUp(w, r, id, op) // background.go
		return nil
	}
	a := api.ForPath(r.URL.Path)
	made := "" // the Responses API's response id, once given
	if ra, ok := a.(api.Responses); ok {
		a = h.responsesAPI(ra, &made)
	}
	if a == nil {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			path := strings.TrimSuffix(r.URL.Path, "/")
			if strings.HasSuffix(path, "/models") {
				return api.WriteModels(w, h.models)
			}
			// GET .../models/{id}: one model group, as the SDKs' models.retrieve asks.
			if i := strings.LastIndex(path, "/models/"); i >= 0 {
				id := path[i+len("/models/"):]
				_, ok := h.lookup.group(id)
				return api.WriteModel(w, id, ok)
			}
		}
		h.serveUnknown(w, r)
		return nil
	}
	if _, ok := a.(api.Responses); ok && isWebSocketUpgrade(r) {
		h.serveWebSocket(w, r, a)
		return nil
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		a.WriteError(w, api.MethodError)
		return nil
	}
	body, e := api.ReadBody(w, r, h.maxBody())
	if e != nil {
		a.WriteError(w, e)
		return nil
	}
	req, model, e := a.Parse(body, r.Header)
	if e != nil {
		a.WriteError(w, e)
		return nil
	}
	if ra, ok := a.(api.Responses); ok {
		a = ra.WithRequest(body) // what a translated answer restates of it
	}
	if req.Priority, e = h.priority(r); e != nil {
		a.WriteError(w, e)
		return nil
	}
	group, ok := h.lookup.group(model)
	switch {
	case !ok:
		a.WriteError(w, api.ModelNotFoundError(model))
		return nil
	case !group.Serves(req.Format):
		a.WriteError(w, api.NotSupportedError(model, req.Format))
		return nil
	}
	req.NoHedge = req.Format == provider.Responses && isBackground(req.Body) // background.go
	if e := h.pin(req, group, model); e != nil {
		a.WriteError(w, e)
		return nil
	}
	h.bindReasoning(req)
	affinity := h.affinityKey(r, req, group.Name)
	h.prefer(req, group, affinity)
	res := h.router.ServeGroup(r.Context(), group, req)
	h.remember(affinity, res)
	h.rememberConversation(req, res)
	h.logDropped(req, res)
	if e, ok := res.Err.(*router.Error); ok && req.Pinned != nil {
		c := *e
		c.Message = "this request continues state that deployment " + req.Pinned.Name +
			" made (its previous_response_id or conversation), which that provider account alone keeps, so no other deployment can serve it: " + e.Message
		res.Err = &c
	}
	h.annotate(r, group.Name, res) // the group's name: a pattern bounds the metrics' labels
	if res.Err != router.ErrClientGone {
		setRouterHeaders(w, res)
	}
	if err := a.Write(w, res); err != nil {
		name := ""
		if res.Deployment != nil {
			name = res.Deployment.Name
		}
		h.logger.Debug("client went away mid-stream", zap.String("deployment", name), zap.Error(err))
	}
	h.account(r, group.Name, res)
	h.trackBackground(req, res, group.Name, made)
	return nil
}

// account tells what the answer used and cost, once it was written (a
// stream's usage is known at its end): the placeholders
// {http.llm_router.input_tokens}, output_tokens, cached_input_tokens,
// cache_write_tokens (cache_write_1h_tokens of them to the one-hour
// cache), reasoning_tokens and cost_usd, the same fields in
// the access log (llm_input_tokens, ...), and the tokens and cost
// metrics. Nothing is told of an answer whose provider stated no usage.
func (h *Handler) account(r *http.Request, model string, res *router.Result) {
	u, ok := res.Usage, res.UsageStated
	legs := []router.Leg{{Deployment: res.Deployment, Usage: u}}
	s := servedOf(r) // served.go
	if res.Stream != nil {
		// A resumed stream: each attempt's usage on its deployment.
		u, ok = res.Stream.Usage()
		legs = res.Stream.Legs()
		if n := res.Stream.Resumes(); n > 0 && s != nil {
			s.resumes, s.resumedOn = n, res.Stream.Deployment().Name
		}
		if se := res.Stream.Broke(); se != nil && s != nil {
			s.streamError = se.Class.String()
			if se.Bounded {
				s.streamError = "max_stream_bytes" // the router's bound, not a failure of the provider
			}
		}
	}
	if !ok || res.Deployment == nil {
		return
	}
	cost := 0.0
	for _, l := range legs {
		cost += l.Deployment.Cost(l.Usage)
	}
	if s != nil {
		s.accounted, s.usage, s.costUSD = true, u, cost
	}
	group := model
	if res.Group != nil {
		group = res.Group.Name
	}
	for _, l := range legs {
		h.metrics.usage(group, l.Deployment.Name, l.Usage, l.Deployment.Cost(l.Usage))
	}
}

// priority resolves the request's priority (Handler.Priority): the
// default when none is configured or its placeholder resolves to nothing,
// else a whole number from 0 to 9 (a 400 otherwise).
func (h *Handler) priority(r *http.Request) (int, *api.Error) {
	v := h.Priority
	if strings.Contains(v, "{") {
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			v = repl.ReplaceAll(v, "")
		}
		v = strings.TrimSpace(v)
	}
	if v == "" {
		return router.DefaultPriority, nil
	}
	p, err := parsePriority(v)
	if err != nil {
		return 0, api.Errorf(http.StatusBadRequest, api.InvalidValue, "priority", "%v", err)
	}
	return p, nil
}

// checkPriority checks a configured priority: a number (parsePriority), or
// text with placeholders, each brace closed.
func checkPriority(v string) error {
	if !strings.Contains(v, "{") && !strings.Contains(v, "}") {
		_, err := parsePriority(v)
		return err
	}
	depth := 0
	for _, c := range v {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		}
		if depth < 0 || depth > 1 {
			return fmt.Errorf("priority: unbalanced braces in %q", v)
		}
	}
	if depth != 0 {
		return fmt.Errorf("priority: unbalanced braces in %q", v)
	}
	return nil
}

// parsePriority reads a priority: a whole number from router.MinPriority
// to router.MaxPriority.
func parsePriority(v string) (int, error) {
	p, err := strconv.Atoi(v)
	if err != nil || p < router.MinPriority || p > router.MaxPriority {
		if len(v) > 20 {
			v = v[:20] + "..."
		}
		return 0, fmt.Errorf("priority must be a whole number from %d to %d, got %q", router.MinPriority, router.MaxPriority, v)
	}
	return p, nil
}

func (h *Handler) maxBody() int64 {
	if h.MaxBody > 0 {
		return h.MaxBody
	}
	return DefaultMaxBody
}

// annotate sets the placeholders, adds the same facts to Caddy's access log
// entry for the request, and counts the request.
func (h *Handler) annotate(r *http.Request, model string, res *router.Result) {
	name, reason, group := "", "", model
	if res.Deployment != nil {
		name = res.Deployment.Name
	}
	if res.Group != nil {
		group = res.Group.Name
	}
	if res.FailoverReason != 0 {
		reason = res.FailoverReason.String()
	}
	if s := servedOf(r); s != nil { // served.go
		s.annotated, s.deployment, s.attempts, s.failoverReason, s.modelGroup = true, name, res.Attempts, reason, group
	}
	h.metrics.request(model, name, status(res))
	if res.Tried != nil && res.Tried.Name != model {
		h.metrics.fallback(model, res.Tried.Name) // whether it answered or not
	}
}

// status is the HTTP status the client gets for res.
func status(res *router.Result) int {
	if res.Err == router.ErrClientGone {
		return 499 // nginx's "client closed request"
	}
	if e, ok := res.Err.(*router.Error); ok {
		return e.Status
	}
	if res.Stream != nil {
		return http.StatusOK
	}
	return res.Status
}

// The router's headers in their canonical form (X-Llm-Router-...), as
// Header.Set would write them: set directly, a request canonicalizes
// none of their names again.
var (
	canonicalDeployment = http.CanonicalHeaderKey(HeaderDeployment)
	canonicalAttempts   = http.CanonicalHeaderKey(HeaderAttempts)
	canonicalHedge      = http.CanonicalHeaderKey(HeaderHedge)
	canonicalGroup      = http.CanonicalHeaderKey(HeaderGroup)
)

func setRouterHeaders(w http.ResponseWriter, res *router.Result) {
	h := w.Header()
	if res.Deployment != nil {
		h[canonicalDeployment] = []string{res.Deployment.Name}
	}
	h[canonicalAttempts] = []string{strconv.Itoa(res.Attempts)}
	if res.Hedge != "" {
		h[canonicalHedge] = []string{res.Hedge}
	}
	if res.Group != nil {
		h[canonicalGroup] = []string{res.Group.Name}
	}
}
