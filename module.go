// Package llmrouter is a Caddy HTTP handler, http.handlers.llm_router, that
// makes a fleet of LLM provider accounts look like one endpoint for OpenAI
// and Anthropic clients: it ranks a model group's deployments by capacity,
// fails over on 429s and transient failures, and keeps one deadline per
// request.
//
// This package is the Caddy skin: the handler's configuration (module.go,
// caddyfile.go, validate and positions: fielderror.go), the HTTP entry
// point (handler.go: ForPath -> Parse -> Serve -> Write), provider types as
// Caddy modules in the llm_router.providers namespace (providers.go,
// clouds.go), consumers (consumers.go), the admin endpoint, metrics, the
// status page's handler and the fleet store's pool; and what it keeps in
// memory between requests (the Responses API's owners and background
// responses, affinity), pass_through and the WebSocket mode's socket. It
// reads no client format: the client APIs (internal/api) do, as the
// router (internal/router), the capacity state (internal/capacity), the
// provider types' wire formats (internal/adapters, and the public contract
// in package provider), cloud credentials (internal/clouds), budgets
// (internal/budget) and the status page's assets (internal/statuspage)
// import no Caddy. ARCHITECTURE.md shows the layers and lists the files.
package llmrouter

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/estimate"
	"github.com/llmrouter/caddy-llm-router/internal/redact"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// states keeps each deployment's capacity state across config reloads,
// keyed by deployment identity (provider type, base URL, key fingerprint,
// upstream model): a reload that keeps a deployment keeps what was learned
// about it.
var states = caddy.NewUsagePool()

// DefaultMaxBody is the largest request body accepted when max_body is not
// set, in bytes. The other defaults are router's (router.DefaultDeadline,
// ...) and capacity's (capacity.DefaultPolicy).
const DefaultMaxBody = 8 << 20

// Handler routes LLM API requests over model groups of deployments, with
// capacity-aware failover. It answers the client APIs' paths (POST
// .../chat/completions, .../responses, .../messages, .../embeddings,
// .../completions) and its own (the model groups, token counting, a
// background response's operations), listed once in api.Endpoints and in
// docs/endpoints.md, and any other path under its matcher with a 404 that
// lists them (or passes it on to the pass_through provider, when one is
// named). It writes its own
// error answers (bad requests, every deployment rate-limited or failing,
// the deadline) in the client's API format, as the SDKs expect them, rather
// than returning them to Caddy: handle_errors does not see them.
//
// Placeholders it sets, for logs and later handlers:
//
// Placeholder | Description
// ------------|-------------
// `{http.llm_router.deployment}` | the deployment that answered, `provider/model`
// `{http.llm_router.attempts}` | upstream attempts made for the request
// `{http.llm_router.failover_reason}` | error class of the last failed attempt, empty if none
// `{http.llm_router.model_group}` | the model group that answered: the one asked for, or its fallback group
// `{http.llm_router.input_tokens}`, `output_tokens`, `cached_input_tokens`, `cache_write_tokens`, `cache_write_1h_tokens`, `reasoning_tokens` | what the answer used, as its provider counted it, set once the answer was written (for the access log)
// `{http.llm_router.cost_usd}` | what it cost, USD at the deployment's prices, a string, set once the answer was written
// `{http.llm_router.consumer}` | the consumer who asked (Consumers), empty when anonymous
type Handler struct {
	// Deadline is the wall-clock budget of one request: every attempt and
	// every wait, until the answer (or a stream's first byte) reaches the
	// client. Default: 60s.
	Deadline caddy.Duration `json:"deadline,omitempty"`

	// MaxAttempts bounds upstream attempts per request. Default: 4.
	MaxAttempts int `json:"max_attempts,omitempty"`

	// Resume says which deployments may take up a streamed answer whose
	// provider failed after the client began to read it (cut, silent past
	// idle_timeout, a malformed or error event), so that the client reads
	// one whole answer: "same_model", a deployment of the group serving the
	// same model (one Claude model on Anthropic, Bedrock and Vertex, its
	// names compared without the clouds' prefixes, suffixes and dates);
	// "any", any deployment of the group; "off", none (the stream ends
	// with an in-band error). A deployment continues the text the client
	// has where its provider can (Anthropic's prefill; an openai type's
	// `continuation`); else the request may be asked again from its start
	// of any deployment of the group, and the answer goes on only if its
	// text begins with exactly what the client has. Each resume has
	// `deadline` from the break and the request's attempts left. Text only:
	// a stream that relayed a tool call, reasoning or several choices ends
	// with the in-band error. Default: same_model.
	Resume string `json:"resume,omitempty"`

	// HedgeAfter starts a second attempt when the first has produced no
	// content (a stream's first content, a whole answer) after this long:
	// on the next best deployment that has capacity now, without waiting
	// for any. The first to produce content answers; the other is
	// cancelled and its claim released. At most one hedge per request;
	// both attempts count against the windows and budgets. Default: 0
	// (off). Unit: duration.
	HedgeAfter caddy.Duration `json:"hedge_after,omitempty"`

	// Priority is each request's priority among those waiting for
	// capacity, a whole number from 0 (lowest) to 9 (highest): a number,
	// or a placeholder resolved per request such as
	// {http.request.header.X-Priority}. A placeholder that resolves to
	// nothing gives the default; any other value that is not a whole
	// number from 0 to 9 is refused with a 400 in the client's format.
	// Default: 5.
	Priority string `json:"priority,omitempty"`

	// Affinity keeps a conversation on the deployment that served it last
	// while that deployment has capacity (the provider's prompt cache stays
	// warm), moving it only when capacity says so: a placeholder resolved
	// per request, such as {http.request.header.X-Session-Id}, or "body"
	// for the body's prompt_cache_key, else user (Chat Completions,
	// Responses), else metadata.user_id (Messages). An empty value: no
	// affinity for that request. "none": no affinity at all. Remembered
	// per model group for an hour of quiet, 100,000 keys at most.
	// Default (unset): prompt-cache affinity, within router.CacheMargin
	// of the best score: a request that carries a cache marker
	// (cache_control, prompt_cache_key) or shares its first 1,024 bytes of
	// prompt (router.PrefixHeadBytes) goes to the deployment that last
	// served that prefix while it is usable, so that the provider's cache
	// is written once (affinity.go, cacheKeys).
	Affinity string `json:"affinity,omitempty"`

	// PassThrough names a provider that takes, as they came, the requests
	// under the router's matcher that it does not serve itself (audio,
	// images, files, batches, ...): the path under the provider's API root,
	// its key in place of the client's credentials, streamed answers
	// flushed as they come; no failover, no capacity accounting. Default:
	// none (such requests get a 404 that lists what the router serves).
	PassThrough string `json:"pass_through,omitempty"`

	// Reserve keeps a share of every known rate-limit window (stated by
	// the provider or declared) for requests of a minimum priority: lower
	// priorities wait for the next window, or get a 429 at once when it
	// comes after their deadline. Default: none.
	Reserve *ReserveConfig `json:"reserve,omitempty"`

	// BackoffBase is the floor of the wait before retrying a deployment that
	// failed: BackoffBase * 2^(n-1) for the n-th consecutive failure, capped
	// by BackoffMax, and never shorter than the provider's Retry-After.
	// Default: 500ms.
	BackoffBase caddy.Duration `json:"backoff_base,omitempty"`

	// BackoffMax caps the exponential backoff (a provider's stated reset can
	// be longer). Default: 30s.
	BackoffMax caddy.Duration `json:"backoff_max,omitempty"`

	// MaxBody is the largest request body accepted, in bytes; larger bodies
	// get 413. Default: 8 MiB (DefaultMaxBody).
	MaxBody int64 `json:"max_body,omitempty"`

	// MaxStreamBytes bounds what the router relays of one streamed answer,
	// in bytes of its events' data (over every attempt of a resumed
	// stream): past it the client's stream ends with an in-band error in
	// its format that says so (never a terminator), the upstream is
	// closed, and what was relayed is counted (as the provider stated it,
	// else estimated: the prompt, and 4 bytes a token of the text). A
	// non-streamed answer is bounded at 32 MiB, read whole before it is
	// passed on. Default: 64 MiB (router.DefaultMaxStreamBytes).
	MaxStreamBytes int64 `json:"max_stream_bytes,omitempty"`

	// Weights of the ranking's features (see router.Weights for the score).
	// Default: cost 1, latency 1, reliability 1, quality 1, capacity 2.
	Weights *Weights `json:"weights,omitempty"`

	// ProvidersRaw holds the providers (upstream accounts) by name, each a
	// provider type module: its "type" names the module in the
	// llm_router.providers namespace (openai, anthropic, gemini, azure, or
	// one built in with xcaddy), the rest is its configuration
	// (ProviderConfig and the type's own fields).
	ProvidersRaw map[string]json.RawMessage `json:"providers,omitempty" caddy:"namespace=llm_router.providers inline_key=type"`

	// Models maps each client-facing model group name to its deployments.
	Models map[string]*ModelGroup `json:"models,omitempty"`

	// Store says where capacity state lives: this process only (memory), or
	// shared by a fleet of instances through Redis (see StoreConfig, store.go).
	// Default: memory.
	Store *StoreConfig `json:"store,omitempty"`

	// Consumers say who is asking and what their plans allow them
	// (consumers.go): consumer, keys, plans, consumers.
	Consumers

	providers map[string]ProviderModule
	passProxy *httputil.ReverseProxy // PassThrough's
	types     map[string]string      // provider name -> type
	groups    map[string]*router.Group
	names     []string // model group names, sorted
	models    []string // the names GET /v1/models lists: groups and aliases, sorted
	lookup    names    // the group of the name a client sent
	meta      map[*router.Deployment]deploymentMeta
	router    *router.Router
	states    []stateRef // the capacity states taken from the pool
	metrics   *metrics
	logger    *zap.Logger
	store     *fleetStore     // fleet mode (store.go); nil for store memory
	jobs      *backgroundJobs // background responses the router polls (background.go)
	// spendingKeys are the budgets' spendings taken from the pool.
	spendingKeys []string
}

// ReserveConfig is the reserve: Percent of each window kept for
// requests of priority MinPriority or more.
type ReserveConfig struct {
	// Percent of each window kept, more than 0 and less than 100.
	Percent float64 `json:"percent"`
	// MinPriority is the lowest priority that may spend the reserve,
	// 1 to 9.
	MinPriority int `json:"min_priority"`
}

// deploymentMeta is what the admin endpoint shows of a deployment beside
// its state.
type deploymentMeta struct {
	typ, baseURL, identity string
	// org is the provider organization of its account (see
	// ProviderConfig.organization).
	org string
}

// Weights are the ranking's feature weights, each >= 0; nil fields take
// their default. A weight of 0 ignores that feature.
type Weights struct {
	// Cost weighs the request's estimated USD price. Default: 1.
	Cost *float64 `json:"cost,omitempty"`
	// Latency weighs observed latency. Default: 1.
	Latency *float64 `json:"latency,omitempty"`
	// Reliability weighs the recent success rate. Default: 1.
	Reliability *float64 `json:"reliability,omitempty"`
	// Quality weighs the configured quality. Default: 1.
	Quality *float64 `json:"quality,omitempty"`
	// Capacity weighs remaining rate-limit headroom. Default: 2.
	Capacity *float64 `json:"capacity,omitempty"`
}

// ModelGroup is a client-facing model name and the deployments serving it.
type ModelGroup struct {
	// Deployments are ranked for every request; at least one.
	Deployments []*Deployment `json:"deployments"`
	// FallbackGroup names another model group that serves the request,
	// within the same deadline and attempt budget, when none of this
	// group's deployments can: all rate-limited or out of quota past the
	// deadline, cooling down after failures, too small for the prompt, or
	// unable to express the request. Its own fallback group follows in
	// turn; a chain that comes back to a group is refused. The
	// X-LLM-Router-Group response header names the group that answered.
	// Default: none.
	FallbackGroup string `json:"fallback_group,omitempty"`
	// Aliases are more exact names a client may send for this group
	// (dated model ids, another gateway's names). The group's own name may
	// be a pattern instead (claude-sonnet-*; see names.go): exact names and
	// aliases win over patterns. Default: none.
	Aliases []string `json:"aliases,omitempty"`
	// Budget is the group's spending limit (Budget): once spent, requests
	// for the group are answered 429 until it renews. Default: none.
	Budget *Budget `json:"budget,omitempty"`
	// MaxQueued bounds how many of the group's requests wait for capacity
	// in its queue on this instance (each holds its body and its
	// connection): a request that would wait while it is full is answered
	// 429 at once, in the client's format, saying that the queue is full,
	// with x-should-retry: false and a Retry-After until the group's first
	// deployment is back when one is cooling (none when capacity is free
	// and those before it are taking it). Default: 10 per second of the
	// deadline per deployment, at least 100 (router.DefaultMaxQueued: 600
	// per deployment for the default 60s), and past it every place the
	// deployments' known windows serve before its deadline (the forecast
	// bounds that queue); a value set here holds whatever the windows say.
	MaxQueued int `json:"max_queued,omitempty"`
}

// Deployment is a provider x an upstream model within a model group.
type Deployment struct {
	// Provider names a configured provider.
	Provider string `json:"provider"`
	// Model is the upstream model name sent to the provider.
	Model string `json:"model"`
	// CostInput is the price of input tokens, USD per 1M tokens. Default: 0 (unknown).
	CostInput float64 `json:"cost_input,omitempty"`
	// CostOutput is the price of output tokens, USD per 1M tokens. Default: 0 (unknown).
	CostOutput float64 `json:"cost_output,omitempty"`
	// CostCachedInput is the price of input tokens read from the
	// provider's prompt cache, USD per 1M tokens. Default: per provider
	// type and model (see prices.go): 0.1x CostInput for Claude
	// (anthropic, and Claude on bedrock and vertex) and Gemini models,
	// CostInput otherwise.
	CostCachedInput *float64 `json:"cost_cached_input,omitempty"`
	// CostCacheWrite and CostCacheWrite1h are the prices of input tokens
	// written to the provider's prompt cache, for its 5-minute and its
	// one-hour lifetime, USD per 1M tokens. Default: 1.25x and 2x
	// CostInput for Claude models, CostInput otherwise (see prices.go).
	CostCacheWrite   *float64 `json:"cost_cache_write,omitempty"`
	CostCacheWrite1h *float64 `json:"cost_cache_write_1h,omitempty"`
	// Budget is the deployment's spending limit (Budget): once spent, it is
	// skipped as a spent quota until it renews. Default: none.
	Budget *Budget `json:"budget,omitempty"`
	// Quality is the operator's judgment of the model, 0..1. Default: 0.
	Quality float64 `json:"quality,omitempty"`
	// ContextWindow is the model's context window, in tokens; after a
	// context_length failure only deployments with a larger one are tried.
	// Default: 0 (unknown).
	ContextWindow int64 `json:"context_window,omitempty"`
	// Weight is the deployment's share of the traffic among deployments
	// whose scores tie (within 0.03), in proportion. Default: 1.
	Weight int `json:"weight,omitempty"`
	// Tier orders the group's deployments: one of tier n+1 is tried only
	// when none of tier n or lower can serve the request before its
	// deadline (cooling past it, no budget left for it, context too small,
	// out). Within a tier the score decides. Default: 1.
	Tier int `json:"tier,omitempty"`
	// RPM is the operator's declared limit in requests per minute, enforced
	// locally over a sliding minute whatever the provider's headers say: the
	// only protection for providers that send none. Default: 0 (none).
	RPM int64 `json:"rpm,omitempty"`
	// TPM is the declared limit in tokens per minute (estimated: prompt
	// bytes / 4 plus max_tokens). Default: 0 (none).
	TPM int64 `json:"tpm,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_router",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision checks the configuration, loads each provider's type module,
// and attaches each deployment to its capacity state in the
// reload-surviving pool.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if err := h.validate(); err != nil {
		return err
	}
	if err := h.provisionProviders(ctx); err != nil {
		return err
	}
	if err := h.provisionPassThrough(); err != nil {
		return err
	}
	if err := h.provisionConsumers(); err != nil {
		return err
	}
	h.warnUnpricedBudgets()
	h.groups = make(map[string]*router.Group, len(h.Models))
	h.meta = map[*router.Deployment]deploymentMeta{}
	limits := map[*capacity.State]declaredLimits{}
	for _, name := range sortedKeys(h.Models) {
		g := router.NewGroup(name, nil)
		g.MaxQueued = h.Models[name].MaxQueued
		h.groups[name] = g
		for _, dc := range h.Models[name].Deployments {
			d, err := h.newDeployment(dc)
			if err != nil {
				return fmt.Errorf("model %s: %w", name, err)
			}
			g.Deployments = append(g.Deployments, d)
			limits[d.State] = limits[d.State].tightest(dc.RPM, dc.TPM)
		}
	}
	for name, g := range h.groups {
		if fb := h.Models[name].FallbackGroup; fb != "" {
			g.Fallback = h.groups[fb]
		}
	}
	h.lookup = newNames(h.groups, h.Models)
	h.names = sortedKeys(h.groups)
	h.models = h.lookup.list()
	// A deployment listed in several groups is one account and model: its
	// declared limits are the tightest any group states.
	for st, l := range limits {
		st.Declare(l.rpm, l.tpm)
	}

	h.router = router.New()
	h.jobs = &backgroundJobs{}
	h.router.Deadline = durationOr(h.Deadline, router.DefaultDeadline)
	h.router.MaxAttempts = h.MaxAttempts
	if h.MaxAttempts == 0 {
		h.router.MaxAttempts = router.DefaultMaxAttempts
	}
	if h.Resume != "" {
		h.router.Resume, _ = router.ParseResumeMode(h.Resume) // validated
	}
	h.router.HedgeAfter = time.Duration(h.HedgeAfter)
	if h.MaxStreamBytes > 0 {
		h.router.MaxStreamBytes = h.MaxStreamBytes
	}
	h.router.Policy.BackoffBase = durationOr(h.BackoffBase, capacity.DefaultPolicy.BackoffBase)
	h.router.Policy.BackoffMax = durationOr(h.BackoffMax, capacity.DefaultPolicy.BackoffMax)
	h.router.Logger = h.logger
	h.router.Weights = h.Weights.resolve()
	if rs := h.Reserve; rs != nil {
		h.router.Reserve = router.Reserve{Share: rs.Percent / 100, MinPriority: rs.MinPriority}
		if h.Priority == "" && rs.MinPriority > router.DefaultPriority {
			h.logger.Warn("reserve without priority: every request has the default priority, so the reserved share of each window is never spent",
				zap.Float64("percent", rs.Percent), zap.Int("min_priority", rs.MinPriority), zap.Int("default_priority", router.DefaultPriority))
		}
	}
	h.metrics = getMetrics()
	if err := h.metrics.register(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	h.router.Observer = h.metrics
	// Fleet mode: share the capacity states through the store (store.go).
	if err := h.provisionStore(ctx); err != nil {
		return err
	}
	if err := h.provisionBudgets(); err != nil {
		return err
	}
	addLive(h)
	return nil
}

// provisionProviders loads each provider's type module.
func (h *Handler) provisionProviders(ctx caddy.Context) error {
	h.types = make(map[string]string, len(h.ProvidersRaw))
	for _, name := range sortedKeys(h.ProvidersRaw) {
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(h.ProvidersRaw[name], &head); err != nil {
			return fmt.Errorf("provider %s: %v", name, err)
		}
		if head.Type == "" {
			return fmt.Errorf("provider %s: missing type", name)
		}
		if _, err := caddy.GetModule(ProviderNamespace + "." + head.Type); err != nil {
			return fmt.Errorf("provider %s: %w", name, unknownType(head.Type))
		}
		h.types[name] = head.Type
	}
	mods, err := ctx.LoadModule(h, "ProvidersRaw")
	if err != nil {
		return h.credentialLine(fmt.Errorf("loading providers: %v", err))
	}
	h.providers = make(map[string]ProviderModule, len(h.types))
	for name, mod := range mods.(map[string]any) {
		pm, ok := mod.(ProviderModule)
		if !ok {
			return fmt.Errorf("provider %s: %T is not a provider type (ProviderModule)", name, mod)
		}
		cfg := pm.ProviderSettings()
		if !cfg.provisioned {
			return fmt.Errorf("provider %s: type %s did not provision its ProviderConfig", name, h.types[name])
		}
		h.providers[name] = pm
	}
	return nil
}

// credentialLine puts after err, the error of loading the providers, the
// Caddyfile line of a credential whose placeholders resolve to nothing
// (ProviderConfig.emptyCredential), when this process adapted that
// Caddyfile (keyLines).
func (h *Handler) credentialLine(err error) error {
	repl := caddy.NewReplacer()
	for _, name := range sortedKeys(h.ProvidersRaw) {
		lines := keyLines.of(h.ProvidersRaw[name])
		var c ProviderConfig
		if lines == nil || json.Unmarshal(h.ProvidersRaw[name], &c) != nil {
			continue
		}
		if p, ok := lines.at(fieldPath(c.emptyCredential(repl))); ok {
			return fmt.Errorf("%w, at %s:%d", err, p.file, p.line)
		}
	}
	return err
}

// resolve fills the unset weights with their defaults.
func (w *Weights) resolve() router.Weights {
	out := router.DefaultWeights
	if w == nil {
		return out
	}
	for _, f := range []struct {
		v   *float64
		dst *float64
	}{{w.Cost, &out.Cost}, {w.Latency, &out.Latency}, {w.Reliability, &out.Reliability}, {w.Quality, &out.Quality}, {w.Capacity, &out.Capacity}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	return out
}

func (h *Handler) newDeployment(dc *Deployment) (*router.Deployment, error) {
	p := h.providers[dc.Provider]
	cfg := p.ProviderSettings()
	key := cfg.identity(h.types[dc.Provider], dc.Model)
	st, _, err := states.LoadOrNew(key, func() (caddy.Destructor, error) {
		return capacity.NewState(), nil
	})
	if err != nil {
		return nil, err
	}
	h.states = append(h.states, stateRef{key, st.(*capacity.State)})
	d := &router.Deployment{
		Name:          dc.Provider + "/" + dc.Model,
		ProviderType:  h.types[dc.Provider],
		Model:         dc.Model,
		Provider:      p,
		Transport:     cfg.transport,
		Timeout:       durationOr(cfg.Timeout, router.DefaultTimeout),
		TTFTTimeout:   durationOr(cfg.TTFTTimeout, router.DefaultTTFTTimeout),
		IdleTimeout:   durationOr(cfg.IdleTimeout, router.DefaultIdleTimeout),
		CostInput:     dc.CostInput,
		CostOutput:    dc.CostOutput,
		Quality:       dc.Quality,
		ContextWindow: dc.ContextWindow,
		ExactTokens:   estimate.O200k(dc.Model),
		Weight:        max(dc.Weight, 1),
		Tier:          max(dc.Tier, 1),
		State:         st.(*capacity.State),
		Secrets:       cfg.secrets(),
	}
	if _, ok := p.(provider.TokenCounter); ok {
		if d.CountState, err = h.countState(key); err != nil {
			return nil, err
		}
	}
	setPrices(d, p, dc)
	h.meta[d] = deploymentMeta{typ: h.types[dc.Provider], baseURL: redact.URL(cfg.endpoint.BaseURL), identity: key, org: cfg.organization()}
	return d, nil
}

// countState is the capacity state of the count_tokens requests of the
// deployment of identity key (router.Deployment.CountState): Anthropic's
// token counting has rate limits of its own. It is kept across reloads as
// the deployment's State is.
func (h *Handler) countState(key string) (*capacity.State, error) {
	key += "\x00count_tokens"
	st, _, err := states.LoadOrNew(key, func() (caddy.Destructor, error) {
		return capacity.NewState(), nil
	})
	if err != nil {
		return nil, err
	}
	h.states = append(h.states, stateRef{key, st.(*capacity.State)})
	return st.(*capacity.State), nil
}

// declaredLimits are a deployment's declared rpm and tpm (0 = none).
type declaredLimits struct{ rpm, tpm int64 }

// tightest adds a group's declared limits: the smaller non-zero one wins.
func (l declaredLimits) tightest(rpm, tpm int64) declaredLimits {
	pick := func(a, b int64) int64 {
		if a == 0 || (b != 0 && b < a) {
			return b
		}
		return a
	}
	return declaredLimits{pick(l.rpm, rpm), pick(l.tpm, tpm)}
}

// validate rejects configurations that cannot work, at load rather than at
// request time: Provision runs it first, before anything is acquired, and
// the Caddyfile parser runs it on what it parsed, each error at the line
// that set the value it names (fieldError). Each rule is written here
// once: negative or out-of-range settings, weights and deployment values,
// no model group, a group without deployments or with one twice, a
// deployment naming an unknown provider or no model, fallback groups and
// aliases that clash, an unknown pass_through provider, a store that
// cannot work.
func (h *Handler) validate() error {
	if err := h.validateSettings(); err != nil {
		return err
	}
	if err := h.validateConsumers(); err != nil {
		return err
	}
	if len(h.Models) == 0 {
		return errors.New("no model group: add a `model` block")
	}
	if _, ok := h.Models[""]; ok {
		return within(errors.New("a model group needs a name"), "", "models", "")
	}
	if _, ok := h.ProvidersRaw[""]; ok {
		return within(errors.New("a provider needs a name"), "", "providers", "")
	}
	if err := fallbackProblem(h.Models); err != nil {
		return err
	}
	if err := namesProblem(h.Models); err != nil {
		return err
	}
	if _, ok := h.ProvidersRaw[h.PassThrough]; h.PassThrough != "" && !ok {
		return fieldErr("pass_through", "pass_through names unknown provider %q (configured: %s)", h.PassThrough, strings.Join(sortedKeys(h.ProvidersRaw), ", "))
	}
	for _, name := range sortedKeys(h.Models) {
		if err := h.Models[name].validate(); err != nil {
			return within(err, "model "+name+": ", "models", name)
		}
		for i, d := range h.Models[name].Deployments {
			if _, ok := h.ProvidersRaw[d.Provider]; !ok {
				return within(fmt.Errorf("deployment names unknown provider %q (configured: %s)", d.Provider, strings.Join(sortedKeys(h.ProvidersRaw), ", ")),
					"model "+name+": ", "models", name, "deployments", strconv.Itoa(i), "provider")
			}
		}
	}
	return nil
}

// fallbackProblem checks the model groups' fallback groups: each names
// another configured group, and no chain comes back to a group it left.
// It returns the error of the first group (by name) whose fallback_group
// is wrong, at models.<name>.fallback_group.
func fallbackProblem(models map[string]*ModelGroup) error {
	for _, name := range sortedKeys(models) {
		g := models[name]
		if g == nil || g.FallbackGroup == "" {
			continue
		}
		wrong := func(format string, args ...any) error {
			return within(fmt.Errorf(format, args...), "model "+name+": ", "models", name, "fallback_group")
		}
		if _, ok := models[g.FallbackGroup]; !ok {
			return wrong("fallback_group names unknown model group %q (configured: %s)", g.FallbackGroup, strings.Join(sortedKeys(models), ", "))
		}
		chain := []string{name}
		for at := g.FallbackGroup; at != ""; at = models[at].FallbackGroup {
			chain = append(chain, at)
			if at == name {
				return wrong("fallback_group makes a loop: %s", strings.Join(chain, " -> "))
			}
			if models[at] == nil || len(chain) > len(models) {
				break // reported for its own group, or a loop that does not pass through name
			}
			if len(chain) > router.MaxFallbacks+1 {
				return wrong("fallback_group makes a chain of more than %d fallback groups", router.MaxFallbacks)
			}
		}
	}
	return nil
}

// maxSize bounds max_body and max_stream_bytes, in bytes (1 TiB).
const maxSize = 1 << 40

// validateSettings checks the handler's own settings: durations, attempts,
// body size and weights not negative, backoff_base not above backoff_max.
func (h *Handler) validateSettings() error {
	for _, d := range []struct {
		name string
		d    caddy.Duration
	}{{"deadline", h.Deadline}, {"backoff_base", h.BackoffBase}, {"backoff_max", h.BackoffMax}, {"hedge_after", h.HedgeAfter}} {
		if d.d < 0 {
			return fieldErr(d.name, "%s must not be negative, got %s", d.name, time.Duration(d.d))
		}
	}
	if h.BackoffBase > 0 && h.BackoffMax > 0 && h.BackoffBase > h.BackoffMax {
		return fieldErr("backoff_base", "backoff_base (%s) must not exceed backoff_max (%s)", time.Duration(h.BackoffBase), time.Duration(h.BackoffMax))
	}
	if h.MaxAttempts < 0 {
		return fieldErr("max_attempts", "max_attempts must be at least 1, got %d", h.MaxAttempts)
	}
	if a := h.Affinity; a != "" && a != AffinityNone && a != "body" && !strings.Contains(a, "{") {
		return fieldErr("affinity", "affinity: %q is not body, none or a placeholder such as {http.request.header.X-Session-Id} (a fixed word would be one key for every request, which sends them all to one deployment)", a)
	}
	if _, ok := router.ParseResumeMode(h.Resume); h.Resume != "" && !ok {
		return fieldErr("resume", "resume: %q is not one of same_model, any, off", h.Resume)
	}
	if h.Priority != "" {
		if err := checkPriority(h.Priority); err != nil {
			return within(err, "", "priority")
		}
	}
	if err := h.Reserve.validate(); err != nil {
		return within(err, "", "reserve")
	}
	for _, s := range []struct {
		name string
		n    int64
	}{{"max_body", h.MaxBody}, {"max_stream_bytes", h.MaxStreamBytes}} {
		if s.n < 0 || s.n > maxSize {
			return fieldErr(s.name, "%s must not be negative nor more than 1 TiB, got %d bytes", s.name, s.n)
		}
	}
	if err := h.Weights.validate(); err != nil {
		return within(err, "", "weights")
	}
	return within(h.Store.validate(), "", "store")
}

// validate checks the reserve's share and priority.
func (rs *ReserveConfig) validate() error {
	switch {
	case rs == nil:
		return nil
	case !(rs.Percent > 0 && rs.Percent < 100):
		return fmt.Errorf("reserve: the share must be more than 0%% and less than 100%%, got %v%%", rs.Percent)
	case rs.MinPriority < router.MinPriority+1 || rs.MinPriority > router.MaxPriority:
		return fmt.Errorf("reserve: the priority must be a whole number from %d to %d, got %d", router.MinPriority+1, router.MaxPriority, rs.MinPriority)
	}
	return nil
}

// validate checks each weight: finite, not negative.
func (w *Weights) validate() error {
	if w == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{{"cost", w.Cost}, {"latency", w.Latency}, {"reliability", w.Reliability}, {"quality", w.Quality}, {"capacity", w.Capacity}} {
		if f.v != nil && (*f.v < 0 || !finite(*f.v)) {
			return fieldErr(f.name, "weights: %s must be a finite number, not negative, got %v", f.name, *f.v)
		}
	}
	return nil
}

// validate checks a model group: deployments, none twice, each valid,
// its budget and max_queued.
func (g *ModelGroup) validate() error {
	if g == nil || len(g.Deployments) == 0 {
		return errors.New("has no deployment")
	}
	if err := g.Budget.validate(); err != nil {
		return within(err, "", "budget")
	}
	if g.MaxQueued < 0 || g.MaxQueued > math.MaxInt32 {
		return fieldErr("max_queued", "max_queued must be a whole number from 1 to %d, got %d", math.MaxInt32, g.MaxQueued)
	}
	for i, d := range g.Deployments {
		at := []string{"deployments", strconv.Itoa(i)}
		if d == nil {
			return within(errors.New("empty deployment"), "", at...)
		}
		if err := d.validate(); err != nil {
			return within(err, "", at...)
		}
		for _, other := range g.Deployments[:i] {
			if other.Provider == d.Provider && other.Model == d.Model {
				return within(fmt.Errorf("deployment %s %s listed twice", d.Provider, d.Model), "", at...)
			}
		}
	}
	return nil
}

// maxTier is the highest tier a deployment may have.
const maxTier = 100

// validate checks a deployment's values.
func (d *Deployment) validate() error {
	if d.Model == "" {
		return fieldErr("model", "deployment on %s has no upstream model", d.Provider)
	}
	if !(d.Quality >= 0 && d.Quality <= 1) {
		return fieldErr("quality", "quality must be within 0..1, got %v", d.Quality)
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"cost_input", d.CostInput}, {"cost_output", d.CostOutput}} {
		if !finite(p.v) || p.v < 0 || p.v > maxPrice {
			return fieldErr(p.name, "%s must be from 0 to %g USD per 1M tokens, got %v", p.name, float64(maxPrice), p.v)
		}
	}
	if d.CostCachedInput != nil && (!finite(*d.CostCachedInput) || *d.CostCachedInput < 0 || *d.CostCachedInput > maxPrice) {
		return fieldErr("cost_cached_input", "cost_cached_input must be from 0 to %g USD per 1M tokens, got %v", float64(maxPrice), *d.CostCachedInput)
	}
	if err := d.cachePricesError(); err != nil {
		return err
	}
	if err := d.Budget.validate(); err != nil {
		return within(err, "", "budget")
	}
	for _, n := range []struct {
		name string
		v    int64
	}{{"context_window", d.ContextWindow}, {"weight", int64(d.Weight)}, {"rpm", d.RPM}, {"tpm", d.TPM}} {
		if n.v < 0 {
			return fieldErr(n.name, "%s must not be negative, got %d", n.name, n.v)
		}
	}
	if d.Tier < 0 || d.Tier > maxTier {
		return fieldErr("tier", "tier must be from 1 to %d, got %d", maxTier, d.Tier)
	}
	return nil
}

// Cleanup releases what Provision acquired: the capacity states (kept in
// the pool while another config uses them) and the fleet store. The
// provider modules (and their transports) are cleaned up by Caddy.
func (h *Handler) Cleanup() error {
	removeLive(h)
	for _, ref := range h.states {
		// A state no config uses any more leaves the fleet store too.
		if deleted, _ := states.Delete(ref.key); deleted && h.store != nil {
			h.store.Unbind(ref.key, ref.st)
		}
	}
	h.states = nil
	h.cleanupBudgets()
	h.cleanupConsumers() // consumers.go
	if h.jobs != nil {
		h.jobs.stop()
	}
	h.cleanupStore() // fleet mode (store.go)
	return nil
}

// stateRef is a capacity state taken from the pool, by its key (the
// deployment's identity).
type stateRef struct {
	key string
	st  *capacity.State
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func durationOr(d caddy.Duration, def time.Duration) time.Duration {
	if d > 0 {
		return time.Duration(d)
	}
	return def
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// maxPrice bounds a price, USD per 1M tokens: a typo of many zeros must not
// make an answer's cost infinite.
const maxPrice = 1e6
