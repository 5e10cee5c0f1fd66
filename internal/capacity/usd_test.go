package capacity

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// What answers cost, summed, prints as the decimal it is: float64 sums
// of USD carry binary noise (0.1 + 0.2 is 0.30000000000000004) that the
// admin API, the status page and metrics would show.
func TestCostSumsPrintAsTheirDecimals(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := NewState()
	u := provider.Usage{InputTokens: 1, OutputTokens: 1}
	s.RecordUsage(now, u, 0.1)
	s.RecordUsage(now, u, 0.2)
	got, _ := json.Marshal(s.Usage(now))
	if !strings.Contains(string(got), `"total":{"answers":2,`) || strings.Count(string(got), `"cost_usd":0.3}`) != 2 {
		t.Errorf(`expected "cost_usd":0.3 in total and last_hour, got %s`, got)
	}

	b := NewSpending(SpendLimit{USD: 1, Period: time.Hour}, nil, "x")
	b.Add(now, 0.1)
	b.Add(now, 0.2)
	if r, _ := json.Marshal(b.Report(now)); !strings.Contains(string(r), `"spent_usd":0.3,`) {
		t.Errorf(`expected "spent_usd":0.3, got %s`, r)
	}
}

func TestRoundUSD(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{
		{0.1 + 0.2, 0.3}, {(0.7 + 5) / 1e6, 0.0000057}, {0, 0}, {1e-13, 0}, {12.5, 12.5}, {1e9 + 0.5, 1e9 + 0.5},
	} {
		if got := RoundUSD(tc.in); got != tc.want {
			t.Errorf("RoundUSD(%v): expected %v, got %v", tc.in, tc.want, got)
		}
	}
}
