// Package llmrouter is a Caddy HTTP handler, http.handlers.llm_router, that
// makes a fleet of LLM provider accounts look like one OpenAI-compatible
// endpoint: it ranks a model group's deployments by capacity, fails over on
// 429s and transient failures, and keeps one deadline per request.
//
// The routing core lives in router/, adapters/ and capacity/, which import
// neither Caddy nor this package; this package is the Caddy skin.
package llmrouter

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/fleet"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// states keeps each deployment's capacity state across config reloads,
// keyed by deployment identity (adapter, base URL, key fingerprint, upstream
// model): a reload that keeps a deployment keeps what was learned about it.
var states = caddy.NewUsagePool()

// Defaults of the handler's settings.
const (
	DefaultDeadline    = 60 * time.Second
	DefaultMaxAttempts = 4
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
	DefaultMaxBody     = 8 << 20
	DefaultTimeout     = 30 * time.Second
	DefaultTTFTTimeout = 15 * time.Second
	DefaultIdleTimeout = 30 * time.Second
	// longCooldown keeps a deployment with a bad key or spent quota out when
	// the provider states no reset.
	longCooldown = time.Hour
	// defaultIdlePerHost is the default transport's idle connection pool per
	// provider host.
	defaultIdlePerHost = 256
)

// Handler routes LLM API requests (OpenAI Chat Completions) over model
// groups of deployments, with capacity-aware failover.
//
// It answers `POST .../chat/completions` and `GET .../models`; every other
// request goes to the next handler.
//
// Placeholders it sets, for logs and later handlers:
//
// Placeholder | Description
// ------------|-------------
// `{http.llm_router.deployment}` | the deployment that answered, `provider/model`
// `{http.llm_router.attempts}` | upstream attempts made for the request
// `{http.llm_router.failover_reason}` | error class of the last failed attempt before the answer, empty if none
type Handler struct {
	// Deadline is the wall-clock budget of one request: every attempt and
	// every wait, until the answer (or a stream's first byte) reaches the
	// client. Default: 60s.
	Deadline caddy.Duration `json:"deadline,omitempty"`

	// MaxAttempts bounds upstream attempts per request. Default: 4.
	MaxAttempts int `json:"max_attempts,omitempty"`

	// BackoffBase is the floor of the wait before retrying a deployment that
	// failed: BackoffBase * 2^(n-1) for the n-th consecutive failure, capped
	// by BackoffMax, and never shorter than the provider's Retry-After.
	// Default: 500ms.
	BackoffBase caddy.Duration `json:"backoff_base,omitempty"`

	// BackoffMax caps the exponential backoff (a provider's stated reset can
	// be longer). Default: 30s.
	BackoffMax caddy.Duration `json:"backoff_max,omitempty"`

	// MaxBody is the largest request body accepted, in bytes; larger bodies
	// get 413. Default: 8 MB.
	MaxBody int64 `json:"max_body,omitempty"`

	// Weights of the ranking's features (see router.Weights for the score).
	// Default: cost 1, latency 1, reliability 1, quality 1, capacity 2.
	Weights *Weights `json:"weights,omitempty"`

	// Providers by name: upstream accounts.
	Providers map[string]*Provider `json:"providers,omitempty"`

	// Models maps each client-facing model group name to its deployments.
	Models map[string]*ModelGroup `json:"models,omitempty"`

	// Store says where capacity state lives: this process only (memory), or
	// shared by a fleet of instances through Redis (see StoreConfig, store.go).
	// Default: memory.
	Store *StoreConfig `json:"store,omitempty"`

	groups    map[string][]*router.Deployment
	names     []string // model group names, sorted
	router    *router.Router
	stateKeys []string
	ownedRTs  []*reverseproxy.HTTPTransport
	metrics   *metrics
	logger    *zap.Logger
	fleet     *fleet.Store // fleet mode (store.go); nil for store memory
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

// Provider is one upstream account.
type Provider struct {
	// Type names the adapter that speaks the provider's wire format:
	// "openai" (also for every OpenAI-compatible API: Groq, Mistral,
	// DeepSeek, Together, Fireworks, OpenRouter, Cerebras, vLLM, Ollama).
	Type string `json:"type"`

	// BaseURL is the API root, e.g. "https://api.openai.com/v1". Requests
	// go to BaseURL + "/chat/completions". Placeholders such as {env.X} are
	// replaced at load.
	BaseURL string `json:"base_url"`

	// APIKey is the provider's key, usually "{env.OPENAI_API_KEY}"
	// (replaced at load). It is only sent upstream; never logged, never
	// shown by the admin API.
	APIKey string `json:"api_key,omitempty"`

	// Timeout bounds one non-streaming attempt, until the response is
	// complete. Default: 30s.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// TTFTTimeout bounds a streaming attempt until its first event of
	// content (comments and pings do not count). Default: 15s.
	TTFTTimeout caddy.Duration `json:"ttft_timeout,omitempty"`

	// IdleTimeout is the longest silence inside a stream once it has begun.
	// Default: 30s.
	IdleTimeout caddy.Duration `json:"idle_timeout,omitempty"`

	// Headers are extra upstream request headers (placeholders replaced at load).
	Headers http.Header `json:"headers,omitempty"`

	// TransportRaw configures how to reach the provider, as
	// reverse_proxy's: the `http` transport module (TLS trust pools, client
	// certificates, HTTP versions, keepalive, dial timeouts). Default: that
	// module with its defaults, TLS on for an https base_url.
	TransportRaw json.RawMessage `json:"transport,omitempty" caddy:"namespace=http.reverse_proxy.transport inline_key=protocol"`

	transport http.RoundTripper
	endpoint  *adapters.Endpoint
	adapter   adapters.Adapter
}

// ModelGroup is a client-facing model name and the deployments serving it.
type ModelGroup struct {
	// Deployments are tried in rank order; at least one.
	Deployments []*Deployment `json:"deployments"`
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
	// Quality is the operator's judgment of the model, 0..1. Default: 0.
	Quality float64 `json:"quality,omitempty"`
	// ContextWindow is the model's context window, in tokens; after a
	// context_length failure only deployments with a larger one are tried.
	// Default: 0 (unknown).
	ContextWindow int64 `json:"context_window,omitempty"`
	// Weight shares traffic between deployments whose scores tie (within
	// 0.03): in proportion to it. Default: 1.
	Weight int `json:"weight,omitempty"`
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

// Provision sets defaults, loads each provider's adapter and transport, and
// attaches each deployment to its capacity state in the reload-surviving pool.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.Deadline == 0 {
		h.Deadline = caddy.Duration(DefaultDeadline)
	}
	if h.MaxAttempts == 0 {
		h.MaxAttempts = DefaultMaxAttempts
	}
	if h.BackoffBase == 0 {
		h.BackoffBase = caddy.Duration(DefaultBackoffBase)
	}
	if h.BackoffMax == 0 {
		h.BackoffMax = caddy.Duration(DefaultBackoffMax)
	}
	if h.MaxBody == 0 {
		h.MaxBody = DefaultMaxBody
	}
	if err := h.check(); err != nil {
		return err
	}

	repl := caddy.NewReplacer()
	for _, name := range sortedKeys(h.Providers) {
		if err := h.provisionProvider(ctx, repl, name, h.Providers[name]); err != nil {
			return fmt.Errorf("provider %s: %w", name, err)
		}
	}

	h.groups = make(map[string][]*router.Deployment, len(h.Models))
	for _, name := range sortedKeys(h.Models) {
		for _, dc := range h.Models[name].Deployments {
			d, err := h.newDeployment(dc)
			if err != nil {
				return fmt.Errorf("model %s: %w", name, err)
			}
			h.groups[name] = append(h.groups[name], d)
		}
		h.names = append(h.names, name)
	}

	h.router = router.New()
	h.router.Deadline = time.Duration(h.Deadline)
	h.router.MaxAttempts = h.MaxAttempts
	h.router.Policy = capacity.Policy{
		BackoffBase: time.Duration(h.BackoffBase),
		BackoffMax:  time.Duration(h.BackoffMax),
		Long:        longCooldown,
	}
	h.router.Logger = h.logger
	h.router.Weights = h.Weights.resolve()
	h.metrics = getMetrics()
	if err := h.metrics.register(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	h.router.Observer = h.metrics
	// Fleet mode: share the capacity states through the store (store.go).
	if err := h.provisionStore(ctx); err != nil {
		return err
	}
	addLive(h)
	return nil
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

func (h *Handler) provisionProvider(ctx caddy.Context, repl *caddy.Replacer, name string, p *Provider) error {
	a, err := adapters.Get(p.Type)
	if err != nil {
		return err
	}
	p.adapter = a
	base := strings.TrimSuffix(repl.ReplaceKnown(p.BaseURL, ""), "/")
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("base_url %q: must be an absolute http or https URL", p.BaseURL)
	}
	if u.Fragment != "" || (u.RawQuery != "" && p.Type != "azure") {
		return fmt.Errorf("base_url %q: must not have a query or fragment (the adapter appends the API path)", p.BaseURL)
	}
	ep := &adapters.Endpoint{BaseURL: base, APIKey: repl.ReplaceKnown(p.APIKey, ""), Header: http.Header{}}
	if p.APIKey != "" && ep.APIKey == "" {
		h.logger.Warn("api_key is empty once its placeholders are replaced; is the environment variable set?",
			zap.String("provider", name))
	}
	for k, vs := range p.Headers {
		for _, v := range vs {
			ep.Header.Add(k, repl.ReplaceKnown(v, ""))
		}
	}
	p.endpoint = ep

	if p.TransportRaw != nil {
		mod, err := ctx.LoadModule(p, "TransportRaw")
		if err != nil {
			return fmt.Errorf("loading transport: %v", err)
		}
		rt, ok := mod.(http.RoundTripper)
		if !ok {
			return fmt.Errorf("loading transport: %T is not an http.RoundTripper", mod)
		}
		if te, ok := rt.(reverseproxy.TLSTransport); ok && u.Scheme == "https" && !te.TLSEnabled() {
			return errors.New("base_url is https but the transport has no tls: add `tls` to it")
		}
		p.transport = rt
		return nil
	}
	// Caddy's default keeps 32 idle connections per host; an LLM provider
	// is one host that carries all of a busy router's requests, so reusing
	// more saves a handshake (TLS to real providers) per request under load.
	t := &reverseproxy.HTTPTransport{KeepAlive: &reverseproxy.KeepAlive{MaxIdleConnsPerHost: defaultIdlePerHost}}
	if u.Scheme == "https" {
		t.TLS = new(reverseproxy.TLSConfig)
	}
	if err := t.Provision(ctx); err != nil {
		return fmt.Errorf("loading transport: %v", err)
	}
	h.ownedRTs = append(h.ownedRTs, t)
	p.transport = t
	return nil
}

func (h *Handler) newDeployment(dc *Deployment) (*router.Deployment, error) {
	p := h.Providers[dc.Provider]
	key := identity(p.Type, p.endpoint, dc.Model)
	st, _, err := states.LoadOrNew(key, func() (caddy.Destructor, error) {
		return capacity.NewState(), nil
	})
	if err != nil {
		return nil, err
	}
	h.stateKeys = append(h.stateKeys, key)
	st.(*capacity.State).Declare(dc.RPM, dc.TPM)
	weight := dc.Weight
	if weight == 0 {
		weight = 1
	}
	return &router.Deployment{
		Name:          dc.Provider + "/" + dc.Model,
		Model:         dc.Model,
		Adapter:       p.adapter,
		Endpoint:      p.endpoint,
		Transport:     p.transport,
		Timeout:       durationOr(p.Timeout, DefaultTimeout),
		TTFTTimeout:   durationOr(p.TTFTTimeout, DefaultTTFTTimeout),
		IdleTimeout:   durationOr(p.IdleTimeout, DefaultIdleTimeout),
		CostInput:     dc.CostInput,
		CostOutput:    dc.CostOutput,
		Quality:       dc.Quality,
		ContextWindow: dc.ContextWindow,
		Weight:        weight,
		State:         st.(*capacity.State),
	}, nil
}

// identity keys a deployment's state: the same account and model share
// what was learned, across model groups and reloads. The key appears only as
// a fingerprint.
func identity(typ string, ep *adapters.Endpoint, model string) string {
	sum := sha256.Sum256([]byte(ep.APIKey))
	return strings.Join([]string{typ, ep.BaseURL, hex.EncodeToString(sum[:6]), model}, "|")
}

// check rejects configurations that cannot work, at load rather than at
// request time. The Caddyfile parser reports the same errors with line numbers.
func (h *Handler) check() error {
	if len(h.Models) == 0 {
		return errors.New("no model group: add a `model` block")
	}
	for name, p := range h.Providers {
		if p == nil {
			return fmt.Errorf("provider %s: empty", name)
		}
		if p.Type == "" {
			return fmt.Errorf("provider %s: missing type", name)
		}
		if p.BaseURL == "" {
			return fmt.Errorf("provider %s: missing base_url", name)
		}
		for field, d := range map[string]caddy.Duration{"timeout": p.Timeout, "ttft_timeout": p.TTFTTimeout, "idle_timeout": p.IdleTimeout} {
			if d < 0 {
				return fmt.Errorf("provider %s: %s must not be negative", name, field)
			}
		}
	}
	for name, g := range h.Models {
		if g == nil || len(g.Deployments) == 0 {
			return fmt.Errorf("model %s: no deployment", name)
		}
		seen := map[[2]string]bool{}
		for _, d := range g.Deployments {
			if d == nil {
				return fmt.Errorf("model %s: empty deployment", name)
			}
			if seen[[2]string{d.Provider, d.Model}] {
				return fmt.Errorf("model %s: deployment %s %s listed twice", name, d.Provider, d.Model)
			}
			seen[[2]string{d.Provider, d.Model}] = true
			if _, ok := h.Providers[d.Provider]; !ok {
				return fmt.Errorf("model %s: deployment names unknown provider %q", name, d.Provider)
			}
			if d.Model == "" {
				return fmt.Errorf("model %s: deployment on %s has no upstream model", name, d.Provider)
			}
			if !(d.Quality >= 0 && d.Quality <= 1) {
				return fmt.Errorf("model %s: quality must be within 0..1", name)
			}
			if !finite(d.CostInput) || !finite(d.CostOutput) || d.CostInput < 0 || d.CostOutput < 0 ||
				d.ContextWindow < 0 || d.Weight < 0 || d.RPM < 0 || d.TPM < 0 {
				return fmt.Errorf("model %s: cost, context_window, weight, rpm and tpm must not be negative", name)
			}
		}
	}
	return nil
}

// Validate rejects negative settings.
func (h *Handler) Validate() error {
	for field, d := range map[string]caddy.Duration{"deadline": h.Deadline, "backoff_base": h.BackoffBase, "backoff_max": h.BackoffMax} {
		if d < 0 {
			return fmt.Errorf("%s must not be negative", field)
		}
	}
	if h.MaxAttempts < 0 {
		return errors.New("max_attempts must not be negative")
	}
	if h.MaxBody < 0 {
		return errors.New("max_body must not be negative")
	}
	if w := h.Weights; w != nil {
		for _, v := range []*float64{w.Cost, w.Latency, w.Reliability, w.Quality, w.Capacity} {
			if v != nil && (*v < 0 || !finite(*v)) {
				return errors.New("weights must be finite and not negative")
			}
		}
	}
	return nil
}

// Cleanup releases what Provision acquired: the capacity states (kept in the
// pool while another config uses them) and the transports it made.
func (h *Handler) Cleanup() error {
	removeLive(h)
	h.cleanupStore() // fleet mode (store.go)
	for _, key := range h.stateKeys {
		_, _ = states.Delete(key)
	}
	h.stateKeys = nil
	for _, t := range h.ownedRTs {
		_ = t.Cleanup()
	}
	h.ownedRTs = nil
	return nil
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
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
