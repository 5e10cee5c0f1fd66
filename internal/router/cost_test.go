package router

import (
	"testing"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// An answer's cost is the decimal its tokens and prices make: (0.7 + 5)
// / 1e6 in float64 is 0.0000057000000000000005, which the admin API, the
// status page and metrics would print.
func TestCostIsItsDecimal(t *testing.T) {
	d := &Deployment{CostInput: 0.7, CostOutput: 5}
	if got := d.Cost(provider.Usage{InputTokens: 1, OutputTokens: 1}); got != 0.0000057 {
		t.Errorf("expected 0.0000057 USD, got %v", got)
	}
}
