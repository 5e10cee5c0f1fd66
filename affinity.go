package llmrouter

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/llmrouter/caddy-llm-router/internal/fleet"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// Affinity (Handler.Affinity): which deployment served each conversation
// last, per model group.
const (
	// AffinityMax bounds how many conversations are remembered; the least
	// recently served are forgotten first.
	AffinityMax = 100_000
	// AffinityTTL is how long a quiet conversation is remembered: longer
	// than providers keep a prompt cache (5 minutes to an hour).
	AffinityTTL = time.Hour
	// maxAffinityKey bounds a key's length (longer ones are cut).
	maxAffinityKey = 256
)

// affinities outlives config reloads, as capacity states do; a value is
// the deployment's identity.
var affinities = sync.OnceValue(func() *expirable.LRU[string, string] {
	return expirable.NewLRU[string, string](AffinityMax, nil, AffinityTTL)
})

// affinityKey returns the request's conversation key for group, "" when it
// has none (or affinity is off).
func (h *Handler) affinityKey(r *http.Request, req *router.Request, group string) string {
	var key string
	switch v := h.Affinity; {
	case v == "":
		return ""
	case v == "body":
		body := req.Body
		for _, k := range []string{"prompt_cache_key", "user"} {
			if key, _ = jsonbody.GetString(body, k); key != "" {
				break
			}
		}
		if key == "" {
			if s, e, _ := jsonbody.FindMember(body, "metadata"); s >= 0 && body[s] == '{' {
				key, _ = jsonbody.GetString(body[s:e], "user_id")
			}
		}
	default:
		key = v
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			key = repl.ReplaceAll(v, "")
		}
		key = strings.TrimSpace(key)
	}
	if key == "" {
		return ""
	}
	if len(key) > maxAffinityKey {
		key = key[:maxAffinityKey]
	}
	return group + "\x00" + key
}

// prefer sets the request's preferred deployment: the one of its group
// (or fallback groups) that served its conversation last.
func (h *Handler) prefer(req *router.Request, group *router.Group, key string) {
	if key == "" || req.Pinned != nil {
		return
	}
	if identity, ok := affinities().Get(key); ok {
		req.Prefer = h.deploymentOf(group, identity, false)
	}
}

// remember notes the deployment that served the conversation.
func (h *Handler) remember(key string, res *router.Result) {
	if key != "" && answered(res) {
		affinities().Add(key, h.meta[res.Deployment].identity)
	}
}

// answered reports whether a deployment answered res successfully (a
// 2xx, or a committed stream).
func answered(res *router.Result) bool {
	return res.Deployment != nil && res.Err == nil && (res.Stream != nil || res.Status < 300)
}

// deploymentOf returns the deployment of group, or of its fallback
// groups, of the given identity (see Handler.meta; its fleet.DeploymentID
// when hashed), nil when none.
func (h *Handler) deploymentOf(group *router.Group, identity string, hashed bool) *router.Deployment {
	for g := range group.Chain() {
		for _, d := range g.Deployments {
			id := h.meta[d].identity
			if hashed {
				id = fleet.DeploymentID(id)
			}
			if id == identity {
				return d
			}
		}
	}
	return nil
}
