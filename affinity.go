package llmrouter

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/hashicorp/golang-lru/v2/expirable"

	"github.com/llmrouter/caddy-llm-router/internal/fleet"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// Affinity (Handler.Affinity): which deployment served each conversation,
// or each prompt-cache prefix, last, per model group.
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

// AffinityNone turns affinity off (Handler.Affinity).
const AffinityNone = "none"

// affinity is a request's keys into affinities: lookup, most specific
// first, is where the deployment that served it last is looked for;
// keep are the keys its answer is remembered under; margin is the score
// margin the preference holds within (router.Request.PreferMargin).
type affinity struct {
	lookup, keep []string
	margin       float64
}

// affinityKey returns the request's affinity keys for group: its
// conversation's key (Handler.Affinity "body" or a placeholder), its
// prompt-cache prefix's by default (cacheKeys), none for "none".
func (h *Handler) affinityKey(r *http.Request, req *router.Request, group string) affinity {
	var key string
	switch v := h.Affinity; {
	case v == AffinityNone, req.CountTokens: // a count keeps no conversation's place
		return affinity{}
	case v == "":
		return cacheKeys(req, group)
	case v == "body":
		key = req.Keys.Conversation
	default:
		key = v
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			key = repl.ReplaceAll(v, "")
		}
		key = strings.TrimSpace(key)
	}
	if key == "" {
		return affinity{}
	}
	k := []string{group + "\x00" + cutKey(key)}
	return affinity{lookup: k, keep: k}
}

// cutKey bounds a key's length (maxAffinityKey).
func cutKey(key string) string {
	if len(key) > maxAffinityKey {
		return key[:maxAffinityKey]
	}
	return key
}

// cacheKeys are the default affinity's keys, within router.CacheMargin: a
// request that carries a cache marker or shares a long prefix goes where
// that prefix was served last, so that the provider's cache is written
// once. Looked up: its prompt_cache_key (OpenAI routes its cache by it),
// the hashes of its prompt up to the parts a provider reads a cached
// prefix at, longest first (router.Request.CachePrefixes: a marker's
// prefix is remembered, and the next turn's longer prompt finds it), and
// of its first router.PrefixHeadBytes (router.Request.HeadKey). Kept: the
// key, the longest prefix and the head.
func cacheKeys(req *router.Request, group string) affinity {
	a := affinity{margin: router.CacheMargin}
	add := func(kind string, key string, keep bool) {
		k := group + "\x00" + kind + key
		a.lookup = append(a.lookup, k)
		if keep {
			a.keep = append(a.keep, k)
		}
	}
	if key := req.Keys.Cache; key != "" {
		add("key\x00", cutKey(key), true)
	}
	ends := req.CachePrefixes()
	for i := len(ends) - 1; i >= 0; i-- {
		add("prefix\x00", strconv.FormatUint(ends[i], 16), i == len(ends)-1)
	}
	if head := req.HeadKey(); head != 0 {
		add("head\x00", strconv.FormatUint(head, 16), true)
	}
	return a
}

// prefer sets the request's preferred deployment: the one of its group
// (or fallback groups) that served its first key found last.
func (h *Handler) prefer(req *router.Request, group *router.Group, a affinity) {
	if req.Pinned != nil {
		return
	}
	for _, key := range a.lookup {
		if identity, ok := affinities().Get(key); ok {
			if d := h.deploymentOf(group, identity, false); d != nil {
				req.Prefer, req.PreferMargin = d, a.margin
				return
			}
		}
	}
}

// remember notes the deployment that served the request under its keys.
func (h *Handler) remember(a affinity, res *router.Result) {
	if len(a.keep) == 0 || !answered(res) {
		return
	}
	for _, key := range a.keep {
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
