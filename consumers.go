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
	"unicode"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/api"
	"github.com/llmrouter/caddy-llm-router/internal/consumer"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
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
// the limit admits it again (for concurrent, and a budget held by the
// requests in flight, when the first of those is expected to end; none
// when unknown), HeaderLimit "consumer" and HeaderConsumerLimit, and
// x-should-retry: false unless that wait is known and at most 60 s
// (maxSDKRetryAfter: then the SDKs retry after it); one for a model group
// outside its plan 403, with x-should-retry: false; both in the client's
// format, before any provider is asked.
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
	pooled   bool // registry counts in consumerCounts' entry
}

// ConsumerPlan is a plan's limits and weight, for each of its consumers.
type ConsumerPlan struct {
	// Weight is its consumers' share of scarce capacity: when several
	// consumers' requests wait for a model group's deployments at the same
	// priority, each gets at least weight / (the waiting consumers'
	// weights) of the requests served (weighted fair queueing); one that
	// asks for less leaves the rest to the others. Fleet mode orders its
	// queue by arrival alone. Default: 1; 0 or from 0.001 to 1000.
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
	// and prices): each request holds its worst case (prompt and
	// max_tokens at the dearest deployment that may serve it) until its
	// answer settles it, and is admitted while its window's spend plus
	// the holds of those in flight is below it. Default: none.
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
	if c.active() {
		v, _, err := consumerCounts.LoadOrNew(consumerCountsKey, func() (caddy.Destructor, error) {
			return pooledCounts{consumer.NewCounts()}, nil
		})
		if err != nil {
			return err
		}
		reg.ShareCounts(v.(pooledCounts).Counts)
		c.pooled = true
	}
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

// consumerCounts keeps the consumers' use of their plans across config
// reloads, as states and spendings keep the deployments' windows and the
// budgets': one consumer.Counts a process, under consumerCountsKey, so
// that a consumer is counted as one whichever llm_router handler it
// asks.
var consumerCounts = caddy.NewUsagePool()

const consumerCountsKey = "consumers"

type pooledCounts struct{ *consumer.Counts }

func (pooledCounts) Destruct() error { return nil }

// cleanupConsumers gives back the pooled counts (once).
func (h *Handler) cleanupConsumers() {
	if h.Consumers.pooled {
		_, _ = consumerCounts.Delete(consumerCountsKey)
		h.Consumers.pooled = false
	}
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
		known, key, ok := c.keys.LookupHeader(r.Header)
		consumer.StripKey(r.Header)
		if who == "" {
			if who = known; !ok {
				why := "no API key: send one as Authorization: Bearer <key> or x-api-key: <key>"
				if key != "" {
					why = "the API key is not one of this router's keys"
				}
				h.metrics.consumerLimited(c.labels.of(""), "key")
				return "", r, api.Errorf(http.StatusUnauthorized, api.Unauthorized, "", "%s", why)
			}
		}
	}
	if s := servedOf(r); s != nil { // served.go: one log field and one placeholder provider for all
		s.identified, s.consumer = true, who
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
// admission, or the 403 or 429 to answer (with HeaderLimit set on w); a
// count of tokens is checked against the plan's groups alone. It
// sets the request's consumer and weight for the queue's fair share, and
// the groups its plan allows (its fallback groups stop at the others).
func (h *Handler) admit(w http.ResponseWriter, who string, g *router.Group, req *router.Request) (*admission, *api.Error) {
	group := g.Name
	c := &h.Consumers
	if c.active() { // a weight: the fleet's queue orders by fair share (router.FleetQueue)
		req.Consumer, req.Weight = who, c.registry.Weight(who)
	}
	if p := c.registry.PlanOf(who); p != nil {
		req.Groups = p.Groups
	}
	a := &admission{h: h}
	if c.active() {
		a.label = c.labels.of(who)
	}
	var t *consumer.Ticket
	ref := c.registry.Allows(who, group)
	if !req.CountTokens && ref == nil { // a count of tokens spends no limit (docs/consumers.md)
		worst := 0.0
		if p := c.registry.PlanOf(who); p != nil && p.BudgetUSD > 0 {
			worst = g.WorstCost(req) // held of the budget until the answer settles it
		}
		t, ref = c.registry.AdmitHolding(h.router.Clock.Now(), who, group, req.Tokens, worst)
	}
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
	e.Retryable = ref.RetryAfter > 0 && ref.RetryAfter <= maxSDKRetryAfter
	return nil, e
}

// maxSDKRetryAfter is the longest Retry-After the official SDKs sleep
// before their own retry of a 429: openai-node's retryRequest (src/client.ts)
// takes one of at most 60 s, and retries a longer or missing one after
// its own backoff (0.5 s, then 1 s); anthropic-sdk-typescript sleeps any.
// A consumer's 429 whose wait is known and no longer (a concurrent slot
// expected free, the minute's next free second, a budget held by
// requests in flight) leaves them their retry (no x-should-retry), which
// then comes when the limit admits it; a longer or unknown one (a budget
// window that renews in hours) says x-should-retry: false.
const maxSDKRetryAfter = 60 * time.Second

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

// hold is what ends a's hold on its consumer's limits later than its
// request (a background job's end: kept), its request having cost usd
// and what it is given more (USD); nil when it holds none.
func (a *admission) hold(usd float64) func(more float64) {
	if a == nil || a.ticket == nil {
		return nil
	}
	t, clock := a.ticket, a.h.router.Clock
	return func(more float64) { t.Done(clock.Now(), usd+more) }
}

// kept leaves a's hold to what hold returned: done no longer ends it.
func (a *admission) kept() {
	if a != nil {
		a.ticket = nil
	}
}

// spendConsumer charges what an answer found done after its request
// ended cost (a background response's usage u, usd) to the budget of its
// job j's consumer, ending the job's hold on its limits, and counts it in
// the consumer metrics.
func (h *Handler) spendConsumer(j *backgroundJob, u provider.Usage, usd float64) {
	c := &h.Consumers
	if !c.active() {
		return
	}
	who := j.who
	if !j.done(usd) {
		c.registry.Spend(h.router.Clock.Now(), who, usd)
	}
	if h.metrics != nil {
		label := c.labels.of(who)
		h.metrics.consumerTokens(label, u.InputTokens, u.OutputTokens)
		if usd > 0 {
			h.metrics.consumers.cost.WithLabelValues(label).Add(usd)
		}
	}
}

// errorAPI is the client API that writes an error of r: its path's own,
// else unknownAPI's (GET .../models, a pass_through path: Messages for a
// client that speaks it, else Chat).
func errorAPI(r *http.Request) api.API {
	if a := api.ForPath(r.URL.Path); a != nil {
		return a
	}
	return unknownAPI(r)
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
// those seen first, up to this many; the others are counted as "other",
// and so are names that are no label (labelable).
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

// maxConsumerLabel bounds a consumer label's length, in bytes.
const maxConsumerLabel = 128

// labelable reports whether who may be a label of its own: valid UTF-8
// (a label must be, or the metrics panic), without control characters,
// maxConsumerLabel bytes at most (a header's value may be any of these).
func labelable(who string) bool {
	return len(who) <= maxConsumerLabel && utf8.ValidString(who) && !strings.ContainsFunc(who, unicode.IsControl)
}

func newConsumerLabels(named []string) *consumerLabels {
	l := &consumerLabels{max: DefaultMaxConsumerLabels, seen: map[string]bool{}}
	for _, n := range slices.Compact(slices.Sorted(slices.Values(named))) {
		if len(l.seen) < l.max && labelable(n) {
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
	if l == nil || !labelable(who) {
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

// liveConsumers lists the tracked consumers of every live handler (the
// named ones that asked of late, on a plan or on none), each at its
// router's clock, sorted by name.
// The reports are taken after live's lock is released: in fleet mode a
// report reads the fleet's budgets from Redis (consumer.FleetReporter).
func liveConsumers() []consumerStatus {
	type source struct {
		reg *consumer.Registry
		now time.Time
	}
	var sources []source
	live.Lock()
	seen := map[*consumer.Counts]bool{}
	for h := range live.handlers {
		reg := h.Consumers.registry
		if counts := reg.Counts(); counts != nil && !seen[counts] { // handlers share them (consumerCounts)
			seen[counts] = true
			sources = append(sources, source{reg, h.router.Clock.Now()})
		}
	}
	live.Unlock()
	out := []consumerStatus{}
	for _, src := range sources {
		out = append(out, src.reg.Report(src.now)...)
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
