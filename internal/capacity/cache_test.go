package capacity

import (
	"testing"
	"time"

	"github.com/llmrouter/caddy-llm-router/provider"
)

// A stated token window is charged what it counts of an attempt
// (provider.Window.Counts): Anthropic's output window max_tokens alone,
// its input window the prompt less what the deployment last reported
// held in its cache for the request's prefix (within PromptCacheTTL),
// its combined window both less the cache reads, any other window prompt
// plus max_tokens. An attempt of 10,100 prompt tokens (8,000 of them
// cached) and max_tokens 100 on a window with 3,000 left.
func TestATokenWindowIsChargedWhatItCounts(t *testing.T) {
	t0 := time.Date(2025, 8, 21, 12, 40, 0, 0, time.UTC)
	need := Need{Tokens: 10200, Output: 100, Prefixes: []uint64{7, 42}}
	for _, c := range []struct {
		name   string
		counts provider.Counts
		cached bool // the deployment reported the prefix held in its cache
		at     time.Duration
		fits   bool
	}{
		{"all", provider.CountsAll, true, 0, false},
		{"output", provider.CountsOutput, false, 0, true},
		{"uncached input, cached", provider.CountsUncachedInput, true, 0, true},
		{"uncached input, not reported", provider.CountsUncachedInput, false, 0, false},
		{"uncached input, expired", provider.CountsUncachedInput, true, PromptCacheTTL, false},
		{"uncached, cached", provider.CountsUncached, true, time.Minute, true},
		{"uncached input, one-hour cache", provider.CountsUncachedInput, true, 30 * time.Minute, true},
	} {
		s := NewState()
		ok := provider.NewObservation(provider.OK)
		ok.Tokens = provider.Window{Limit: 30000, Remaining: 3000, Reset: time.Hour, Counts: c.counts}
		s.Observe(t0, ok, DefaultPolicy)
		if c.cached {
			u := provider.Usage{InputTokens: 10100, CachedInputTokens: 2000, CacheWriteTokens: 6000}
			if c.at > PromptCacheTTL {
				u.CacheWrite1hTokens = 6000
			}
			s.RecordCache(t0, []uint64{3, 42}, u)
		}
		now := t0.Add(c.at)
		if at, _ := s.AvailableFor(now, need); !at.After(now) != c.fits {
			t.Errorf("%s: available at %v (now %v), expected fits %v", c.name, at, now, c.fits)
		}
	}
}

// Fleet mode spends of a shared token window what it counts of the
// attempt, as this instance does: max_tokens of an output window.
func TestTheFleetSpendsWhatATokenWindowCounts(t *testing.T) {
	s, f := NewState(), &fakeFleet{}
	s.SetFleet(f)
	ok := provider.NewObservation(provider.OK)
	ok.Tokens = provider.Window{Limit: 30000, Remaining: 29000, Reset: 10 * time.Second, Counts: provider.CountsOutput}
	s.Observe(t0, ok, DefaultPolicy)
	f.left = Budget{Requests: BudgetWindow{Limit: provider.Unknown}, Tokens: BudgetWindow{Limit: 30000, Remaining: 28900, Reset: t0.Add(10 * time.Second)}}
	if _, ok := s.AcquireFor(t0, Need{Tokens: 10100, Output: 100}); !ok || len(f.spends) != 1 {
		t.Fatalf("expected the attempt let through after one spend, got %v and %+v", ok, f.spends)
	}
	if n := f.spends[0].Tokens.N; n != 100 {
		t.Errorf("expected max_tokens (100) spent of the fleet's output window, got %d", n)
	}
}
