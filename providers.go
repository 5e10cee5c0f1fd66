package llmrouter

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"golang.org/x/net/http/httpguts"

	"github.com/llmrouter/caddy-llm-router/internal/adapters"
	"github.com/llmrouter/caddy-llm-router/internal/redact"
	"github.com/llmrouter/caddy-llm-router/provider"
)

func init() {
	caddy.RegisterModule(OpenAI{})
	caddy.RegisterModule(Azure{})
	caddy.RegisterModule(Anthropic{})
	caddy.RegisterModule(Gemini{})
}

// ProviderNamespace is the Caddy module namespace of provider types: the
// Caddyfile's `type anthropic` loads the module llm_router.providers.anthropic.
// A third party adds a provider type by registering a module there (built
// into Caddy with xcaddy) that implements ProviderModule.
const ProviderNamespace = "llm_router.providers"

// The default transport's idle connection pool per provider host, and its
// read and write buffers per connection (bytes; Caddy's default is 4096).
// A body goes past them, straight between the socket and the reader's or
// writer's own buffer; status and header lines longer than a buffer are
// read and written in pieces.
const (
	defaultIdlePerHost = 256
	defaultWriteBuffer = 512
	defaultReadBuffer  = 512
)

// ProviderModule is a provider type: a Caddy module in ProviderNamespace.
// Its JSON object is the provider's whole configuration, "type" naming the
// module; embedding ProviderConfig gives it the settings every provider
// shares and ProviderSettings. It answers the router through the
// Caddy-free provider.Provider. Caddy provisions it like any module
// (provision the embedded ProviderConfig first); a module that takes
// Caddyfile options of its own implements caddyfile.Unmarshaler and
// parses its block with ParseProviderBlock.
type ProviderModule interface {
	caddy.Module
	provider.Provider
	// ProviderSettings returns the shared settings, provisioned.
	ProviderSettings() *ProviderConfig
}

// ProviderConfig is the configuration every provider type shares: where
// the account is, its key, its timeouts and how to reach it. Provider
// types embed it.
type ProviderConfig struct {
	// BaseURL is the API root, e.g. "https://api.openai.com/v1"; the
	// provider type appends its paths. Placeholders such as {env.X} are
	// replaced at load. Required.
	BaseURL string `json:"base_url,omitempty"`

	// APIKey is the provider's key, usually "{env.OPENAI_API_KEY}"
	// (replaced at load). It is only sent upstream, in the header its type
	// uses; never logged, never shown by the admin API. Required, unless a
	// `header` carries the credentials or the type authenticates otherwise
	// (NoKey); "none" says the server takes no key (a local vLLM or
	// Ollama). A key whose placeholders resolve to nothing at load is an
	// error (an unset environment variable).
	APIKey string `json:"api_key,omitempty"`

	// Timeout bounds one non-streaming attempt, until the response is
	// complete. Default: none (router.DefaultTimeout): the request's
	// deadline alone, so that a long answer is let finish rather than cut
	// and retried elsewhere with less time left. Set it to fail over from a
	// provider that stalls sooner.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// TTFTTimeout bounds a streaming attempt until its first event of
	// content (comments and pings do not count). Default: 15s.
	TTFTTimeout caddy.Duration `json:"ttft_timeout,omitempty"`

	// IdleTimeout is the longest silence inside a stream once it has begun.
	// Default: 30s.
	IdleTimeout caddy.Duration `json:"idle_timeout,omitempty"`

	// Headers are extra upstream request headers (placeholders replaced at
	// load).
	Headers http.Header `json:"headers,omitempty"`

	// TransportRaw configures how to reach the provider, as reverse_proxy's:
	// the `http` transport module (TLS trust pools, client certificates,
	// HTTP versions, keepalive, dial timeouts). Default: that module with
	// its defaults, 256 idle connections per host, TLS on for an https
	// base_url.
	TransportRaw json.RawMessage `json:"transport,omitempty" caddy:"namespace=http.reverse_proxy.transport inline_key=protocol"`

	// Organization names the provider organization the account belongs
	// to, for state only that organization can read (a Responses
	// request's encrypted reasoning items: see docs/responses.md, "Reasoning
	// affinity"): providers with the same organization are one. Default:
	// the account's credentials tell (providers sharing an api_key, or
	// credential headers, and an OpenAI-Organization header, are one
	// organization; a server that takes no key is one of its own per
	// base_url). Set it when two keys are of one organization (OpenAI's
	// project keys). Up to 128 characters, no spaces or control characters.
	Organization string `json:"organization,omitempty"`

	// AllowQuery lets base_url carry a query (Azure's ?api-version=); set by
	// the provider type, not configured.
	AllowQuery bool `json:"-"`

	// NoKey says the type authenticates without api_key (a cloud's own
	// credentials); set by the provider type before its config is parsed
	// or provisioned, not configured.
	NoKey bool `json:"-"`

	// DerivedBaseURL says the type derives base_url from settings of its
	// own (a cloud's region) when it is not configured: base_url is then
	// optional, and the type sets BaseURL before provisioning. Set by the
	// provider type, not configured.
	DerivedBaseURL bool `json:"-"`

	// Account tells this account apart from others at the same base_url
	// and key (a cloud project, a credentials profile or role) in the
	// deployment's identity, which keys what the router learned of it; set
	// by the provider type before Provision returns, never a secret.
	Account string `json:"-"`

	endpoint    provider.Endpoint
	transport   http.RoundTripper
	owned       *reverseproxy.HTTPTransport
	provisioned bool
}

// ProviderSettings implements ProviderModule.
func (c *ProviderConfig) ProviderSettings() *ProviderConfig { return c }

// secrets are the values of this account that must never leave the router
// (see router.Deployment.Secrets): the key, the values of `header` lines
// that carry credentials (a name with auth, key, token or secret in it:
// Authorization, Api-Key, X-Goog-Api-Key, ...), whole and without their
// scheme ("Bearer ..."), and base_url's: its userinfo and the values of
// its query parameters so named (Azure's ?api-key=, a SAS's sig=).
func (c *ProviderConfig) secrets() []string {
	out := append([]string{c.endpoint.APIKey}, urlSecrets(c.endpoint.BaseURL)...)
	for name, vs := range c.endpoint.Header {
		if !isCredential(name) {
			continue
		}
		for _, v := range vs {
			out = append(out, v)
			if _, cred, ok := strings.Cut(v, " "); ok {
				out = append(out, strings.TrimSpace(cred))
			}
		}
	}
	return out
}

// urlSecrets are a URL's credentials: its password (its user when it has
// none: a token in its place), and the values of its query parameters
// named as credentials (see isCredential) or sig.
func urlSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	if p, ok := u.User.Password(); ok {
		out = append(out, p)
	} else if u.User != nil {
		out = append(out, u.User.Username()) // a token as the user ("https://<token>@host")
	}
	for name, vs := range u.Query() {
		if isCredential(name) || strings.EqualFold(name, "sig") {
			out = append(out, vs...)
		}
	}
	return out
}

// NoAPIKey is the api_key of a server that takes no key (in any case).
const NoAPIKey = "none"

// isCredential reports whether a header of that name carries credentials
// (auth, key, token or secret in its name: Authorization, Api-Key,
// X-Goog-Api-Key, ...).
func isCredential(name string) bool {
	n := strings.ToLower(name)
	return strings.Contains(n, "auth") || strings.Contains(n, "key") || strings.Contains(n, "token") || strings.Contains(n, "secret")
}

// credentialOf is a credential header's value without its scheme
// ("Bearer ..."), trimmed.
func credentialOf(v string) string {
	v = strings.TrimSpace(v)
	if scheme, cred, ok := strings.Cut(v, " "); ok && !strings.ContainsAny(scheme, "{}") {
		return strings.TrimSpace(cred)
	}
	switch strings.ToLower(v) {
	case "bearer", "basic", "token", "key":
		return "" // a scheme without its credential
	}
	return v
}

// credentialHeader reports whether a configured header carries credentials.
func (c *ProviderConfig) credentialHeader() bool {
	for name, vs := range c.Headers {
		if isCredential(name) && slices.ContainsFunc(vs, func(v string) bool { return credentialOf(v) != "" }) {
			return true
		}
	}
	return false
}

// emptyPlaceholder returns the first placeholder of a configured secret
// that resolves to nothing ("sk-{env.UNSET}" would send "sk-"), "" when
// none does.
func emptyPlaceholder(repl *caddy.Replacer, v string) string {
	if !strings.Contains(v, "{") {
		return ""
	}
	for _, p := range strings.Fields(placeholdersOf(v)) {
		if strings.HasPrefix(p, "{") && strings.TrimSpace(repl.ReplaceKnown(p, "")) == "" {
			return p
		}
	}
	return ""
}

// placeholdersOf names the placeholders of a configured secret, for an
// error that must not show the secret itself: "{env.OPENAI_API_KEY}", or
// "(a literal value)" when it has none.
func placeholdersOf(v string) string {
	var ps []string
	for rest := v; ; {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			break
		}
		ps = append(ps, rest[i:i+j+1])
		rest = rest[i+j+1:]
	}
	if len(ps) == 0 {
		return "(a literal value)"
	}
	return strings.Join(ps, " ")
}

// ProviderEndpoint is the provisioned account: base URL without its
// trailing slash, the key and headers with their placeholders replaced.
func (c *ProviderConfig) ProviderEndpoint() provider.Endpoint { return c.endpoint }

// Provision validates the settings, replaces their placeholders and loads
// the transport. Errors: see validate; "base_url ...: must be an absolute
// http or https URL" (or hold a query, unless AllowQuery), "loading
// transport: ...".
func (c *ProviderConfig) Provision(ctx caddy.Context) error {
	if err := c.validate(); err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	base := strings.TrimSuffix(repl.ReplaceKnown(c.BaseURL, ""), "/")
	u, err := checkBaseURL(base, c.BaseURL)
	if err != nil {
		return err
	}
	if err := c.checkQuery(u); err != nil {
		return err
	}
	c.endpoint = provider.Endpoint{BaseURL: base, Header: http.Header{}}
	if !strings.EqualFold(strings.TrimSpace(c.APIKey), NoAPIKey) {
		// Trimmed: a key read from a file often ends with a line break,
		// which no header may carry.
		c.endpoint.APIKey = strings.TrimSpace(repl.ReplaceKnown(c.APIKey, ""))
		if p := emptyPlaceholder(repl, c.APIKey); p != "" || c.APIKey != "" && strings.TrimSpace(c.endpoint.APIKey) == "" {
			return fmt.Errorf("api_key %s is empty once its placeholders are replaced: is the environment variable set? (`api_key none` for a server that takes no key)",
				cmp.Or(p, placeholdersOf(c.APIKey)))
		}
	}
	for k, vs := range c.Headers {
		for _, v := range vs {
			rv := strings.TrimSpace(repl.ReplaceKnown(v, ""))
			if p := emptyPlaceholder(repl, v); isCredential(k) && (p != "" || v != "" && credentialOf(rv) == "") {
				return fmt.Errorf("header %s %s is empty once its placeholders are replaced: is the environment variable set?", k, cmp.Or(p, placeholdersOf(v)))
			}
			c.endpoint.Header.Add(k, rv)
		}
	}
	if err := c.provisionTransport(ctx, u.Scheme == "https"); err != nil {
		return fmt.Errorf("loading transport: %v", err)
	}
	c.provisioned = true
	return nil
}

func (c *ProviderConfig) provisionTransport(ctx caddy.Context, https bool) error {
	if c.TransportRaw != nil {
		mod, err := ctx.LoadModule(c, "TransportRaw")
		if err != nil {
			return err
		}
		rt, ok := mod.(http.RoundTripper)
		if !ok {
			return fmt.Errorf("%T is not an http.RoundTripper", mod)
		}
		if te, ok := rt.(reverseproxy.TLSTransport); ok && https && !te.TLSEnabled() {
			return errors.New("base_url is https but the transport has no tls: add `tls` to it")
		}
		c.transport = rt
		return nil
	}
	// Caddy's default keeps 32 idle connections per host; an LLM provider
	// is one host that carries all of a busy router's requests, so reusing
	// more saves a handshake (TLS to real providers) per request under load.
	// Each open stream holds a connection; its buffers are most of the
	// stream's memory. Small ones cost nothing worth counting: a request's
	// body and a large answer's bytes go past a full buffer straight to and
	// from the socket, and stream events are a few hundred bytes.
	t := &reverseproxy.HTTPTransport{
		KeepAlive:       &reverseproxy.KeepAlive{MaxIdleConnsPerHost: defaultIdlePerHost},
		WriteBufferSize: defaultWriteBuffer,
		ReadBufferSize:  defaultReadBuffer,
	}
	if https {
		t.TLS = new(reverseproxy.TLSConfig)
	}
	if err := t.Provision(ctx); err != nil {
		return err
	}
	c.owned, c.transport = t, t
	return nil
}

// WrapTransport puts wrap around the transport Provision loaded, for a
// type that authenticates each request itself (signs it, adds a fresh
// token): wrap's RoundTripper sees the upstream request last, after the
// router set everything else on it. Call it after Provision.
func (c *ProviderConfig) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	c.transport = wrap(c.transport)
}

// validate checks what can be checked before provisioning, for the JSON
// and the Caddyfile paths alike: a base_url, timeouts not negative, header
// names and values HTTP allows (a header value's placeholders are replaced
// later, and checked by the transport).
func (c *ProviderConfig) validate() error {
	if c.BaseURL == "" && !c.DerivedBaseURL {
		return errors.New("needs a base_url")
	}
	if c.BaseURL != "" && !strings.Contains(c.BaseURL, "{") { // else checked once replaced, at Provision
		u, err := checkBaseURL(c.BaseURL, c.BaseURL)
		if err != nil {
			return err
		}
		if err := c.checkQuery(u); err != nil {
			return err
		}
	}
	for _, t := range []struct {
		name string
		d    caddy.Duration
	}{{"timeout", c.Timeout}, {"ttft_timeout", c.TTFTTimeout}, {"idle_timeout", c.IdleTimeout}} {
		if t.d < 0 {
			return fmt.Errorf("%s must not be negative", t.name)
		}
	}
	if err := checkOrganization(c.Organization); err != nil {
		return err
	}
	if c.APIKey == "" && !c.NoKey && !c.credentialHeader() {
		return errors.New("needs an api_key, usually {env.NAME}; write `api_key none` for a server that takes no key (a local vLLM or Ollama)")
	}
	for k, vs := range c.Headers {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("header %q: not a valid header name", k)
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Errorf("header %s: not a valid header value", k)
			}
		}
	}
	return nil
}

// checkQuery refuses a base_url u with a fragment, or a query unless the
// provider type takes one (AllowQuery: Azure's api-version).
func (c *ProviderConfig) checkQuery(u *url.URL) error {
	if u.Fragment != "" || (u.RawQuery != "" && !c.AllowQuery) {
		return fmt.Errorf("base_url %q: must not have a query or fragment (the provider type appends the API path)", shownURL(c.BaseURL))
	}
	return nil
}

// shownURL is a configured base_url as errors quote it: masked as the
// status page shows it (redact.URL: userinfo and query values may hold a
// key), or a placeholder when it is no URL at all (what it holds is not
// known to be safe to show).
func shownURL(s string) string {
	if r := redact.URL(s); r != "" {
		return r
	}
	return "(not a URL)"
}

// endpointSuffixes are the endpoints a provider type appends to base_url:
// one pasted into it would be sent twice.
var endpointSuffixes = []string{"/chat/completions", "/completions", "/messages", "/embeddings", "/responses",
	":generateContent", ":streamGenerateContent", ":embedContent"}

// checkBaseURL checks a base_url (its placeholders replaced): an absolute
// http or https URL with a host, the API root rather than an endpoint.
// Errors quote it as configured (shown), placeholders and all, with its
// userinfo and query values masked (shownURL).
func checkBaseURL(raw, shown string) (*url.URL, error) {
	shown = shownURL(shown)
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("base_url %q: must be an absolute http or https URL, such as https://api.openai.com/v1", shown)
	}
	for _, suffix := range endpointSuffixes {
		if p := strings.TrimSuffix(u.Path, "/"); strings.HasSuffix(p, suffix) {
			return nil, fmt.Errorf("base_url %q is an endpoint: give the API root (without %s); the provider type appends the endpoint", shown, suffix)
		}
	}
	return u, nil
}

// Cleanup releases the default transport Provision made (a configured one
// is a module of its own, cleaned up by Caddy).
func (c *ProviderConfig) Cleanup() error {
	if c.owned != nil {
		_ = c.owned.Cleanup()
		c.owned = nil
	}
	return nil
}

// identity keys a deployment's state: the same account and model share
// what was learned, across model groups and reloads. The key appears only
// as a fingerprint.
func (c *ProviderConfig) identity(typ, model string) string {
	sum := sha256.Sum256([]byte(c.endpoint.APIKey))
	parts := []string{typ, c.endpoint.BaseURL, hex.EncodeToString(sum[:6]), model}
	if c.Account != "" {
		parts = append(parts[:3], c.Account, model)
	}
	return strings.Join(parts, "|")
}

// ParseProviderBlock parses a provider's Caddyfile block, the tokens
//
//	provider <name> {
//	    type          <type>
//	    base_url      <url>
//	    api_key       <key>
//	    timeout       <duration>
//	    ttft_timeout  <duration>
//	    idle_timeout  <duration>
//	    header        <name> <value>
//	    organization  <name>
//	    transport     http { ... }
//	    ...
//	}
//
// into c, handing each other subdirective to own (which reports whether it
// knew it; nil knows none). `type` is read by the llm_router directive.
// Unknown and duplicate subdirectives are errors.
func ParseProviderBlock(d *caddyfile.Dispenser, c *ProviderConfig, own func(d *caddyfile.Dispenser) (bool, error)) error {
	d.Next() // provider
	d.Next() // its name
	name, file, line := d.Val(), d.File(), d.Line()
	seen := map[string]bool{}
	var transport http.RoundTripper
	var transportName string
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		if key != "header" {
			if seen[key] {
				return d.Errf("duplicate subdirective %s in provider", key)
			}
			seen[key] = true
		}
		switch key {
		case "type":
			d.RemainingArgs()
		case "base_url", "api_key", "organization":
			if !d.NextArg() {
				return d.ArgErr()
			}
			v := d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			switch key {
			case "base_url":
				c.BaseURL = v
			case "api_key":
				c.APIKey = v
			default:
				c.Organization = v
			}
		case "timeout":
			if err := parseDuration(d, &c.Timeout); err != nil {
				return err
			}
		case "ttft_timeout":
			if err := parseDuration(d, &c.TTFTTimeout); err != nil {
				return err
			}
		case "idle_timeout":
			if err := parseDuration(d, &c.IdleTimeout); err != nil {
				return err
			}
		case "header":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.ArgErr()
			}
			if c.Headers == nil {
				c.Headers = http.Header{}
			}
			c.Headers.Add(args[0], args[1])
		case "transport":
			if !d.NextArg() {
				return d.ArgErr()
			}
			transportName = d.Val()
			modID := "http.reverse_proxy.transport." + transportName
			unm, err := caddyfile.UnmarshalModule(d, modID)
			if err != nil {
				return err
			}
			rt, ok := unm.(http.RoundTripper)
			if !ok {
				return d.Errf("module %s (%T) is not a RoundTripper", modID, unm)
			}
			transport = rt
		default:
			known := false
			if own != nil {
				var err error
				if known, err = own(d); err != nil {
					return err
				}
			}
			if !known {
				return d.Errf("unknown subdirective %s in provider%s", key, providerKeyHint(key))
			}
		}
	}
	if err := c.validate(); err != nil {
		return fmt.Errorf("provider %s: %v, at %s:%d", name, err, file, line) // the block's line, not its closing brace
	}
	if transport != nil {
		// Like reverse_proxy: an https upstream turns TLS on in the transport.
		if te, ok := transport.(reverseproxy.TLSTransport); ok && !te.TLSEnabled() &&
			strings.HasPrefix(strings.ToLower(c.BaseURL), "https://") {
			if err := te.EnableTLS(new(reverseproxy.TLSConfig)); err != nil {
				return err
			}
		}
		c.TransportRaw = caddyconfig.JSONModuleObject(transport, "protocol", transportName, nil)
	}
	return nil
}

// providerTypes lists the registered provider types, sorted.
func providerTypes() []string {
	var names []string
	for _, m := range caddy.GetModules(ProviderNamespace) {
		names = append(names, m.ID.Name())
	}
	slices.Sort(names)
	return names
}

// unknownType is the error for a `type` no module answers to.
func unknownType(typ string) error {
	return fmt.Errorf("unknown provider type %q (known: %s)", typ, strings.Join(providerTypes(), ", "))
}

// The built-in provider types: the wire formats of package adapters with
// the shared settings.

// OpenAI is the provider type `openai`: OpenAI's API and every
// OpenAI-compatible one (Groq, Mistral, DeepSeek, Together, Fireworks,
// OpenRouter, Cerebras, vLLM, Ollama). Requests go to base_url +
// "/chat/completions", "/embeddings" and "/responses" with
// "Authorization: Bearer <key>"; the rate-limit dialects it reads are
// listed in docs/providers.md ("How each provider response is classified").
type OpenAI struct {
	ProviderConfig
	// Responses says whether the server serves OpenAI's Responses API
	// (base_url + "/responses"): "native" sends a Responses request there
	// as the client wrote it; "chat" sends its Chat Completions form to
	// /chat/completions (and a request that continues the provider's state,
	// previous_response_id, cannot be served). Default: native for OpenAI's
	// own API (host api.openai.com), chat for other servers (vLLM serves
	// it, Ollama and many others do not).
	Responses string `json:"responses,omitempty"`
	// Continuation says how the server continues an assistant's text it
	// did not write, which a broken stream's resume asks of it (the
	// router's `resume`): "none" (it answers a final assistant message
	// afresh: OpenAI), "prefill" (it continues a final assistant message
	// as it is: llama.cpp's server), "prefix" (with the message's
	// "prefix": true: Mistral, DeepSeek's beta endpoint) or
	// "continue_final_message" (vLLM). Default: prefix for base_url hosts
	// api.mistral.ai and api.deepseek.com with path /beta, none for others.
	Continuation    string `json:"continuation,omitempty"`
	adapters.OpenAI `json:"-"`
}

// UnmarshalCaddyfile reads the provider block: the shared subdirectives,
// `responses native|chat` and `continuation
// none|prefill|prefix|continue_final_message`.
func (p *OpenAI) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return ParseProviderBlock(d, &p.ProviderConfig, func(d *caddyfile.Dispenser) (bool, error) {
		key := d.Val()
		if key != "responses" && key != "continuation" {
			return false, nil
		}
		if !d.NextArg() {
			return true, d.ArgErr()
		}
		val := d.Val()
		if d.NextArg() {
			return true, d.ArgErr()
		}
		if key == "continuation" {
			p.Continuation = val
			if _, ok := provider.ParseContinuation(val); !ok {
				return true, d.Errf("continuation: %q is not one of none, prefill, prefix, continue_final_message", val)
			}
			return true, nil
		}
		p.Responses = val
		if p.Responses != "native" && p.Responses != "chat" {
			return true, d.Errf("responses: %q is neither native nor chat", p.Responses)
		}
		return true, nil
	})
}

// CaddyModule returns the Caddy module information.
func (OpenAI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: ProviderNamespace + ".openai", New: func() caddy.Module { return new(OpenAI) }}
}

// Provision implements caddy.Provisioner.
func (p *OpenAI) Provision(ctx caddy.Context) error {
	if err := p.ProviderConfig.Provision(ctx); err != nil {
		return err
	}
	p.OpenAI.Endpoint = p.ProviderEndpoint()
	switch p.Responses {
	case "native":
		p.OpenAI.Responses = true
	case "chat":
	case "":
		u, err := url.Parse(p.OpenAI.Endpoint.BaseURL)
		p.OpenAI.Responses = err == nil && strings.EqualFold(u.Hostname(), "api.openai.com")
	default:
		return fmt.Errorf("responses: %q is neither native nor chat", p.Responses)
	}
	if p.Continuation == "" {
		p.OpenAI.Continuation = continuationOf(p.OpenAI.Endpoint.BaseURL)
	} else if c, ok := provider.ParseContinuation(p.Continuation); ok {
		p.OpenAI.Continuation = c
	} else {
		return fmt.Errorf("continuation: %q is not one of none, prefill, prefix, continue_final_message", p.Continuation)
	}
	return nil
}

// continuationOf is how the server at baseURL continues an assistant's
// text, when the config does not say: Mistral's and DeepSeek's beta
// endpoint take the "prefix" flag (https://docs.mistral.ai/guides/prefix/,
// https://api-docs.deepseek.com/guides/chat_prefix_completion); others
// are not known to.
func continuationOf(baseURL string) provider.Continuation {
	u, err := url.Parse(baseURL)
	if err != nil {
		return provider.NoContinuation
	}
	switch host := strings.ToLower(u.Hostname()); {
	case host == "api.mistral.ai":
		return provider.PrefixFlag
	case host == "api.deepseek.com" && strings.HasPrefix(u.Path, "/beta"):
		return provider.PrefixFlag
	}
	return provider.NoContinuation
}

// Azure is the provider type `azure`: Azure OpenAI. base_url is the
// resource's endpoint with "/openai", such as
// "https://RESOURCE.openai.azure.com/openai", optionally with
// "?api-version=..." (default 2024-10-21), or ending in "/openai/v1" for
// the v1 API; the deployment's model is the Azure deployment name. The key
// goes in "api-key".
type Azure struct {
	ProviderConfig
	adapters.Azure `json:"-"`
}

// CaddyModule returns the Caddy module information.
func (Azure) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: ProviderNamespace + ".azure", New: func() caddy.Module { return new(Azure) }}
}

// Provision implements caddy.Provisioner.
func (p *Azure) Provision(ctx caddy.Context) error {
	p.AllowQuery = true
	if err := p.ProviderConfig.Provision(ctx); err != nil {
		return err
	}
	p.Azure.Endpoint = p.ProviderEndpoint()
	return nil
}

// Anthropic is the provider type `anthropic`: Anthropic's Messages API,
// base_url such as "https://api.anthropic.com/v1", the key in "x-api-key".
// Messages requests go natively; Chat Completions requests are translated.
type Anthropic struct {
	ProviderConfig
	adapters.Anthropic `json:"-"`
}

// CaddyModule returns the Caddy module information.
func (Anthropic) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: ProviderNamespace + ".anthropic", New: func() caddy.Module { return new(Anthropic) }}
}

// Provision implements caddy.Provisioner.
func (p *Anthropic) Provision(ctx caddy.Context) error {
	if err := p.ProviderConfig.Provision(ctx); err != nil {
		return err
	}
	p.Anthropic.Endpoint = p.ProviderEndpoint()
	return nil
}

// Gemini is the provider type `gemini`: the Gemini API's generateContent,
// base_url such as "https://generativelanguage.googleapis.com/v1beta", the
// key in "x-goog-api-key". Requests are translated from Chat Completions.
type Gemini struct {
	ProviderConfig
	adapters.Gemini `json:"-"`
}

// CaddyModule returns the Caddy module information.
func (Gemini) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: ProviderNamespace + ".gemini", New: func() caddy.Module { return new(Gemini) }}
}

// Provision implements caddy.Provisioner.
func (p *Gemini) Provision(ctx caddy.Context) error {
	if err := p.ProviderConfig.Provision(ctx); err != nil {
		return err
	}
	p.Gemini.Endpoint = p.ProviderEndpoint()
	return nil
}

// Interface guards
var (
	_ ProviderModule        = (*OpenAI)(nil)
	_ ProviderModule        = (*Azure)(nil)
	_ ProviderModule        = (*Anthropic)(nil)
	_ ProviderModule        = (*Gemini)(nil)
	_ caddy.Provisioner     = (*ProviderConfig)(nil)
	_ caddy.CleanerUpper    = (*ProviderConfig)(nil)
	_ caddy.Provisioner     = (*OpenAI)(nil)
	_ caddyfile.Unmarshaler = (*OpenAI)(nil)
	_ caddy.Provisioner     = (*Azure)(nil)
	_ caddy.Provisioner     = (*Anthropic)(nil)
	_ caddy.Provisioner     = (*Gemini)(nil)
)
