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
	// HeaderTokenCount marks a count_tokens answer the router estimated
	// itself: see api.HeaderTokenCount.
	HeaderTokenCount = api.HeaderTokenCount
)

// ServeHTTP answers the LLM API paths (see Handler); any other path under
// its matcher goes to the pass_through provider when one is named, else
// gets a 404 that lists them. It reads as a request goes: the client API
// of the path (forPath), which parses the body (parse); the router serves
// it (serve); the client API writes the answer (write).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	who, r, e := h.identify(r) // consumers.go: a 401 without a known key
	if e != nil {
		errorAPI(r).WriteError(w, e)
		return nil
	}
	c := &apiCall{r: r, who: who}
	if ok, err := h.forPath(w, c); !ok {
		return err // answered: no client API's path, a WebSocket, not a POST
	}
	if e := h.parse(w, c); e != nil {
		c.api.WriteError(w, e)
		return nil
	}
	defer func() { c.admitted.done(c.res, c.cost) }()
	h.serve(c)
	h.write(w, c)
	return nil
}

// apiCall is one client request on its way through ServeHTTP.
type apiCall struct {
	r        *http.Request
	api      api.API         // the client API of the path
	req      *router.Request // what it parsed of the body
	group    *router.Group   // the model group it names
	affinity affinity        // its affinity keys (affinity.go)
	res      *router.Result  // the router's answer
	made     string          // the Responses API's response id, once given
	who      string          // the consumer asking ("": anonymous; consumers.go)
	admitted *admission      // what its plan admitted it on, until it is done
	cost     float64         // what its answer cost (USD; 0 when unknown)
}

// forPath finds the client API of the request's path (api.ForPath) and
// reports whether it is left to serve a POST: the other paths are
// answered here (a background response's follow-ups, GET .../models and
// .../models/{id}, a Responses WebSocket, pass_through or the 404 of an
// unserved path), and so is any method but POST (405). err is a failed
// write of the models' list.
func (h *Handler) forPath(w http.ResponseWriter, c *apiCall) (ok bool, err error) {
	r := c.r
	if id, op, ok := responseFollowUp(r.URL.Path); ok {
		h.serveFollowUp(w, r, c.who, id, op) // background.go
		return false, nil
	}
	a := api.ForPath(r.URL.Path)
	if a == nil {
		return false, h.serveOther(w, r)
	}
	if ra, ok := a.(api.Responses); ok {
		a = h.responsesAPI(ra, &c.made, c.who)
		if isWebSocketUpgrade(r) {
			h.serveWebSocket(w, r, a)
			return false, nil
		}
	}
	c.api = a
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		a.WriteError(w, api.MethodError)
		return false, nil
	}
	return true, nil
}

// serveOther answers a path no client API takes: GET (or HEAD)
// .../models and .../models/{id} (one model group, as the SDKs'
// models.retrieve asks), else serveUnknown.
func (h *Handler) serveOther(w http.ResponseWriter, r *http.Request) error {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		path := strings.TrimSuffix(r.URL.Path, "/")
		if strings.HasSuffix(path, api.ModelsPath) {
			return api.WriteModels(w, h.models)
		}
		// GET .../models/{id}: one model group, as the SDKs' models.retrieve asks.
		if i := strings.LastIndex(path, api.ModelsPath+"/"); i >= 0 {
			id := path[i+len(api.ModelsPath+"/"):]
			_, ok := h.lookup.group(id)
			return api.WriteModel(w, id, ok)
		}
	}
	h.serveUnknown(w, r)
	return nil
}

// parse reads the body and parses it in the client's API, with its
// priority, its model group (which must serve the API), the deployment
// its Responses state pins it to, and its affinity. A request that does
// not fit is an *api.Error, and changes nothing.
func (h *Handler) parse(w http.ResponseWriter, c *apiCall) *api.Error {
	body, e := api.ReadBody(w, c.r, h.maxBody())
	if e != nil {
		return e
	}
	req, model, e := c.api.Parse(body, c.r.Header)
	if e != nil {
		return e
	}
	c.api = api.ForRequest(c.api, body) // what a translated answer restates of it, what an estimate counts
	if req.Priority, e = h.priority(c.r); e != nil {
		return e
	}
	group, ok := h.lookup.group(model)
	switch {
	case !ok:
		return api.ModelNotFoundError(model)
	case !group.Serves(req.Format):
		return api.NotSupportedError(model, req.Format)
	}
	if e := h.pin(c.who, req, group, model); e != nil {
		return e
	}
	if c.admitted, e = h.admit(w, c.who, group, req); e != nil { // consumers.go: the plan's 403 and 429s
		return e
	}
	h.bindReasoning(req)
	c.req, c.group = req, group
	c.affinity = h.affinityKey(c.r, req, group.Name)
	h.prefer(req, group, c.affinity)
	return nil
}

// serve has the router answer the request from its group, and remembers
// what the answer says of the conversation: the deployment that served
// it (affinity), the Responses conversation it added to.
func (h *Handler) serve(c *apiCall) {
	req := c.req
	res := h.router.ServeGroup(c.r.Context(), c.group, req)
	h.remember(c.affinity, res)
	h.rememberConversation(req, res)
	h.logDropped(req, res)
	if e, ok := res.Err.(*router.Error); ok && req.Pinned != nil {
		pinned := *e
		pinned.Message = "this request continues state that deployment " + req.Pinned.Name +
			" made (its previous_response_id or conversation), which that provider account alone keeps, so no other deployment can serve it: " + e.Message
		res.Err = &pinned
	}
	c.res = res
}

// write tells the answer (placeholders, access log, metrics, the router's
// headers), has the client API write it, then tells what it used and
// cost (account) and follows a background response.
func (h *Handler) write(w http.ResponseWriter, c *apiCall) {
	res, group := c.res, c.group.Name
	h.annotate(c.r, group, res) // the group's name: a pattern bounds the metrics' labels
	if res.Err != router.ErrClientGone {
		setRouterHeaders(w, res)
		h.limitHeader(w, res)
	}
	if err := c.api.Write(w, res); err != nil {
		name := ""
		if res.Deployment != nil {
			name = res.Deployment.Name
		}
		h.logger.Debug("client went away mid-stream", zap.String("deployment", name), zap.Error(err))
	}
	c.cost = h.account(c.r, group, res)
	for _, l := range res.Charged() { // its other attempts' charges: the consumer's budget pays them too
		c.cost += l.Deployment.Cost(l.Usage)
	}
	h.trackBackground(c, res, group)
}

// account tells what the answer used and cost, once it was written (a
// stream's usage is known at its end): the placeholders
// {http.llm_router.input_tokens}, output_tokens, cached_input_tokens,
// cache_write_tokens (cache_write_1h_tokens of them to the one-hour
// cache), reasoning_tokens and cost_usd, the same fields in
// the access log (llm_input_tokens, ...), and the tokens and cost
// metrics. Nothing is told of an answer whose provider stated no usage.
// It returns the cost (0 when unknown).
func (h *Handler) account(r *http.Request, model string, res *router.Result) float64 {
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
		return 0
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
	return cost
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
	return checkBraces("priority", v)
}

// checkBraces checks that each brace of a placeholder setting (name) is
// closed, none nested.
func checkBraces(name, v string) error {
	depth := 0
	for _, c := range v {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		}
		if depth < 0 || depth > 1 {
			return fmt.Errorf("%s: unbalanced braces in %q", name, v)
		}
	}
	if depth != 0 {
		return fmt.Errorf("%s: unbalanced braces in %q", name, v)
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
