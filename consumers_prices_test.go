package llmrouter

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// A plan's budget counts what answers cost at the deployments' prices: a
// deployment without cost_input and cost_output costs 0, so the load warns
// of each plan with a budget whose groups have one (the docs' two-team
// example had none, and its budget never bound), naming the plan and the
// deployments, and stays quiet when every deployment the plan may use is
// priced.
func TestABudgetOnUnpricedDeploymentsIsWarnedOf(t *testing.T) {
	for _, c := range []struct {
		name, plan string
		warned     bool
	}{
		{"all groups", `"team-b": {"budget": {"usd": 5, "per": 86400000000000}}`, true},
		{"smart only", `"team-b": {"groups": ["smart"], "budget": {"usd": 5, "per": 86400000000000}}`, true},
		{"priced fast only", `"team-b": {"groups": ["fast"], "budget": {"usd": 5, "per": 86400000000000}}`, false},
		{"no budget", `"team-b": {"rpm": 5}`, false},
	} {
		h, _ := consumersHandler(t, newSeenUpstream(t), `"consumer": "{http.request.header.X-Team}", "plans": {`+c.plan+`}`)
		core, logs := observer.New(zapcore.WarnLevel)
		h.logger = zap.New(core)
		h.warnUnpricedBudgets()
		got := logs.FilterMessageSnippet("budget").All()
		if !c.warned {
			if len(got) != 0 {
				t.Errorf("%s: expected no warning, got %v", c.name, got[0].ContextMap())
			}
			continue
		}
		if len(got) != 1 {
			t.Fatalf("%s: expected one warning, got %d", c.name, len(got))
		}
		f := got[0].ContextMap()
		if f["plan"] != "team-b" || !strings.Contains(got[0].Message, "cost_input") || !equalAny(f["deployments"], []string{"oa/m2"}) {
			t.Errorf("%s: expected plan team-b, deployments [oa/m2] and a message naming cost_input, got %q %v", c.name, got[0].Message, f)
		}
	}
}

func equalAny(v any, want []string) bool {
	s, ok := v.([]any)
	if !ok || len(s) != len(want) {
		return false
	}
	for i := range s {
		if s[i] != want[i] {
			return false
		}
	}
	return true
}
