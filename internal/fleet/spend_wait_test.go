package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/internal/router"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Two instances share a group budget of $1 per hour. Instance a's demand
// leases it a slice of the budget, which it does not spend; a request on
// instance b whose worst case is $0.95 does not fit what the
// budget has unleased, but fits once a's slice comes back (a gives back an
// idle slice within two idle checks of 5 s). The request waits for it within its deadline and
// is served, instead of a 429 until the budget renews in an hour (the
// other instance's slice was counted as spent).
func TestARefusalWaitsForAnotherInstancesSlice(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		eventually(t, 5*time.Second, "the stores up", func() bool { return a.store.Up() && b.store.Up() })
		p := &heldProvider{open: make(chan struct{})}
		close(p.open)
		limit := capacity.SpendLimit{USD: 1, Period: time.Hour}
		ga, gb := holdInstance(a, p), holdInstance(b, p)
		ga.Spending = capacity.NewSpending(limit, a.store, "budget:group|wait")
		gb.Spending = capacity.NewSpending(limit, b.store, "budget:group|wait")
		now := time.Now()
		for range 50 { // a's demand: $0.50 a second, held and given back unspent
			h, ok, _ := ga.Spending.Hold(now, 0.01)
			if !ok {
				t.Fatal("expected a's holds to fit")
			}
			ga.Spending.Settle(now, h, 0)
		}
		time.Sleep(200 * time.Millisecond) // its renewals land
		if fits, _ := gb.Spending.Fits(time.Now(), 0.95); fits {
			t.Fatal("expected a's slice to leave less than $0.95 unleased (the test needs it)")
		}
		rt := router.New()
		rt.Deadline = 20 * time.Second
		req := &router.Request{Request: &provider.Request{Format: provider.Chat, Choices: 1,
			Body: []byte(`{"model":"paid","max_tokens":18980,"messages":[{"role":"user","content":"hi"}]}`)},
			Tokens: 19080, PromptTokens: 100, OutputTokens: 18980}
		start := time.Now()
		res := rt.ServeGroup(context.Background(), gb, req)
		took := time.Since(start)
		status := res.Status
		if e, ok := res.Err.(*router.Error); ok {
			status = e.Status
		}
		if status != 200 || p.calls.Load() != 1 {
			t.Errorf("expected the $0.95 request served once a's idle slice came back, got %d after %v (%d upstream calls, %v)", status, took, p.calls.Load(), res.Err)
		}
		if took > 12*time.Second {
			t.Errorf("expected it served within two idle checks (5 s each) of a's slice going idle, took %v", took)
		}
	})
}
