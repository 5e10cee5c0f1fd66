package llmrouter

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/consumer"
	"github.com/llmrouter/caddy-llm-router/internal/router"
)

// HeaderLimit says which limit a 429 of the router met: "consumer" (the
// consumer's plan: rpm, tpm, concurrent, budget; HeaderConsumerLimit names
// which) or "capacity" (the deployments' windows, quotas or queue).
const (
	HeaderLimit         = "X-LLM-Router-Limit"
	HeaderConsumerLimit = "X-LLM-Router-Consumer-Limit"
)

// Consumers are who is asking, and what their plans allow them (see
// docs/consumers.md). The Caddyfile says
//
//	consumer  <placeholder>
//	keys      <file>
//	plan <name> { weight <n>; rpm <n>; tpm <n>; concurrent <n>; budget <USD> per <duration>; groups <group>... }
//	consumers <plan> <consumer>...
//
// A request over its plan's limits is answered 429 with Retry-After until
// the limit admits it again (1 s for concurrent: no instant is known),
// HeaderLimit "consumer" and HeaderConsumerLimit; one for a model group
// outside its plan 403; both in the client's format, with x-should-retry:
// false, before any provider is asked.
type Consumers struct {
	// Consumer names the consumer of each request: a placeholder resolved
	// per request, such as {http.auth.user.id} after basic_auth,
	// forward_auth or a JWT module, or {http.request.header.X-Team}. When
	// it resolves to nothing, Keys decides (when set), else the request is
	// anonymous (the consumer ""). Default: none.
	Consumer string `json:"consumer,omitempty"`
	// Keys is a file of API keys by consumer, one a line: "<consumer>
	// <sha256 hex of the key>" (`printf %s "$KEY" | sha256sum`), read at
	// load. A request whose Consumer resolved to nothing must then carry
	// a key it lists, as Authorization: Bearer <key> or x-api-key: <key>,
	// else it is answered 401 in the client's format; the client's key is
	// removed from the request (it never reaches a provider) and is never
	// logged. Default: none.
	Keys string `json:"keys,omitempty"`
	// Plans are limits and a weight by plan name (ConsumerPlan); each
	// consumer on a plan has them for itself. Default: none.
	Plans map[string]*ConsumerPlan `json:"plans,omitempty"`
	// ConsumersOf lists the consumers on each plan, by plan name. A
	// consumer on none is on plan "default" when one is defined, else it
	// has no limits and weight 1. Default: none.
	ConsumersOf map[string][]string `json:"consumers,omitempty"`

	registry *consumer.Registry
	keys     *consumer.Keys
	labels   *consumerLabels
}

// ConsumerPlan is a plan's limits and weight, for each of its consumers.
type ConsumerPlan struct {
	// Weight is its consumers' share of scarce capacity: when several
	// consumers' requests wait for a model group's deployments at the same
	// priority, each gets at least weight / (the waiting consumers'
	// weights) of the requests served (weighted fair queueing); one that
	// asks for less leaves the rest to the others. Fleet mode orders its
	// queue by arrival alone. Default: 1; at most 1000.
	Weight float64 `json:"weight,omitempty"`
	// RPM and TPM bound each consumer's requests and estimated tokens
	// (prompt bytes / 4 plus max_tokens) over a sliding minute. Default:
	// 0 (none).
	RPM int64 `json:"rpm,omitempty"`
	TPM int64 `json:"tpm,omitempty"`
	// Concurrent bounds each consumer's requests in flight. Default: 0
	// (none).
	Concurrent int `json:"concurrent,omitempty"`
	// Budget bounds what each consumer's answers cost (Budget's windows
	// and prices): a request is admitted while its window's spend is
	// below it. Default: none.
	Budget *Budget `json:"budget,omitempty"`
	// Groups are the model groups its consumers may use (a request for
	// another is answered 403); names of configured groups. Default: all.
	Groups []string `json:"groups,omitempty"`
}

// validateConsumers checks the consumers' settings: placeholders, plans,
// members on known plans and on one plan each, groups that exist.
func (h *Handler) validateConsumers() error {
	c := &h.Consumers
	if err := checkConsumer(c.Consumer); err != nil {
		return err
	}
	for _, name := range sortedKeys(c.Plans) {
		p := c.Plans[name]
		if name == "" || p == nil {
			return errors.New("a plan needs a name and a body")
		}
		if cp := c.plan(name); cp.Validate() != nil {
			return cp.Validate()
		}
		if err := p.Budget.validate(); err != nil {
			return fmt.Errorf("plan %s: %w", name, err)
		}
		for _, g := range p.Groups {
			if _, ok := h.Models[g]; !ok {
				return fmt.Errorf("plan %s: groups names unknown model group %q (configured: %s)", name, g, strings.Join(sortedKeys(h.Models), ", "))
			}
		}
	}
	on := map[string]string{}
	for _, plan := range sortedKeys(c.ConsumersOf) {
		if _, ok := c.Plans[plan]; !ok {
			return fmt.Errorf("consumers names unknown plan %q (defined: %s)", plan, strings.Join(sortedKeys(c.Plans), ", "))
		}
		for _, who := range c.ConsumersOf[plan] {
			if prev, dup := on[who]; dup {
				return fmt.Errorf("consumer %s is on two plans: %s and %s", who, prev, plan)
			}
			on[who] = plan
		}
	}
	return nil
}

// checkConsumer checks a consumer setting: none, or a placeholder with
// its braces closed.
func checkConsumer(v string) error {
	if v == "" {
		return nil
	}
	if !strings.Contains(v, "{") {
		return fmt.Errorf("consumer: %q is not a placeholder such as {http.auth.user.id} (a fixed name would make every request one consumer's)", v)
	}
	return checkBraces("consumer", v)
}

// plan is the consumer package's plan of name.
func (c *Consumers) plan(name string) consumer.Plan {
	p := c.Plans[name]
	out := consumer.Plan{Name: name, Weight: p.Weight, RPM: p.RPM, TPM: p.TPM, Concurrent: p.Concurrent, Groups: p.Groups}
	if p.Budget != nil {
		out.BudgetUSD, out.BudgetPer = p.Budget.USD, time.Duration(p.Budget.Per)
	}
	return out
}

// provisionConsumers loads the keys file and builds the plans' registry.
func (h *Handler) provisionConsumers() error {
	c := &h.Consumers
	var plans []consumer.Plan
	for _, name := range sortedKeys(c.Plans) {
		plans = append(plans, c.plan(name))
	}
	members := map[string]string{}
	for plan, who := range c.ConsumersOf {
		for _, m := range who {
			members[m] = plan
		}
	}
	reg, err := consumer.New(plans, members)
	if err != nil {
		return err
	}
	c.registry = reg
	named := reg.Members()
	if c.Keys != "" {
		if c.keys, err = consumer.LoadKeys(c.Keys); err != nil {
			return err
		}
		if strings.Contains(c.Consumer, "{http.request.header.") {
			h.logger.Warn("consumer is a request header and keys are set: a client that sends the header names itself and needs no key; set the header in Caddy (request_header, forward_auth's copy_headers) or name the consumer by its authentication",
				zap.String("consumer", c.Consumer))
		}
		named = append(named, c.keys.Consumers()...)
	}
	c.labels = newConsumerLabels(named)
	return nil
}

// identified is the context key of a request's consumer once identify
// named it: the handler's own requests made of it (the WebSocket mode's
// turns, cloned from the upgrade, whose key was removed) are its.
type identified struct{}

// identify names the consumer of r (Consumers): the one its context
// carries (a turn of a WebSocket), else the Consumer placeholder, else
// the key r carries when there are keys (a 401 when it carries none or an
// unknown one), else anonymous. With keys, the client's key is removed
// from r. The consumer is set as {http.llm_router.consumer} and the
// access log's `consumer` field; r (its context) carries it on.
func (h *Handler) identify(r *http.Request) (string, *http.Request, *api.Error) {
	c := &h.Consumers
	if !c.active() {
		return "", r, nil // every request is anonymous: nothing to resolve or set
	}
	if who, ok := r.Context().Value(identified{}).(string); ok {
		consumer.StripKey(r.Header)
		return who, r, nil
	}
	who := ""
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if c.Consumer != "" && repl != nil {
		who = strings.TrimSpace(repl.ReplaceAll(c.Consumer, ""))
	}
	if c.keys != nil {
		key := consumer.KeyOf(r.Header)
		consumer.StripKey(r.Header)
		if who == "" {
			var ok bool
			if who, ok = c.keys.Lookup(key); !ok {
				why := "no API key: send one as Authorization: Bearer <key> or x-api-key: <key>"
				if key != "" {
					why = "the API key is not one of this router's keys"
				}
				h.metrics.consumerLimited(c.labels.of(""), "key")
				return "", r, api.Errorf(http.StatusUnauthorized, api.Unauthorized, "", "%s", why)
			}
		}
	}
	if repl != nil {
		repl.Set("http.llm_router.consumer", who)
	}
	if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
		extra.Set(zap.String("consumer", who))
	}
	return who, r.WithContext(context.WithValue(r.Context(), identified{}, who)), nil
}

// active reports whether any consumer setting is made (ConsumersOf only
// names members of Plans).
func (c *Consumers) active() bool {
	return c.Consumer != "" || c.Keys != "" || len(c.Plans) > 0
}

// admission is an admitted request's consumer: its ticket on the plan's
// limits and its metrics' label.
type admission struct {
	h      *Handler
	label  string
	ticket *consumer.Ticket
}

// admit decides req of consumer who for group (Consumers' plans): its
// admission, or the 403 or 429 to answer (with HeaderLimit set on w). It
// sets the request's consumer and weight for the queue's fair share.
func (h *Handler) admit(w http.ResponseWriter, who, group string, req *router.Request) (*admission, *api.Error) {
	c := &h.Consumers
	req.Consumer, req.Weight = who, c.registry.Weight(who)
	a := &admission{h: h}
	if c.active() {
		a.label = c.labels.of(who)
	}
	t, ref := c.registry.Admit(h.router.Clock.Now(), who, group, req.Tokens)
	if ref == nil {
		a.ticket = t
		return a, nil
	}
	h.metrics.consumerLimited(a.label, string(ref.Limit))
	h.logger.Debug("consumer refused", zap.String("consumer", who), zap.String("limit", string(ref.Limit)), zap.Duration("retry_after", ref.RetryAfter))
	if ref.Status == http.StatusForbidden {
		return nil, api.Errorf(http.StatusForbidden, api.Forbidden, "model", "%s", ref.Message)
	}
	w.Header().Set(HeaderLimit, "consumer")
	w.Header().Set(HeaderConsumerLimit, string(ref.Limit))
	e := api.Errorf(http.StatusTooManyRequests, api.RateLimited, "", "%s; retry after the given time", ref.Message)
	e.RetryAfter = ref.RetryAfter
	return nil, e
}

// done ends an admitted request: it gives back its concurrent slot,
// spends what it cost on its budget, and counts it in the consumer
// metrics.
func (a *admission) done(res *router.Result, cost float64) {
	a.ticket.Done(a.h.router.Clock.Now(), cost)
	if res == nil || !a.h.Consumers.active() {
		return // it panicked before it was served; no consumers to count
	}
	m := a.h.metrics
	m.consumerRequest(a.label, status(res), cost, res.Waited)
	u, ok := res.Usage, res.UsageStated
	if res.Stream != nil {
		u, ok = res.Stream.Usage()
	}
	if ok {
		m.consumerTokens(a.label, u.InputTokens, u.OutputTokens)
	}
}

// errorAPI is the client API that writes an error of path: its own, else
// Chat's (GET .../models, a path the router does not serve).
func errorAPI(path string) api.API {
	if a := api.ForPath(path); a != nil {
		return a
	}
	return api.Chat{}
}

// limitHeader marks a 429 of the router's own (the deployments'
// capacity) with HeaderLimit "capacity" when consumers are configured.
func (h *Handler) limitHeader(w http.ResponseWriter, res *router.Result) {
	if h.Consumers.active() && status(res) == http.StatusTooManyRequests {
		w.Header().Set(HeaderLimit, "capacity")
	}
}

// DefaultMaxConsumerLabels bounds the consumer label of the metrics: the
// consumers the config names (consumers lines, the keys file) first, then
// those seen first, up to this many; the others are counted as "other".
const DefaultMaxConsumerLabels = 100

// consumerOther is the label of the consumers beyond the bound, and
// consumerAnonymous that of requests without a consumer.
const (
	consumerOther     = "other"
	consumerAnonymous = "anonymous"
)

// consumerLabels gives each consumer its metrics label.
type consumerLabels struct {
	max  int
	mu   sync.Mutex
	seen map[string]bool
}

func newConsumerLabels(named []string) *consumerLabels {
	l := &consumerLabels{max: DefaultMaxConsumerLabels, seen: map[string]bool{}}
	for _, n := range slices.Compact(slices.Sorted(slices.Values(named))) {
		if len(l.seen) < l.max {
			l.seen[n] = true
		}
	}
	return l
}

// of returns who's label.
func (l *consumerLabels) of(who string) string {
	if who == "" {
		return consumerAnonymous
	}
	if l == nil {
		return consumerOther
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[who] {
		return who
	}
	if len(l.seen) < l.max && who != consumerOther && who != consumerAnonymous {
		l.seen[who] = true
		return who
	}
	return consumerOther
}

// consumerStatus is one consumer of GET /llm_router/consumers.
type consumerStatus = consumer.Usage

// liveConsumers lists the tracked consumers of every live handler (those
// with limits that asked of late), each at its router's clock, sorted by
// name.
func liveConsumers() []consumerStatus {
	live.Lock()
	defer live.Unlock()
	out := []consumerStatus{}
	for h := range live.handlers {
		out = append(out, h.Consumers.registry.Report(h.router.Clock.Now())...)
	}
	slices.SortStableFunc(out, func(a, b consumerStatus) int { return strings.Compare(a.Consumer, b.Consumer) })
	return out
}

// handleConsumers serves GET /llm_router/consumers on Caddy's admin
// endpoint: {"consumers": [...]}, each tracked consumer's plan, weight,
// limits and use (consumer.Usage). It holds no key.
func handleConsumers(w http.ResponseWriter, r *http.Request) error {
	return serveReport(w, r, func() any {
		return struct {
			Consumers []consumerStatus `json:"consumers"`
		}{liveConsumers()}
	})
}
