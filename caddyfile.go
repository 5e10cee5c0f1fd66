package llmrouter

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/llmrouter/caddy-llm-router/internal/jsonbody"
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
// Unknown and duplicate subdirectives, arguments that are not what the
// subdirective takes and an unknown provider type are errors of the
// parser; it fills the JSON structs (Handler, ModelGroup, Deployment, ...)
// and then runs the same validate as Provision, whose errors it reports
// at the line that set the value they name (positions). A value of 0 for
// max_attempts, max_queued, tier, max_body or max_stream_bytes is an error
// here (JSON's 0 is a field left out: the default). Every error has the
// file and line.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	p := &handlerParser{h: h, pos: positions{}, once: once("", "provider", "model", "plan", "consumers")}
	p.pos.record(d)
	for d.NextBlock(0) {
		if err := p.subdirective(d); err != nil {
			return err
		}
	}
	return p.pos.locate(h.validate())
}

// handlerParser is the state of one llm_router block's parse.
type handlerParser struct {
	h    *Handler
	pos  positions
	once func(d *caddyfile.Dispenser) error
}

// subdirective parses one subdirective of the llm_router block: one case
// per subdirective.
func (p *handlerParser) subdirective(d *caddyfile.Dispenser) error {
	h, key := p.h, d.Val()
	if err := p.once(d); err != nil {
		return err
	}
	p.pos.record(d, key)
	switch key {
	case "deadline":
		return parseDuration(d, &h.Deadline)
	case "backoff_base":
		return parseDuration(d, &h.BackoffBase)
	case "backoff_max":
		return parseDuration(d, &h.BackoffMax)
	case "hedge_after":
		return parseDuration(d, &h.HedgeAfter)
	case "resume":
		return argInto(d, &h.Resume)
	case "max_attempts":
		return parseCount(d, &h.MaxAttempts)
	case "pass_through":
		return argInto(d, &h.PassThrough)
	case "affinity":
		return argInto(d, &h.Affinity)
	case "priority":
		return argInto(d, &h.Priority)
	case "reserve":
		return parseInto(d, &h.Reserve, parseReserve)
	case "max_body":
		return parseSize(d, &h.MaxBody)
	case "max_stream_bytes":
		return parseSize(d, &h.MaxStreamBytes)
	case "store": // fleet mode (store.go)
		return parseInto(d, &h.Store, parseStore)
	case "weights":
		return parseInto(d, &h.Weights, parseWeights)
	case "provider":
		return p.provider(d)
	case "model":
		return p.model(d)
	case "consumer", "keys", "plan", "consumers": // consumers_caddyfile.go
		return h.parseConsumers(d, key)
	}
	return d.Errf("unknown subdirective %s%s", key, suggest(key, handlerKeys))
}

// provider parses `provider <name> { ... }` into ProvidersRaw.
func (p *handlerParser) provider(d *caddyfile.Dispenser) error {
	var name string
	if !d.Args(&name) || d.NextArg() {
		return d.ArgErr()
	}
	if _, dup := p.h.ProvidersRaw[name]; dup {
		return d.Errf("duplicate provider %s", name)
	}
	p.pos.record(d, "providers", name)
	d.Prev() // the segment starts at "provider"
	raw, err := parseProvider(d.NewFromNextSegment())
	if err != nil {
		return err
	}
	if p.h.ProvidersRaw == nil {
		p.h.ProvidersRaw = map[string]json.RawMessage{}
	}
	p.h.ProvidersRaw[name] = raw
	return nil
}

// model parses `model <name> { ... }` into Models.
func (p *handlerParser) model(d *caddyfile.Dispenser) error {
	var name string
	if !d.Args(&name) || d.NextArg() {
		return d.ArgErr()
	}
	if _, dup := p.h.Models[name]; dup {
		return d.Errf("duplicate model %s", name)
	}
	at := []string{"models", name}
	p.pos.record(d, at...)
	g := new(ModelGroup)
	check := once(" in model "+name, "alias", "deployment")
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := check(d); err != nil {
			return err
		}
		if err := p.groupSubdirective(d, g, at); err != nil {
			return err
		}
	}
	if p.h.Models == nil {
		p.h.Models = map[string]*ModelGroup{}
	}
	p.h.Models[name] = g
	return nil
}

// groupSubdirective parses one subdirective of a model block: one case
// per subdirective.
func (p *handlerParser) groupSubdirective(d *caddyfile.Dispenser, g *ModelGroup, at []string) error {
	key := d.Val()
	switch key {
	case "deployment":
		dat := append(slices.Clone(at), "deployments", strconv.Itoa(len(g.Deployments)))
		p.pos.record(d, dat...)
		return parseInto(d, appendTo(&g.Deployments), p.deployment(dat))
	case "alias":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.ArgErr()
		}
		for i := range args {
			p.pos.record(d, append(at, "aliases", strconv.Itoa(len(g.Aliases)+i))...)
		}
		g.Aliases = append(g.Aliases, args...)
		return nil
	}
	p.pos.record(d, append(at, key)...)
	switch key {
	case "fallback_group":
		return parseFallbackGroup(d, &g.FallbackGroup)
	case "budget":
		return parseInto(d, &g.Budget, parseBudget)
	case "max_queued":
		return parseCount(d, &g.MaxQueued)
	}
	return d.Errf("unknown subdirective %s in model %s%s", key, at[1], suggest(key, modelKeys))
}

// parseFallbackGroup reads `fallback_group <model group>`, which takes no
// block.
func parseFallbackGroup(d *caddyfile.Dispenser, dst *string) error {
	line := d.Line()
	if err := argInto(d, dst); err != nil {
		return err
	}
	if d.Next() {
		if d.Val() == "{" && d.Line() == line {
			return d.Err("fallback_group takes one model group name, no block")
		}
		d.Prev()
	}
	return nil
}

// parseReserve reads "reserve <percent>[%] for priority >= <n>"
// (validate bounds both).
func parseReserve(d *caddyfile.Dispenser) (*ReserveConfig, error) {
	args := d.RemainingArgs()
	if len(args) != 5 || args[1] != "for" || args[2] != "priority" || args[3] != ">=" {
		return nil, d.Errf("reserve: expected reserve <percent>%% for priority >= <n>, got %q", strings.Join(args, " "))
	}
	pct, err := strconv.ParseFloat(strings.TrimSuffix(args[0], "%"), 64)
	if err != nil {
		return nil, d.Errf("reserve: the share must be a percentage, got %q", args[0])
	}
	n, err := strconv.Atoi(args[4])
	if err != nil {
		return nil, d.Errf("reserve: the priority must be a whole number from 1 to 9, got %q", args[4])
	}
	return &ReserveConfig{Percent: pct, MinPriority: n}, nil
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
	raw := caddyconfig.JSONModuleObject(inst, "type", typ, &warnings)
	keyLines.remember(raw, pm.ProviderSettings().lines)
	return raw, nil
}

// keyLines remembers where the Caddyfiles adapted in this process set
// each provider's credentials, by the provider's JSON: a key variable
// unset when the config loads (as JSON, which has no lines) is reported
// at its line (Handler.credentialLine). A config adapted elsewhere (caddy
// adapt, caddy reload) has none remembered: its error has no line.
var keyLines = &rememberedLines{byJSON: map[string]positions{}}

// rememberedLines are at most maxRemembered providers' positions; more
// (many reloads of changing configs) forget them all.
type rememberedLines struct {
	mu     sync.Mutex
	byJSON map[string]positions
}

const maxRemembered = 1024

func (r *rememberedLines) remember(raw json.RawMessage, ps positions) {
	if len(ps) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.byJSON) >= maxRemembered {
		clear(r.byJSON)
	}
	r.byJSON[canonicalJSON(raw)] = ps
}

func (r *rememberedLines) of(raw json.RawMessage) positions {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byJSON[canonicalJSON(raw)]
}

// canonicalJSON is raw with its members sorted and its strings escaped
// alike, as it comes back from the adapter's encoding.
func canonicalJSON(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	b, _ := jsonbody.Marshal(v) // decoded JSON always encodes
	return string(b)
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

// deployment returns the parser of `deployment <provider> <upstream
// model> [{ ... }]`, the deployment at path at.
func (p *handlerParser) deployment(at []string) func(d *caddyfile.Dispenser) (*Deployment, error) {
	return func(d *caddyfile.Dispenser) (*Deployment, error) {
		args := d.RemainingArgs()
		if len(args) != 2 {
			return nil, d.Errf("deployment takes <provider> <upstream model>, got %d arguments", len(args))
		}
		dep := &Deployment{Provider: args[0], Model: args[1]}
		p.pos.record(d, append(slices.Clone(at), "provider")...)
		check := once(" in deployment")
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			if err := check(d); err != nil {
				return nil, err
			}
			p.pos.record(d, append(slices.Clone(at), d.Val())...)
			if err := deploymentSubdirective(d, dep); err != nil {
				return nil, err
			}
		}
		return dep, nil
	}
}

// deploymentSubdirective parses one subdirective of a deployment block:
// one case per subdirective.
func deploymentSubdirective(d *caddyfile.Dispenser, dep *Deployment) error {
	switch key := d.Val(); key {
	case "cost_input":
		return parseFloat(d, &dep.CostInput)
	case "cost_output":
		return parseFloat(d, &dep.CostOutput)
	case "cost_cached_input":
		return parseInto(d, &dep.CostCachedInput, parseFloatArg)
	case "cost_cache_write": // prompt-cache write prices (prices.go)
		return parseInto(d, &dep.CostCacheWrite, parseFloatArg)
	case "cost_cache_write_1h":
		return parseInto(d, &dep.CostCacheWrite1h, parseFloatArg)
	case "quality":
		return parseFloat(d, &dep.Quality)
	case "context_window":
		return parseInt(d, &dep.ContextWindow)
	case "weight":
		return parseInto(d, &dep.Weight, parseIntArg)
	case "tier":
		return parseCount(d, &dep.Tier)
	case "budget":
		return parseInto(d, &dep.Budget, parseBudget)
	case "rpm":
		return parseInt(d, &dep.RPM)
	case "tpm":
		return parseInt(d, &dep.TPM)
	default:
		return d.Errf("unknown subdirective %s in deployment%s", key, suggest(key, deploymentKeys))
	}
}

func parseWeights(d *caddyfile.Dispenser) (*Weights, error) {
	args := d.RemainingArgs()
	if len(args) == 0 || len(args)%2 != 0 {
		return nil, d.Err("weights takes pairs: <feature> <weight> ...")
	}
	w := new(Weights)
	for i := 0; i < len(args); i += 2 {
		f, err := strconv.ParseFloat(args[i+1], 64)
		if err != nil {
			return nil, d.Errf("weights: %s must be a number, got %q", args[i], args[i+1])
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

// positions are where a Caddyfile set the configuration's values, by
// their path in the handler's JSON (fieldError): the error of a value
// that validate refuses is reported at the line that set it.
type positions map[string]position

type position struct {
	file string
	line int
}

// record notes the dispenser's current line as the position of the value
// at path.
func (ps positions) record(d *caddyfile.Dispenser, path ...string) {
	ps[strings.Join(path, "\x00")] = position{d.File(), d.Line()}
}

// locate puts after err the position of the value it names, or of the
// nearest enclosing value recorded: the llm_router block at least.
func (ps positions) locate(err error) error {
	if err == nil {
		return nil
	}
	if p, ok := ps.at(fieldPath(err)); ok {
		return fmt.Errorf("%w, at %s:%d", err, p.file, p.line)
	}
	return err
}

// at is the position of the value at path, or of the nearest enclosing
// value recorded.
func (ps positions) at(path []string) (position, bool) {
	for ; ; path = path[:len(path)-1] {
		if p, ok := ps[strings.Join(path, "\x00")]; ok {
			return p, true
		}
		if len(path) == 0 {
			return position{}, false
		}
	}
}

// once returns a check that refuses a subdirective given twice in one
// block, but for the repeatable ones; where names the block in its error
// (" in deployment"). The parsers of every block share it.
func once(where string, repeatable ...string) func(d *caddyfile.Dispenser) error {
	seen := map[string]bool{}
	return func(d *caddyfile.Dispenser) error {
		key := d.Val()
		if slices.Contains(repeatable, key) {
			return nil
		}
		if seen[key] {
			return d.Errf("duplicate subdirective %s%s", key, where)
		}
		seen[key] = true
		return nil
	}
}

// parseInto sets *dst to what parse reads.
func parseInto[T any](d *caddyfile.Dispenser, dst *T, parse func(*caddyfile.Dispenser) (T, error)) error {
	v, err := parse(d)
	if err != nil {
		return err
	}
	*dst = v
	return nil
}

// appendTo is a destination for parseInto that appends to *s.
func appendTo[T any](s *[]T) *T {
	*s = append(*s, *new(T))
	return &(*s)[len(*s)-1]
}

// argInto reads the subdirective's one argument into dst.
func argInto(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// parseSize reads one size argument (4MB, 64MiB, 1000), more than 0
// (validate bounds it).
func parseSize(d *caddyfile.Dispenser, dst *int64) error {
	key := d.Val()
	var v string
	if err := argInto(d, &v); err != nil {
		return err
	}
	size, err := humanize.ParseBytes(v)
	if err != nil || size == 0 || size > math.MaxInt64 {
		return d.Errf("%s: invalid size %q", key, v)
	}
	*dst = int64(size)
	return nil
}

// parseDuration reads one Caddy duration argument (validate bounds it).
func parseDuration(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	var v string
	if err := argInto(d, &v); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return d.Errf("bad duration %q: %v", v, err)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// parseIntArg reads one integer argument (validate bounds it).
func parseIntArg(d *caddyfile.Dispenser) (int, error) {
	var n int64
	err := parseInt(d, &n)
	return int(n), err
}

// parseInt reads one integer argument into dst (validate bounds it).
func parseInt(d *caddyfile.Dispenser, dst *int64) error {
	var v string
	if err := argInto(d, &v); err != nil {
		return err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return d.Errf("%s: expected a whole number, got %q", d.Val(), v)
	}
	*dst = n
	return nil
}

// parseCount reads a whole number of at least 1 into dst: a setting whose
// 0 in JSON is the field left out (its default), so that writing 0 is a
// mistake (validate bounds it further).
func parseCount(d *caddyfile.Dispenser, dst *int) error {
	key := d.Val()
	n, err := parseIntArg(d)
	if err != nil {
		return err
	}
	if n == 0 {
		return d.Errf("%s must be at least 1, got 0 (leave %s out for its default)", key, key)
	}
	*dst = n
	return nil
}

// parseFloatArg reads one number argument (validate bounds it).
func parseFloatArg(d *caddyfile.Dispenser) (*float64, error) {
	f := new(float64)
	return f, parseFloat(d, f)
}

// parseFloat reads one number argument into dst (validate bounds it).
func parseFloat(d *caddyfile.Dispenser, dst *float64) error {
	key := d.Val()
	var v string
	if err := argInto(d, &v); err != nil {
		return err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return d.Errf("%s: expected a number, got %q", key, v)
	}
	*dst = f
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*Handler)(nil)
