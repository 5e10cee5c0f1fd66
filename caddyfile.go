package llmrouter

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/llmrouter/caddy-llm-router/internal/router"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("llm_router", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("llm_router", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	llm_router [<matcher>] {
//	    deadline      <duration>
//	    max_attempts  <n>
//	    resume        same_model | any | off
//	    hedge_after   <duration>
//	    priority      <0..9 | placeholder>
//	    reserve       <percent>% for priority >= <n>
//	    backoff_base  <duration>
//	    backoff_max   <duration>
//	    max_body      <size>
//	    max_stream_bytes <size>
//	    store         memory | redis <url> { key_prefix <p>; timeout <d>; poll_interval <d> }
//	    weights       [cost <w>] [latency <w>] [reliability <w>] [quality <w>] [capacity <w>]
//	    consumer      <placeholder>                  (consumers_caddyfile.go)
//	    keys          <file>
//	    plan <name> { weight <n>; rpm <n>; tpm <n>; concurrent <n>; budget <USD> per <d>; groups <group>... }
//	    consumers     <plan> <consumer>...
//
//	    provider <name> {
//	        type          openai|anthropic|gemini|azure|<a module of llm_router.providers>
//	        base_url      <url>
//	        api_key       <key>
//	        timeout       <duration>
//	        ttft_timeout  <duration>
//	        idle_timeout  <duration>
//	        header        <name> <value>
//	        transport     http { ... }
//	        ...           the provider type's own options
//	    }
//
//	    model <name> {
//	        fallback_group  <model group>
//	        max_queued      <n>
//	        deployment <provider> <upstream model> [{
//	            cost_input      <USD per 1M tokens>
//	            cost_output     <USD per 1M tokens>
//	            cost_cached_input <USD per 1M tokens>
//	            cost_cache_write    <USD per 1M tokens>
//	            cost_cache_write_1h <USD per 1M tokens>
//	            quality         <0..1>
//	            context_window  <tokens>
//	            weight          <n>
//	            tier            <n>
//	            rpm             <requests per minute>
//	            tpm             <tokens per minute>
//	        }]
//	    }
//	}
//
// Unknown and duplicate subdirectives, an unknown provider type, negative
// values, a deployment naming an unknown provider and a model group without
// deployments are errors, with the file and line.
// parseReserve reads "reserve <percent>[%] for priority >= <n>".
func parseReserve(d *caddyfile.Dispenser) (*ReserveConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 5 || args[1] != "for" || args[2] != "priority" || args[3] != ">=" {
		return nil, d.Errf("reserve: expected reserve <percent>%% for priority >= <n>, got %q", strings.Join(args, " "))
	}
	pct, err := strconv.ParseFloat(strings.TrimSuffix(args[0], "%"), 64)
	if err != nil || !(pct > 0 && pct < 100) {
		return nil, d.Errf("reserve: the share must be more than 0%% and less than 100%%, got %q", args[0])
	}
	n, err := strconv.Atoi(args[4])
	if err != nil || n < 1 || n > 9 {
		return nil, d.Errf("reserve: the priority must be a whole number from 1 to 9, got %q", args[4])
	}
	return &ReserveConfig{Percent: pct, MinPriority: n}, nil
}

func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	type ref struct {
		provider string
		line     int
		file     string
	}
	var refs, fallbacks []ref // deployments' providers; groups with a fallback_group (provider: the group's name)
	for d.NextBlock(0) {
		key := d.Val()
		if key != "provider" && key != "model" && key != "plan" && key != "consumers" {
			if seen[key] {
				return d.Errf("duplicate subdirective %s", key)
			}
			seen[key] = true
		}
		switch key {
		case "deadline":
			if err := parseDuration(d, &h.Deadline); err != nil {
				return err
			}
		case "backoff_base":
			if err := parseDuration(d, &h.BackoffBase); err != nil {
				return err
			}
		case "backoff_max":
			if err := parseDuration(d, &h.BackoffMax); err != nil {
				return err
			}
		case "resume":
			if !d.NextArg() {
				return d.ArgErr()
			}
			h.Resume = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			if _, ok := router.ParseResumeMode(h.Resume); !ok {
				return d.Errf("resume: %q is not one of same_model, any, off", h.Resume)
			}
		case "hedge_after":
			if err := parseDuration(d, &h.HedgeAfter); err != nil {
				return err
			}
		case "max_attempts":
			n, err := parseInt(d)
			if err != nil {
				return err
			}
			if n < 1 {
				return d.Errf("max_attempts must be at least 1, got %d", n)
			}
			h.MaxAttempts = int(n)
		case "pass_through":
			if !d.NextArg() {
				return d.ArgErr()
			}
			h.PassThrough = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "affinity":
			if !d.NextArg() {
				return d.ArgErr()
			}
			h.Affinity = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
		case "priority":
			if !d.NextArg() {
				return d.ArgErr()
			}
			h.Priority = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			if err := checkPriority(h.Priority); err != nil {
				return d.Err(err.Error())
			}
		case "reserve":
			rs, err := parseReserve(d)
			if err != nil {
				return err
			}
			h.Reserve = rs
		case "max_body", "max_stream_bytes":
			size, err := parseSize(d)
			if err != nil {
				return err
			}
			if key == "max_body" {
				h.MaxBody = size
			} else {
				h.MaxStreamBytes = size
			}
		case "store": // fleet mode (store.go)
			sc, err := parseStore(d)
			if err != nil {
				return err
			}
			h.Store = sc
		case "weights":
			w, err := parseWeights(d)
			if err != nil {
				return err
			}
			h.Weights = w
		case "consumer", "keys", "plan", "consumers": // consumers_caddyfile.go
			if err := h.parseConsumers(d, key); err != nil {
				return err
			}
		case "provider":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			if _, dup := h.ProvidersRaw[name]; dup {
				return d.Errf("duplicate provider %s", name)
			}
			d.Prev() // the segment starts at "provider"
			raw, err := parseProvider(d.NewFromNextSegment())
			if err != nil {
				return err
			}
			if h.ProvidersRaw == nil {
				h.ProvidersRaw = map[string]json.RawMessage{}
			}
			h.ProvidersRaw[name] = raw
		case "model":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			if _, dup := h.Models[name]; dup {
				return d.Errf("duplicate model %s", name)
			}
			g := new(ModelGroup)
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				line := d.Line()
				if d.Val() == "fallback_group" {
					if g.FallbackGroup != "" {
						return d.Errf("duplicate subdirective fallback_group in model %s", name)
					}
					if !d.NextArg() {
						return d.ArgErr()
					}
					g.FallbackGroup = d.Val()
					if d.NextArg() {
						return d.ArgErr()
					}
					if d.Next() {
						if d.Val() == "{" && d.Line() == line {
							return d.Err("fallback_group takes one model group name, no block")
						}
						d.Prev()
					}
					fallbacks = append(fallbacks, ref{name, line, d.File()})
					continue
				}
				if d.Val() == "budget" {
					if g.Budget != nil {
						return d.Errf("duplicate subdirective budget in model %s", name)
					}
					b, err := parseBudget(d)
					if err != nil {
						return err
					}
					g.Budget = b
					continue
				}
				if d.Val() == "max_queued" {
					if g.MaxQueued != 0 {
						return d.Errf("duplicate subdirective max_queued in model %s", name)
					}
					n, err := parseInt(d)
					if err != nil {
						return err
					}
					if n < 1 || n > math.MaxInt32 {
						return d.Errf("max_queued must be a whole number from 1 to %d, got %d", math.MaxInt32, n)
					}
					g.MaxQueued = int(n)
					continue
				}
				if d.Val() == "alias" {
					args := d.RemainingArgs()
					if len(args) == 0 {
						return d.ArgErr()
					}
					g.Aliases = append(g.Aliases, args...)
					continue
				}
				if d.Val() != "deployment" {
					return d.Errf("unknown subdirective %s in model %s%s", d.Val(), name, suggest(d.Val(), modelKeys))
				}
				dep, err := parseDeployment(d)
				if err != nil {
					return err
				}
				refs = append(refs, ref{dep.Provider, line, d.File()})
				g.Deployments = append(g.Deployments, dep)
				if err := g.validate(); err != nil {
					return d.Errf("model %s: %v", name, err)
				}
			}
			if err := g.validate(); err != nil {
				return d.Errf("model %s: %v", name, err)
			}
			if h.Models == nil {
				h.Models = map[string]*ModelGroup{}
			}
			h.Models[name] = g
		default:
			return d.Errf("unknown subdirective %s%s", key, suggest(key, handlerKeys))
		}
	}
	if len(h.Models) == 0 {
		return d.Err("llm_router needs at least one model block")
	}
	if err := h.validateSettings(); err != nil {
		return d.Err(err.Error())
	}
	for _, r := range refs {
		if _, ok := h.ProvidersRaw[r.provider]; !ok {
			return fmt.Errorf("deployment names unknown provider %s (configured: %s), at %s:%d",
				r.provider, strings.Join(sortedKeys(h.ProvidersRaw), ", "), r.file, r.line)
		}
	}
	if err := namesProblem(h.Models); err != nil {
		return d.Err(err.Error())
	}
	if _, ok := h.ProvidersRaw[h.PassThrough]; h.PassThrough != "" && !ok {
		return d.Errf("pass_through names unknown provider %q (configured: %s)", h.PassThrough, strings.Join(sortedKeys(h.ProvidersRaw), ", "))
	}
	if name, err := fallbackProblem(h.Models); err != nil {
		for _, r := range fallbacks {
			if r.provider == name {
				return fmt.Errorf("%v, at %s:%d", err, r.file, r.line)
			}
		}
		return err
	}
	return nil
}

// parseProvider parses one provider's segment (`provider <name> { ... }`)
// into its type module's JSON: the type names the module, which parses
// the block (ParseProviderBlock with its own options, when it implements
// caddyfile.Unmarshaler).
func parseProvider(d *caddyfile.Dispenser) (json.RawMessage, error) {
	mod, err := providerType(d)
	if err != nil {
		return nil, err
	}
	d.Reset()
	typ := mod.ID.Name()
	inst := mod.New()
	pm, ok := inst.(ProviderModule)
	if !ok {
		return nil, d.Errf("module %s is not a provider type (ProviderModule)", mod.ID)
	}
	if unm, ok := inst.(caddyfile.Unmarshaler); ok {
		err = unm.UnmarshalCaddyfile(d)
	} else {
		err = ParseProviderBlock(d, pm.ProviderSettings(), nil)
	}
	if err != nil {
		return nil, err
	}
	var warnings []caddyconfig.Warning
	return caddyconfig.JSONModuleObject(inst, "type", typ, &warnings), nil
}

// providerType finds a provider block's `type`, wherever it stands, and
// the module it names.
func providerType(d *caddyfile.Dispenser) (caddy.ModuleInfo, error) {
	d.Next() // provider
	d.Next() // its name
	name, file, line := d.Val(), d.File(), d.Line()
	var mod caddy.ModuleInfo
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		args := d.RemainingArgs()
		if key == "type" {
			if mod.New != nil {
				return mod, d.Err("duplicate subdirective type in provider")
			}
			if len(args) != 1 {
				return mod, d.ArgErr()
			}
			var err error
			if mod, err = caddy.GetModule(ProviderNamespace + "." + args[0]); err != nil {
				return mod, d.Err(unknownType(args[0]).Error())
			}
		}
		for inner := d.Nesting(); d.NextBlock(inner); {
		}
	}
	if mod.New == nil {
		return mod, fmt.Errorf("provider %s needs a type (%s), at %s:%d", name, strings.Join(providerTypes(), ", "), file, line)
	}
	return mod, nil
}

func parseDeployment(d *caddyfile.Dispenser) (*Deployment, error) {
	args := d.RemainingArgs()
	if len(args) != 2 {
		return nil, d.Errf("deployment takes <provider> <upstream model>, got %d arguments", len(args))
	}
	dep := &Deployment{Provider: args[0], Model: args[1]}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		if seen[key] {
			return nil, d.Errf("duplicate subdirective %s in deployment", key)
		}
		seen[key] = true
		switch key {
		case "cost_input", "cost_output", "cost_cached_input", "quality":
			f, err := parseFloat(d)
			if err != nil {
				return nil, err
			}
			switch key {
			case "cost_input":
				dep.CostInput = f
			case "cost_cached_input":
				dep.CostCachedInput = &f
			case "cost_output":
				dep.CostOutput = f
			case "quality":
				dep.Quality = f
			}
		case "cost_cache_write", "cost_cache_write_1h": // prompt-cache write prices (prices.go)
			f, err := parseFloat(d)
			if err != nil {
				return nil, err
			}
			if key == "cost_cache_write" {
				dep.CostCacheWrite = &f
			} else {
				dep.CostCacheWrite1h = &f
			}
		case "context_window":
			n, err := parseInt(d)
			if err != nil {
				return nil, err
			}
			dep.ContextWindow = n
		case "weight":
			n, err := parseInt(d)
			if err != nil {
				return nil, err
			}
			dep.Weight = int(n)
		case "tier":
			n, err := parseInt(d)
			if err != nil {
				return nil, err
			}
			if n < 1 || n > 100 {
				return nil, d.Errf("tier must be from 1 to 100, got %d", n)
			}
			dep.Tier = int(n)
		case "budget":
			b, err := parseBudget(d)
			if err != nil {
				return nil, err
			}
			dep.Budget = b
		case "rpm":
			n, err := parseInt(d)
			if err != nil {
				return nil, err
			}
			dep.RPM = n
		case "tpm":
			n, err := parseInt(d)
			if err != nil {
				return nil, err
			}
			dep.TPM = n
		default:
			return nil, d.Errf("unknown subdirective %s in deployment%s", key, suggest(key, deploymentKeys))
		}
	}
	if err := dep.validate(); err != nil {
		return nil, d.Err(err.Error())
	}
	return dep, nil
}

func parseWeights(d *caddyfile.Dispenser) (*Weights, error) {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args)%2 != 0 {
		return nil, d.Err("weights takes pairs: <feature> <weight> ...")
	}
	w := new(Weights)
	for i := 0; i < len(args); i += 2 {
		f, err := strconv.ParseFloat(args[i+1], 64)
		if err != nil || f < 0 || !finite(f) {
			return nil, d.Errf("weights: %s must be a non-negative number, got %q", args[i], args[i+1])
		}
		var dst **float64
		switch args[i] {
		case "cost":
			dst = &w.Cost
		case "latency":
			dst = &w.Latency
		case "reliability":
			dst = &w.Reliability
		case "quality":
			dst = &w.Quality
		case "capacity":
			dst = &w.Capacity
		default:
			return nil, d.Errf("weights: unknown feature %s (cost, latency, reliability, quality, capacity)", args[i])
		}
		if *dst != nil {
			return nil, d.Errf("weights: duplicate feature %s", args[i])
		}
		*dst = &f
	}
	return w, nil
}

// parseSize reads one size argument (4MB, 64MiB, 1000), more than 0 and
// at most 1 TiB.
func parseSize(d *caddyfile.Dispenser) (int64, error) {
	key := d.Val()
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	size, err := humanize.ParseBytes(d.Val())
	if err != nil || size == 0 || size > 1<<40 {
		return 0, d.Errf("%s: invalid size %q", key, d.Val())
	}
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return int64(size), nil
}

// parseDuration reads one non-negative Caddy duration argument.
func parseDuration(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	key := d.Val()
	dur, err := caddy.ParseDuration(d.Val())
	if err != nil {
		return d.Errf("bad duration %q: %v", key, err)
	}
	if dur < 0 {
		return d.Errf("duration must not be negative, got %s", key)
	}
	*dst = caddy.Duration(dur)
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// parseInt reads one non-negative integer argument.
func parseInt(d *caddyfile.Dispenser) (int64, error) {
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	n, err := strconv.ParseInt(d.Val(), 10, 64)
	if err != nil || n < 0 {
		return 0, d.Errf("expected a non-negative integer, got %q", d.Val())
	}
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return n, nil
}

// parseFloat reads one non-negative number argument.
func parseFloat(d *caddyfile.Dispenser) (float64, error) {
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	f, err := strconv.ParseFloat(d.Val(), 64)
	if err != nil || f < 0 || !finite(f) {
		return 0, d.Errf("expected a non-negative number, got %q", d.Val())
	}
	if d.NextArg() {
		return 0, d.ArgErr()
	}
	return f, nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
