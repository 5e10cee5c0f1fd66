package llmrouter

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/expirable"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
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
// which deployment made each response, and sets *made to its id.
func (h *Handler) responsesAPI(a api.Responses, made *string) api.Responses {
	a.Remember = func(id string, d *router.Deployment, native bool) {
		if d == nil || len(id) > 256 {
			return
		}
		*made = id
		o := responseOwner{name: d.Name}
		if native {
			o.identity = h.meta[d].identity
		}
		h.rememberOwner(id, o)
	}
	a.Output = h.noteMinted
	return a
}

// rememberOwner remembers o as the owner of key (a response id, or a
// conversationKey), here and, in fleet mode, in the fleet's store.
func (h *Handler) rememberOwner(key string, o responseOwner) {
	responseOwners().Add(key, o)
	if h.store != nil {
		h.store.RememberOwner(key, o.identity, o.name, ResponseOwnersTTL)
	}
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
	c, ok := api.ContinuationOf(req)
	if !ok {
		return nil
	}
	key, what := c.ID, "the response "+strconv.Quote(c.ID)
	if c.Param == "conversation" {
		key, what = conversationKey(c.ID), "the conversation "+strconv.Quote(c.ID)
	}
	o, fromFleet, ok := h.owner(key)
	if !ok {
		return nil
	}
	if o.identity == "" {
		return api.Errorf(http.StatusBadRequest, api.InvalidValue, c.Param,
			"%s was made by deployment %s through Chat Completions, and no provider keeps its state: send the whole conversation as input instead of %s",
			what, o.name, c.Param)
	}
	if d := h.deploymentOf(group, o.identity, fromFleet); d != nil {
		req.Pinned = d
		return nil
	}
	return api.Errorf(http.StatusBadRequest, api.InvalidValue, c.Param,
		"%s was made by deployment %s, which model group %s no longer has; its state stays with that provider account: send the whole conversation as input instead",
		what, o.name, strconv.Quote(model))
}

// conversationKey is how a conversation is remembered among response ids.
func conversationKey(id string) string { return "conversation\x00" + id }

// rememberConversation notes which deployment served a request that added
// to a conversation (the Conversations API's, which lives at one provider
// account): its next requests go there.
func (h *Handler) rememberConversation(req *router.Request, res *router.Result) {
	if req.Format != provider.Responses || !answered(res) || res.Format != provider.Responses {
		return
	}
	if conv := api.ConversationID(req); conv != "" && len(conv) <= 256 {
		h.rememberOwner(conversationKey(conv), responseOwner{identity: h.meta[res.Deployment].identity, name: res.Deployment.Name})
	}
}

// logDropped logs at debug level what a Messages request lost on its way
// to a deployment that is not Anthropic's (api.DroppedInChat).
func (h *Handler) logDropped(req *router.Request, res *router.Result) {
	ce := h.logger.Check(zap.DebugLevel, "translated to Chat Completions without what it cannot express")
	if ce == nil {
		return
	}
	if dropped := api.DroppedInChat(req, res); len(dropped) > 0 {
		ce.Write(zap.String("deployment", res.Deployment.Name), zap.Strings("dropped", dropped))
	}
}
