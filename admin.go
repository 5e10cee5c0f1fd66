package llmrouter

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"
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
	return []caddy.AdminRoute{{Pattern: "/llm_router/deployments", Handler: caddy.AdminHandlerFunc(handleDeployments)}}
}

// DeploymentStatus is one entry of GET /llm_router/deployments.
type DeploymentStatus struct {
	// Name is "<provider>/<upstream model>".
	Name string `json:"name"`
	// Type is the provider's type.
	Type string `json:"type"`
	// BaseURL is the provider's API root.
	BaseURL string `json:"base_url"`
	// ModelGroups lists the groups that use the deployment.
	ModelGroups []string `json:"model_groups"`
	capacity.Snapshot
}

func handleDeployments(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed")}
	}
	now := time.Now()
	out := struct {
		Deployments []DeploymentStatus `json:"deployments"`
	}{Deployments: []DeploymentStatus{}}
	for _, ld := range liveDeployments() {
		out.Deployments = append(out.Deployments, DeploymentStatus{
			Name: ld.dep.Name, Type: ld.meta.typ, BaseURL: ld.meta.baseURL,
			ModelGroups: ld.groups, Snapshot: ld.dep.State.Snapshot(now),
		})
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// Interface guards
var _ caddy.AdminRouter = (*adminAPI)(nil)
