package llmrouter

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/fleet"
	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// Which deployment made each Responses API response (in fleet mode, also
// in the fleet's store: a continuation may reach another instance): a request with
// previous_response_id continues state that only the provider account
// which made that response keeps (OpenAI keeps a response 30 days:
// https://platform.openai.com/docs/guides/conversation-state), so it is
// served by that deployment or not at all.
const (
	// ResponseOwnersMax bounds how many response ids are remembered; the
	// least recently used are forgotten first.
	ResponseOwnersMax = 100_000
	// ResponseOwnersTTL is how long a response id is remembered.
	ResponseOwnersTTL = 30 * 24 * time.Hour
)

// responseOwner is what is remembered of a response: the identity of the
// deployment that made it (see Handler.meta), "" for a response the
// router translated from Chat Completions (no provider keeps its state).
type responseOwner struct {
	identity, name string
}

// responseOwners outlives config reloads, as capacity states do: a
// conversation continues across a reload.
var responseOwners = sync.OnceValue(func() *expirable.LRU[string, responseOwner] {
	return expirable.NewLRU[string, responseOwner](ResponseOwnersMax, nil, ResponseOwnersTTL)
})

// responsesAPI returns the Responses API of this handler: it remembers
// which deployment made each response.
func (h *Handler) responsesAPI(a api.Responses) api.Responses {
	a.Remember = func(id string, d *router.Deployment, native bool) {
		if d == nil || len(id) > 256 {
			return
		}
		o := responseOwner{name: d.Name}
		if native {
			o.identity = h.meta[d].identity
		}
		responseOwners().Add(id, o)
		if h.store != nil {
			h.store.RememberOwner(id, o.identity, o.name, ResponseOwnersTTL)
		}
	}
	return a
}

// owner finds which deployment made the response id: this instance's
// memory, else the fleet's (fleet mode). identity is the deployment's
// identity ("" for a translated response) or, from the fleet, its
// DeploymentID; fromFleet says which.
func (h *Handler) owner(id string) (o responseOwner, fromFleet, ok bool) {
	if o, ok := responseOwners().Get(id); ok {
		return o, false, true
	}
	if h.store == nil {
		return responseOwner{}, false, false
	}
	did, name, ok := h.store.Owner(id)
	return responseOwner{identity: did, name: name}, true, ok
}

// pin finds the deployment of group (or its fallback groups) that holds
// the state a Responses request continues (previous_response_id), and
// pins the request to it. A response the router does not know (made
// before a restart, or elsewhere) pins nothing: the provider says whether
// it knows it. A response no deployment of the group can continue is a
// 400 that says why.
func (h *Handler) pin(req *router.Request, group *router.Group, model string) *api.Error {
	prev, _ := jsonbody.GetString(req.Body, "previous_response_id")
	if prev == "" {
		return nil
	}
	o, fromFleet, ok := h.owner(prev)
	if !ok {
		return nil
	}
	if o.identity == "" {
		return api.Errorf(http.StatusBadRequest, api.InvalidValue, "previous_response_id",
			"the response %s was made by deployment %s through Chat Completions, and no provider keeps its state: send the whole conversation as input instead of previous_response_id",
			strconv.Quote(prev), o.name)
	}
	for g := range group.Chain() {
		for _, d := range g.Deployments {
			identity := h.meta[d].identity
			if fromFleet {
				identity = fleet.DeploymentID(identity)
			}
			if identity == o.identity {
				req.Pinned = d
				return nil
			}
		}
	}
	return api.Errorf(http.StatusBadRequest, api.InvalidValue, "previous_response_id",
		"the response %s was made by deployment %s, which model group %s no longer has; its state stays with that provider account: send the whole conversation as input instead",
		strconv.Quote(prev), o.name, strconv.Quote(model))
}
