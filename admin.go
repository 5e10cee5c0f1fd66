package llmrouter

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// live holds the provisioned handlers, for the admin API and the metrics
// collector. A handler joins at the end of Provision and leaves in Cleanup.
var live = struct {
	sync.Mutex
	handlers map[*Handler]struct{}
}{handlers: map[*Handler]struct{}{}}

func addLive(h *Handler) {
	live.Lock()
	defer live.Unlock()
	live.handlers[h] = struct{}{}
}

func removeLive(h *Handler) {
	live.Lock()
	defer live.Unlock()
	delete(live.handlers, h)
}

// liveDeployment is one deployment of a live handler, with the groups that
// use it.
type liveDeployment struct {
	dep    *router.Deployment
	meta   deploymentMeta
	groups []string
}

// liveDeployments lists the deployments of every live handler, once each
// (during a reload the old and new config share their states), sorted by name.
func liveDeployments() []*liveDeployment {
	live.Lock()
	defer live.Unlock()
	byKey := map[string]*liveDeployment{}
	var out []*liveDeployment
	for h := range live.handlers {
		for _, group := range h.names {
			for _, d := range h.groups[group].Deployments {
				key := fmt.Sprintf("%s|%p", d.Name, d.State)
				ld, ok := byKey[key]
				if !ok {
					ld = &liveDeployment{dep: d, meta: h.meta[d]}
					byKey[key] = ld
					out = append(out, ld)
				}
				if !slices.Contains(ld.groups, group) {
					ld.groups = append(ld.groups, group)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b *liveDeployment) int {
		if a.dep.Name < b.dep.Name {
			return -1
		}
		if a.dep.Name > b.dep.Name {
			return 1
		}
		return 0
	})
	return out
}

// adminAPI serves GET /llm_router/deployments on Caddy's admin endpoint:
// each deployment's circuit, limits, remaining counts, resets, latency
// EWMAs, success rate, in-flight attempts and last error. Never a key.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.llm_router",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes implements caddy.AdminRouter.
func (adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/llm_router/deployments", Handler: caddy.AdminHandlerFunc(handleDeployments)},
		{Pattern: "/llm_router/deployments/", Handler: caddy.AdminHandlerFunc(handleDeploymentAction)},
		{Pattern: "/llm_router/consumers", Handler: caddy.AdminHandlerFunc(handleConsumers)}, // consumers.go
	}
}

// GroupStatus is a model group's queue in GET /llm_router/deployments.
type GroupStatus struct {
	// Name is the model group's name.
	Name string `json:"name"`
	// Queued is how many requests wait for capacity now.
	Queued int `json:"queued"`
	// Waited is how many requests have waited in the queue since the
	// config loaded, and MeanWaitMS their mean wait in milliseconds.
	Waited     int64   `json:"waited"`
	MeanWaitMS float64 `json:"mean_wait_ms"`
	// Budget is the group's budget and what was spent of it in its
	// current window; absent without one.
	Budget *capacity.SpendingReport `json:"budget,omitempty"`
}

// liveGroups lists the model groups of every live handler, sorted by name
// (a reload's old and new configs each list theirs).
func liveGroups() []GroupStatus {
	live.Lock()
	defer live.Unlock()
	out := []GroupStatus{}
	for h := range live.handlers {
		for _, name := range h.names {
			g := h.groups[name]
			st := GroupStatus{Name: name, Queued: g.Queued(), Budget: g.Spending.Report(time.Now())}
			n, total := g.Waits()
			if st.Waited = n; n > 0 {
				st.MeanWaitMS = float64(total.Milliseconds()) / float64(n)
			}
			out = append(out, st)
		}
	}
	slices.SortStableFunc(out, func(a, b GroupStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// DeploymentStatus is one entry of GET /llm_router/deployments.
type DeploymentStatus struct {
	// Name is "<provider>/<upstream model>".
	Name string `json:"name"`
	// Type is the provider's type.
	Type string `json:"type"`
	// BaseURL is the provider's API root, its userinfo and query values
	// masked ("https://xxxxx@host/openai?api-key=xxxxx").
	BaseURL string `json:"base_url"`
	// ModelGroups lists the groups that use the deployment.
	ModelGroups []string `json:"model_groups"`
	// Budget is the deployment's budget and what was spent of it in its
	// current window; absent without one.
	Budget *capacity.SpendingReport `json:"budget,omitempty"`
	capacity.Snapshot
}

// report is the body of GET /llm_router/deployments, and of the status
// page's JSON (status.go): every live deployment and model group. It holds
// no key.
type report struct {
	Deployments []DeploymentStatus `json:"deployments"`
	ModelGroups []GroupStatus      `json:"model_groups"`
	// Consumers are the consumers with limits that asked of late, and
	// their use of them (consumers.go).
	Consumers []consumerStatus `json:"consumers"`
}

// statusReport builds the report of the live handlers as seen at now; both
// lists are empty, never null, when no llm_router is loaded.
func statusReport(now time.Time) report {
	out := report{Deployments: []DeploymentStatus{}, ModelGroups: liveGroups(), Consumers: liveConsumers()}
	for _, ld := range liveDeployments() {
		out.Deployments = append(out.Deployments, DeploymentStatus{
			Name: ld.dep.Name, Type: ld.meta.typ, BaseURL: ld.meta.baseURL,
			ModelGroups: ld.groups, Snapshot: ld.dep.State.Snapshot(now), Budget: ld.dep.Spending.Report(now),
		})
	}
	return out
}

func handleDeployments(w http.ResponseWriter, r *http.Request) error {
	return serveReport(w, r, func() any { return statusReport(time.Now()) })
}

// serveReport answers a GET on an admin endpoint with report's value as
// indented JSON (no \u003e for a > in a name or message); any other
// method is Caddy's 405.
func serveReport(w http.ResponseWriter, r *http.Request, report func() any) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: errors.New("method not allowed")}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := jsonbody.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(report())
}

// handleDeploymentAction serves POST /llm_router/deployments/<name>/<action>
// on Caddy's admin endpoint (its access control applies): reset (forget
// the deployment's circuit and learned windows), disable (drain: no new
// attempt) and enable. <name> is the deployment's "<provider>/<upstream
// model>"; every live deployment of that name is acted on. Each action is
// logged.
func handleDeploymentAction(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed: use POST")}
	}
	rest := strings.TrimPrefix(r.URL.Path, "/llm_router/deployments/")
	i := strings.LastIndex(rest, "/")
	if i <= 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("expected /llm_router/deployments/<provider>/<model>/{reset,disable,enable}")}
	}
	name, action := rest[:i], rest[i+1:]
	var act func(st *capacity.State)
	now := time.Now()
	switch action {
	case "reset":
		act = func(st *capacity.State) { st.Reset(now) }
	case "disable":
		act = func(st *capacity.State) { st.Disable(now, true) }
	case "enable":
		act = func(st *capacity.State) { st.Disable(now, false) }
	default:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown action %q: reset, disable or enable", action)}
	}
	n := 0
	for _, ld := range liveDeployments() {
		if ld.dep.Name == name {
			act(ld.dep.State)
			n++
		}
	}
	if n == 0 {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no deployment %q", name)}
	}
	caddy.Log().Named("admin.api.llm_router").Info("deployment "+action, zap.String("deployment", name))
	w.Header().Set("Content-Type", "application/json")
	return jsonbody.NewEncoder(w).Encode(map[string]any{"deployment": name, "action": action, "deployments": n})
}

// Interface guards
var _ caddy.AdminRouter = (*adminAPI)(nil)
