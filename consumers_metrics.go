package llmrouter

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// consumerMetrics are the per-consumer metrics, their consumer label
// bounded by DefaultMaxConsumerLabels (consumerLabels: the others are
// "other", requests without a consumer "anonymous"):
//
//	llm_router_consumer_requests_total{consumer, status}        requests answered, by HTTP status (the consumer's 401, 403 and 429 included)
//	llm_router_consumer_tokens_total{consumer, kind}            tokens the answers used, as their providers counted them: kind input, output
//	llm_router_consumer_cost_usd_total{consumer}                what they cost, USD, at the deployments' prices
//	llm_router_consumer_queue_wait_seconds{consumer}            how long requests waited in the queue (only those that waited)
//	llm_router_consumer_limited_total{consumer, limit}          requests refused by the consumer's plan: limit rpm, tpm, concurrent, budget, groups; key (a 401)
type consumerMetrics struct {
	requests, tokens, cost, limited *prometheus.CounterVec
	queueWait                       *prometheus.HistogramVec
}

func newConsumerMetrics(ns, sub string) consumerMetrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
	}
	return consumerMetrics{
		requests: counter("consumer_requests_total", "Requests answered, by consumer (at most 100 named; the others \"other\") and HTTP status.", "consumer", "status"),
		tokens:   counter("consumer_tokens_total", "Tokens the answers used, as their providers counted them, by consumer and kind (input, output).", "consumer", "kind"),
		cost:     counter("consumer_cost_usd_total", "What the answers cost, in USD at the deployments' prices, by consumer.", "consumer"),
		limited:  counter("consumer_limited_total", "Requests refused by their consumer's plan, by consumer and limit (rpm, tpm, concurrent, budget, groups; key: no or an unknown API key).", "consumer", "limit"),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "consumer_queue_wait_seconds", Help: "How long requests waited for capacity, by consumer (only those that waited).",
			Buckets: queueBuckets}, []string{"consumer"}),
	}
}

func (c consumerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{c.requests, c.tokens, c.cost, c.limited, c.queueWait}
}

// consumerLimited counts a request of consumer label refused by limit.
func (m *metrics) consumerLimited(label, limit string) {
	m.consumers.limited.WithLabelValues(label, limit).Inc()
	status := "429"
	switch limit {
	case "key":
		status = "401"
	case "groups":
		status = "403"
	}
	m.consumers.requests.WithLabelValues(label, status).Inc()
}

// consumerRequest counts an admitted request of consumer label: its
// status, cost and wait in the queue.
func (m *metrics) consumerRequest(label string, status int, cost float64, waited time.Duration) {
	m.consumers.requests.WithLabelValues(label, strconv.Itoa(status)).Inc()
	if cost > 0 {
		m.consumers.cost.WithLabelValues(label).Add(cost)
	}
	if waited > 0 {
		m.consumers.queueWait.WithLabelValues(label).Observe(waited.Seconds())
	}
}

// consumerTokens counts what an answer of consumer label used.
func (m *metrics) consumerTokens(label string, input, output int64) {
	if input > 0 {
		m.consumers.tokens.WithLabelValues(label, "input").Add(float64(input))
	}
	if output > 0 {
		m.consumers.tokens.WithLabelValues(label, "output").Add(float64(output))
	}
}
