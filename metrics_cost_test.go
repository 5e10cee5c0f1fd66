package llmrouter

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// llm_router_cost_usd_total sums what answers cost as the decimal it is:
// a counter's float64 sum of 0.1 and 0.2 USD would be scraped as
// 0.30000000000000004.
func TestCostMetricIsItsDecimal(t *testing.T) {
	m := getMetrics()
	reg := prometheus.NewRegistry()
	if err := m.register(reg); err != nil {
		t.Fatal(err)
	}
	u := provider.Usage{InputTokens: 1, OutputTokens: 1}
	m.usage("cost-metric-group", "p/cost-metric", u, 0.1)
	m.usage("cost-metric-group", "p/cost-metric", u, 0.2)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "llm_router_cost_usd_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["model_group"] == "cost-metric-group" && labels["deployment"] == "p/cost-metric" {
				if v := s.GetCounter().GetValue(); v != 0.3 {
					t.Errorf("expected 0.3 USD, got %v", v)
				}
				return
			}
		}
	}
	t.Error("expected a llm_router_cost_usd_total series for the group and deployment")
}
