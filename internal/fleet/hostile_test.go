package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// Hostile values in every key the router reads (a key of the wrong type, a
// stamp or score a year ahead, counts that are no number or huge), none
// with an expiry: the router neither fails nor takes Redis for
// unreachable, it replaces or bounds what it writes again, and the keys of
// a deployment and of a queue expire.
func TestHostileValuesInEveryKey(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, 30*time.Millisecond, 0, 0)
		b := a.store.bindings[DeploymentID(testIdentity)]
		q := a.store.Queue("g", []string{testIdentity})
		opt, _ := redis.ParseURL(url)
		c := redis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		ahead := float64(time.Now().Add(365 * 24 * time.Hour).UnixMilli())
		writes := []error{
			c.Set(ctx, b.stateKey, "not a hash", 0).Err(),
			c.HSet(ctx, b.budgetKey, "r_left", "9e99", "r_reset", time.Now().Add(time.Second).UnixMilli()).Err(),
			c.Set(ctx, b.logKey, "not a log", 0).Err(),
			c.LPush(ctx, b.probeKey, "not a claim").Err(),
			c.Set(ctx, q.waiting, "not a queue", 0).Err(),
			c.ZAdd(ctx, q.expires, redis.Z{Score: ahead, Member: "ghost-0-1"}).Err(),
			c.ZAdd(ctx, q.living, redis.Z{Score: ahead, Member: "ghost"}).Err(),
			c.Set(ctx, q.tokens, "not a hash", 0).Err(),
			c.LPush(ctx, a.store.ownerKey("resp_1"), "x").Err(),
			c.LPush(ctx, a.store.pendingKey("resp_1"), "x").Err(),
		}
		for _, err := range writes {
			if err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, 5*time.Second, "the store up", a.store.Up)
		time.Sleep(150 * time.Millisecond) // several polls of the hostile state
		ok := provider.NewObservation(provider.OK)
		ok.Requests = provider.Window{Limit: 10, Remaining: 0, Reset: 5 * time.Second} // written at once
		a.state.Observe(time.Now(), ok, capacity.DefaultPolicy)
		bu := capacity.Budget{Requests: statedWindow(10, 5*time.Second), Tokens: capacity.BudgetWindow{Limit: -1}}
		served := 0
		for range 20 {
			if wait, _, err := b.Spend(bu); err != nil {
				t.Errorf("spend: %v", err)
			} else if wait == 0 {
				served++
			}
		}
		if served > 10 {
			t.Errorf("expected a huge count bounded by the window's limit (10), served %d", served)
		}
		if _, err := b.ClaimProbe(); err != nil {
			t.Errorf("probe: %v", err)
		}
		if wait, err := b.Reserve(10, 0, 1); err != nil || wait != 0 {
			t.Errorf("reserve: %v, %v", wait, err)
		}
		member, ahead2, _, err := q.Join(0, 0, time.Now(), 1, time.Second, 10, true)
		if err != nil || ahead2 != 0 {
			t.Errorf("queue: expected the first place in a queue replaced, got %d, %v", ahead2, err)
		} else if _, _, err := q.Ahead(member, true); err != nil {
			t.Errorf("queue: %v", err)
		}
		a.store.Owner("resp_1")
		_, _, _ = a.store.ClaimPending("resp_1")
		time.Sleep(150 * time.Millisecond)
		if n := a.obs.count(a.obs.fallbacks); n != 0 {
			t.Errorf("expected no fallback to local state, got %d", n)
		}
		a.obs.mu.Lock()
		ups := append([]bool(nil), a.obs.ups...)
		a.obs.mu.Unlock()
		for _, up := range ups {
			if !up {
				t.Errorf("expected the store never taken for unreachable, ups %v (errors %v)", ups, a.obs.errors)
				break
			}
		}
		if n := a.logs.FilterMessageSnippet("malformed key replaced").FilterField(zap.String("key", b.stateKey)).Len(); n != 1 {
			t.Errorf("expected the state of the wrong type logged once as malformed, logged %d times", n)
		}
		if !a.store.Up() {
			t.Errorf("expected the store up")
		}
		for _, k := range []string{b.stateKey, b.budgetKey, b.logKey, b.probeKey, q.waiting, q.expires, q.living, q.tokens} {
			if ttl := c.PTTL(ctx, k).Val(); ttl == -1 || ttl > 2*time.Hour {
				t.Errorf("%s: expected an expiry within the longest window, PTTL %v", k[len(keyPrefix(t)):], ttl)
			}
		}
	})
}
