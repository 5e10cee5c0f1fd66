package llmrouter

import (
	"crypto/sha256"
	"encoding/hex"
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
// router translated from Chat Completions (no provider keeps its state),
// and the tag of the consumer it was made for (consumerTag).
type responseOwner struct {
	identity, name, consumer string
}

// responseOwners outlives config reloads, as capacity states do: a
// conversation continues across a reload.
var responseOwners = sync.OnceValue(func() *expirable.LRU[string, responseOwner] {
	return expirable.NewLRU[string, responseOwner](ResponseOwnersMax, nil, ResponseOwnersTTL)
})

// responsesAPI returns the Responses API of this handler for consumer
// who: it remembers which deployment made each response, and for whom,
// and sets *made to its id.
func (h *Handler) responsesAPI(a api.Responses, made *string, who string) api.Responses {
	a.Remember = func(id string, d *router.Deployment, native bool) {
		if d == nil || len(id) > 256 {
			return
		}
		*made = id
		o := responseOwner{name: d.Name, consumer: h.consumerTag(who)}
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
		h.store.RememberOwner(key, o.identity, o.name, o.consumer, ResponseOwnersTTL)
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
	did, name, tag, ok := h.store.Owner(id)
	return responseOwner{identity: did, name: name, consumer: tag}, true, ok
}

// ownerFor is owner for consumer who: with consumers configured, a
// response (or conversation) made for another consumer, or before
// consumers were configured, is not found, as one nobody made; foreign
// says it was found but is another's.
func (h *Handler) ownerFor(id, who string) (o responseOwner, fromFleet, ok, foreign bool) {
	o, fromFleet, ok = h.owner(id)
	if ok && h.Consumers.active() && o.consumer != h.consumerTag(who) {
		return responseOwner{}, false, false, true
	}
	return o, fromFleet, ok, false
}

// consumerTag is what the owners keep of consumer who: "" when no
// consumers are configured, else a hash of its name (so that the fleet's
// store holds no consumer's name), never empty.
func (h *Handler) consumerTag(who string) string {
	if !h.Consumers.active() {
		return ""
	}
	sum := sha256.Sum256([]byte("llm_router consumer\x00" + who))
	return hex.EncodeToString(sum[:12])
}

// pin finds the deployment of group (or its fallback groups) that holds
// the state a Responses request of consumer who continues
// (previous_response_id, conversation), and pins the request to it. A
// response the router does not know (made before a restart, or
// elsewhere) pins nothing: the provider says whether it knows it. A
// response no deployment of the group can continue is a 400 that says
// why. With consumers configured, a previous_response_id made for
// another consumer, or unknown, is OpenAI's own 400
// previous_response_not_found, and a conversation another consumer
// used is a 404 "not found" (what OpenAI answers for ids it does not
// have: nothing says it exists); an unknown conversation is passed on.
func (h *Handler) pin(who string, req *router.Request, group *router.Group, model string) *api.Error {
	c, ok := api.ContinuationOf(req)
	if !ok {
		return nil
	}
	key, what := c.ID, "the response "+strconv.Quote(c.ID)
	if c.Param == "conversation" {
		key, what = conversationKey(c.ID), "the conversation "+strconv.Quote(c.ID)
	}
	o, fromFleet, ok, foreign := h.ownerFor(key, who)
	switch {
	case foreign && c.Param == "conversation":
		return api.Errorf(http.StatusNotFound, api.ResponseNotFound, c.Param, "Conversation with id '%s' not found.", c.ID)
	case (foreign || !ok && h.Consumers.active()) && c.Param == "previous_response_id":
		return api.Errorf(http.StatusBadRequest, api.PreviousNotFound, c.Param, "Previous response with id '%s' not found.", c.ID)
	case !ok:
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
		h.rememberOwner(conversationKey(conv), responseOwner{identity: h.meta[res.Deployment].identity, name: res.Deployment.Name, consumer: h.consumerTag(req.Consumer)})
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
