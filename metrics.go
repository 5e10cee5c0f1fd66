package llmrouter

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Prometheus metrics, in Caddy's metrics registry (scraped from the admin
// endpoint's /metrics). Every label value comes from the config (model
// group and deployment names) or from a fixed set (status codes, error
// classes), so cardinality is bounded by the config.
//
//	llm_router_requests_total{model_group, deployment, status}  requests answered
//	llm_router_attempts_total{deployment, class}                upstream attempts by error class
//	llm_router_failovers_total{deployment, class}               moves to another attempt after a failure of that class on deployment
//	llm_router_fallbacks_total{model_group, to}                  requests for model_group that went on to its fallback group to (the last one tried)
//	llm_router_upstream_latency_seconds{deployment}             until an answer was read (a stream: its first content)
//	llm_router_ttft_seconds{deployment}                         streams: until the first content event
//	llm_router_remaining{deployment, kind}                      requests/tokens left in the budget (-1 unknown), read at scrape
//	llm_router_queue_length{model_group}                        requests waiting for capacity
//	llm_router_queue_wait_seconds{model_group}                  how long requests waited in the queue (only those that waited)
//	llm_router_unpredicted_429_total{deployment}                upstream 429s the budget did not predict
//	llm_router_circuit_state{deployment}                        0 closed, 1 half-open, 2 open, read at scrape
//	llm_router_tokens_total{model_group, deployment, kind}      tokens the answers used, as their providers counted them: kind input, output, cached_input, cache_write, reasoning
//	llm_router_cost_usd_total{model_group, deployment}          what they cost, USD, at the deployment's prices
//	llm_router_hedges_total{model_group, deployment}            hedges started (hedge_after) on deployment
//	llm_router_hedge_wins_total{model_group, deployment}        hedges on deployment that answered first
//	llm_router_resumes_total{deployment, how}                   streams that broke on deployment and were taken up by another attempt: how continued or replayed
type metrics struct {
	requests  *prometheus.CounterVec
	attempts  *prometheus.CounterVec
	failovers *prometheus.CounterVec
	fallbacks *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	ttft      *prometheus.HistogramVec
	queue     *prometheus.GaugeVec
	queueWait *prometheus.HistogramVec
	surprises *prometheus.CounterVec
	tokens    *prometheus.CounterVec
	cost      *usdCounter
	resumes   *prometheus.CounterVec
	hedges    *prometheus.CounterVec
	hedgeWins *prometheus.CounterVec
	states    stateCollector
	consumers consumerMetrics // consumers_metrics.go
}

var (
	metricsOnce sync.Once
	theMetrics  *metrics
)

// queueBuckets span queue waits: 10 ms to 2 minutes.
var queueBuckets = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120}

// llmBuckets span LLM latencies: 50 ms to 2 minutes.
var llmBuckets = []float64{.05, .1, .25, .5, 1, 2, 4, 8, 15, 30, 60, 120}

// getMetrics builds the collectors once; they keep counting across reloads.
func getMetrics() *metrics {
	metricsOnce.Do(func() {
		const ns, sub = "llm", "router"
		theMetrics = &metrics{
			requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "requests_total", Help: "Requests answered, by model group, deployment that answered (empty if none) and HTTP status."},
				[]string{"model_group", "deployment", "status"}),
			attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "attempts_total", Help: "Upstream attempts, by deployment and error class."},
				[]string{"deployment", "class"}),
			failovers: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "failovers_total", Help: "Moves to another attempt after a failure, by the deployment that failed and the error class."},
				[]string{"deployment", "class"}),
			fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "fallbacks_total", Help: "Requests for a model group that went on to a fallback group, by the group asked for and the last group tried."},
				[]string{"model_group", "to"}),
			latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
				Name: "upstream_latency_seconds", Help: "Upstream attempt duration until the answer was read (streams: until the first content).",
				Buckets: llmBuckets}, []string{"deployment"}),
			ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
				Name: "ttft_seconds", Help: "Time to first content event of streamed answers.", Buckets: llmBuckets},
				[]string{"deployment"}),
			queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
				Name: "queue_length", Help: "Requests waiting for capacity, by model group."}, []string{"model_group"}),
			queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
				Name: "queue_wait_seconds", Help: "How long requests waited for capacity, by model group (only those that waited).",
				Buckets: queueBuckets}, []string{"model_group"}),
			surprises: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "unpredicted_429_total", Help: "Upstream 429s that the router's budget did not predict, by deployment."},
				[]string{"deployment"}),
			tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "tokens_total", Help: "Tokens the answers used, as their providers counted them, by model group, deployment and kind (input, output, cached_input, cache_write, reasoning; cached_input and cache_write are part of input, reasoning of output)."},
				[]string{"model_group", "deployment", "kind"}),
			cost: newUSDCounter(prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "cost_usd_total"),
				"What the answers cost, in USD at the deployment's cost_input, cost_cached_input and cost_output, by model group and deployment.",
				[]string{"model_group", "deployment"}, nil)),
			resumes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "resumes_total", Help: "Streams that broke after they began and were taken up by another attempt, by the deployment that broke and how (continued: the new attempt went on from the client's text; replayed: it answered afresh and its text began with the client's)."},
				[]string{"deployment", "how"}),
			hedges: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "hedges_total", Help: "Hedges started (hedge_after): a second attempt, on deployment, for a request whose first had produced no content in time, by model group and the hedge's deployment."},
				[]string{"model_group", "deployment"}),
			hedgeWins: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
				Name: "hedge_wins_total", Help: "Hedges that answered before the attempt they hedged, by model group and the hedge's deployment."},
				[]string{"model_group", "deployment"}),
			consumers: newConsumerMetrics(ns, sub),
		}
	})
	return theMetrics
}

// register adds the collectors to a config's registry; a registry that has
// them already (a reload) is fine.
func (m *metrics) register(reg prometheus.Registerer) error {
	collectors := []prometheus.Collector{m.requests, m.attempts, m.failovers, m.fallbacks, m.latency, m.ttft,
		m.queue, m.queueWait, m.surprises, m.tokens, m.cost, m.resumes, m.hedges, m.hedgeWins, &m.states}
	for _, c := range append(collectors, m.consumers.collectors()...) {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

func (m *metrics) request(group, deployment string, status int) {
	m.requests.WithLabelValues(group, deployment, strconv.Itoa(status)).Inc()
}

// usage counts what one answer of deployment in group used and cost.
func (m *metrics) usage(group, deployment string, u provider.Usage, cost float64) {
	for _, k := range []struct {
		kind string
		n    int64
	}{{"input", u.InputTokens}, {"output", u.OutputTokens}, {"cached_input", u.CachedInputTokens},
		{"cache_write", u.CacheWriteTokens}, {"cache_write_1h", u.CacheWrite1hTokens}, {"reasoning", u.ReasoningTokens}} {
		if k.n > 0 {
			m.tokens.WithLabelValues(group, deployment, k.kind).Add(float64(k.n))
		}
	}
	if cost > 0 {
		m.cost.add(group, deployment, cost)
	}
}

// fallback counts a request for group that went on to its fallback group
// to.
func (m *metrics) fallback(group, to string) {
	m.fallbacks.WithLabelValues(group, to).Inc()
}

// Attempt implements router.Observer.
func (m *metrics) Attempt(d *router.Deployment, class provider.Class, took time.Duration) {
	m.attempts.WithLabelValues(d.Name, class.String()).Inc()
	if took > 0 {
		m.latency.WithLabelValues(d.Name).Observe(took.Seconds())
	}
}

// FirstToken implements router.Observer.
func (m *metrics) FirstToken(d *router.Deployment, ttft time.Duration) {
	m.ttft.WithLabelValues(d.Name).Observe(ttft.Seconds())
}

// Failover implements router.Observer.
func (m *metrics) Failover(from *router.Deployment, class provider.Class) {
	m.failovers.WithLabelValues(from.Name, class.String()).Inc()
}

// Queue implements router.Observer.
func (m *metrics) Queue(g *router.Group, waiting int) {
	m.queue.WithLabelValues(g.Name).Set(float64(waiting))
}

// QueueWait implements router.Observer.
func (m *metrics) QueueWait(g *router.Group, waited time.Duration) {
	m.queueWait.WithLabelValues(g.Name).Observe(waited.Seconds())
}

// Hedge implements router.Observer.
func (m *metrics) Hedge(g *router.Group, d *router.Deployment) {
	m.hedges.WithLabelValues(g.Name, d.Name).Inc()
}

// HedgeWon implements router.Observer.
func (m *metrics) HedgeWon(g *router.Group, d *router.Deployment) {
	m.hedgeWins.WithLabelValues(g.Name, d.Name).Inc()
}

// Resume implements router.Observer.
func (m *metrics) Resume(from, _ *router.Deployment, how string) {
	m.resumes.WithLabelValues(from.Name, how).Inc()
}

// Unpredicted implements router.Observer.
func (m *metrics) Unpredicted(d *router.Deployment) {
	m.surprises.WithLabelValues(d.Name).Inc()
}

// stateCollector reports each live deployment's capacity state at scrape
// time, so the request path pays nothing for these gauges.
type stateCollector struct{}

var (
	remainingDesc = prometheus.NewDesc("llm_router_remaining",
		"Requests or tokens left in the deployment's budget: what its provider last stated, less what was sent since, full again after a reset (-1: unknown).",
		[]string{"deployment", "kind"}, nil)
	circuitDesc = prometheus.NewDesc("llm_router_circuit_state",
		"Circuit of the deployment: 0 closed, 1 half-open, 2 open.", []string{"deployment"}, nil)
	budgetDesc = prometheus.NewDesc("llm_router_budget_usd",
		"A deployment's or model group's budget, USD per its period.", []string{"scope", "name"}, nil)
	budgetSpentDesc = prometheus.NewDesc("llm_router_budget_spent_usd",
		"What was spent of a deployment's or model group's budget in its current window, USD.", []string{"scope", "name"}, nil)
)

// Describe implements prometheus.Collector.
func (*stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- remainingDesc
	ch <- circuitDesc
	ch <- budgetDesc
	ch <- budgetSpentDesc
}

// Collect implements prometheus.Collector.
func (*stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	seen := map[string]bool{}
	for _, d := range liveDeployments() {
		// Two sites may name different accounts alike ("openai/gpt-4o"):
		// one series per name, the first.
		if seen[d.dep.Name] {
			continue
		}
		seen[d.dep.Name] = true
		snap := d.dep.State.Snapshot(now)
		ch <- prometheus.MustNewConstMetric(remainingDesc, prometheus.GaugeValue, float64(snap.RemainingRequests), d.dep.Name, "requests")
		ch <- prometheus.MustNewConstMetric(remainingDesc, prometheus.GaugeValue, float64(snap.RemainingTokens), d.dep.Name, "tokens")
		// The gauge's values are the Circuit's: closed 0, half-open 1, open 2.
		ch <- prometheus.MustNewConstMetric(circuitDesc, prometheus.GaugeValue, float64(snap.Circuit), d.dep.Name)
		if b := d.dep.Spending.Report(now); b != nil {
			ch <- prometheus.MustNewConstMetric(budgetDesc, prometheus.GaugeValue, b.BudgetUSD, "deployment", d.dep.Name)
			ch <- prometheus.MustNewConstMetric(budgetSpentDesc, prometheus.GaugeValue, b.SpentUSD, "deployment", d.dep.Name)
		}
	}
	seen = map[string]bool{}
	for _, g := range liveGroupSpendings() {
		if b := g.spending.Report(now); b != nil && !seen[g.name] {
			seen[g.name] = true
			ch <- prometheus.MustNewConstMetric(budgetDesc, prometheus.GaugeValue, b.BudgetUSD, "model_group", g.name)
			ch <- prometheus.MustNewConstMetric(budgetSpentDesc, prometheus.GaugeValue, b.SpentUSD, "model_group", g.name)
		}
	}
}

// usdCounter is a counter of USD by model group and deployment whose sums
// are rounded to capacity.USDResolution at each add, so that they are
// scraped as the decimals they are (a prometheus.Counter's float64 sum
// of 0.1 and 0.2 is 0.30000000000000004).
type usdCounter struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	sums map[[2]string]float64
}

func newUSDCounter(desc *prometheus.Desc) *usdCounter {
	return &usdCounter{desc: desc, sums: map[[2]string]float64{}}
}

func (c *usdCounter) add(group, deployment string, usd float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := [2]string{group, deployment}
	c.sums[k] = capacity.RoundUSD(c.sums[k] + usd)
}

// Describe implements prometheus.Collector.
func (c *usdCounter) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *usdCounter) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.sums {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, v, k[0], k[1])
	}
}

// Interface guards
var (
	_ router.Observer      = (*metrics)(nil)
	_ prometheus.Collector = (*stateCollector)(nil)
	_ prometheus.Collector = (*usdCounter)(nil)
)
