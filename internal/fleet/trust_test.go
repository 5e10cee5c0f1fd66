package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A circuit stamped a year ahead (what an instance whose clock runs ahead
// publishes) is not trusted: an instance that reads it keeps the deployment
// usable, and the next real 429 replaces it in the store and reaches the
// fleet.
func TestFutureCircuitIsNotTrusted(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		key := a.store.bindings[DeploymentID(testIdentity)].stateKey
		ahead := time.Now().Add(365 * 24 * time.Hour)
		hostile := fmt.Sprintf(`{"at":%d,"until":%d,"reason":"rate_limited","failures":9}`,
			ahead.UnixMilli(), ahead.Add(30*time.Second).UnixMilli())
		opt, _ := redis.ParseURL(url)
		c := redis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		if err := c.HSet(ctx, key, partCircuit, hostile, partCircuit+"_at", ahead.UnixMilli(),
			partCircuit+"_exp", ahead.Add(30*time.Second).UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
		b := newInstance(t, url, 20*time.Millisecond, 0, 0)
		waitSubscribed(t, url, 2)
		time.Sleep(200 * time.Millisecond) // several polls of the hostile value
		if at, why := b.state.AvailableAt(time.Now(), 0); at.After(time.Now().Add(time.Second)) {
			t.Fatalf("expected the deployment usable at b despite a circuit stamped a year ahead, available at %v (%s)", at, why)
		}
		now := time.Now()
		a.state.Observe(now, rateLimited(30*time.Second), capacity.DefaultPolicy)
		eventually(t, 2*time.Second, "b to learn a's real 429", func() bool {
			at, why := b.state.AvailableAt(time.Now(), 0)
			return at.Sub(now) > 25*time.Second && at.Sub(now) < 31*time.Second && why == provider.RateLimited
		})
		if ttl := c.PTTL(ctx, key).Val(); ttl > 31*time.Second {
			t.Errorf("expected the state to expire with the real 30 s reset, TTL %v", ttl)
		}
	})
}

// Hostile values in the declared-limits keys (an entry without its tokens,
// one scored a year ahead, a key of the wrong type, a token sum that is not
// a number, keys without expiry) are replaced, logged once as such, and never
// taken as an outage: two instances still start 10 attempts between them
// for rpm 10, and the keys expire.
func TestMalformedDeclaredLimitsAreReplaced(t *testing.T) {
	year := 365 * 24 * time.Hour
	hostile := map[string]func(ctx context.Context, c *redis.Client, log, tokens string) error{
		"entry without tokens": func(ctx context.Context, c *redis.Client, log, tokens string) error {
			return c.ZAdd(ctx, log, redis.Z{Score: float64(time.Now().Add(-10 * time.Second).UnixMilli()), Member: "garbage"}).Err()
		},
		"entry a year ahead": func(ctx context.Context, c *redis.Client, log, tokens string) error {
			return c.ZAdd(ctx, log, redis.Z{Score: float64(time.Now().Add(year).UnixMilli()), Member: "ahead:1"}).Err()
		},
		"wrong type": func(ctx context.Context, c *redis.Client, log, tokens string) error {
			return c.Set(ctx, log, "not a sorted set", 0).Err()
		},
		"token sum not a number": func(ctx context.Context, c *redis.Client, log, tokens string) error {
			return c.Set(ctx, tokens, "many", 0).Err()
		},
	}
	for name, write := range hostile {
		t.Run(name, func(t *testing.T) {
			backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
				a, b := newInstance(t, url, time.Hour, 10, 0), newInstance(t, url, time.Hour, 10, 0)
				id := DeploymentID(testIdentity)
				ba, bb := a.store.bindings[id], b.store.bindings[id]
				opt, _ := redis.ParseURL(url)
				c := redis.NewClient(opt)
				defer c.Close()
				ctx := context.Background()
				if err := write(ctx, c, ba.logKey, ba.tokensKey); err != nil {
					t.Fatal(err)
				}
				counted := 0
				for i := 0; i < 20; i++ {
					bi := []*binding{ba, bb}[i%2]
					wait, err := bi.Reserve(10, 0, 1)
					if err != nil {
						t.Fatalf("attempt %d: expected the malformed value replaced, got %v", i, err)
					}
					if wait == 0 {
						counted++
					}
				}
				if counted != 10 {
					t.Errorf("expected 10 attempts started fleet-wide for rpm 10, got %d", counted)
				}
				if n := a.obs.count(a.obs.fallbacks) + b.obs.count(b.obs.fallbacks); n != 0 {
					t.Errorf("expected no fallback to local state, got %d", n)
				}
				logged := a.logs.FilterMessageSnippet("malformed").Len() + b.logs.FilterMessageSnippet("malformed").Len()
				if logged != 1 {
					t.Errorf("expected the malformed value logged once, got %d lines", logged)
				}
				for _, key := range []string{ba.logKey, ba.tokensKey} {
					if ttl := c.PTTL(ctx, key).Val(); ttl < 0 || ttl > time.Minute+declaredUse {
						t.Errorf("expected %s to expire within the window (and a grant's use), PTTL %v", key, ttl)
					}
				}
			})
		})
	}
}

// A probe claim without expiry (or one longer than probeTTL) would keep a
// recovered deployment half-open and unused for good: the next claim bounds
// it to probeTTL and logs it once, and the claim is taken once that passes.
func TestProbeClaimWithoutExpiryExpires(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		ba := a.store.bindings[DeploymentID(testIdentity)]
		opt, _ := redis.ParseURL(url)
		c := redis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		if err := c.Set(ctx, ba.probeKey, "stuck", 0).Err(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if ok, err := ba.ClaimProbe(); ok || err != nil {
				t.Fatalf("expected the claim held (not an outage), got %v %v", ok, err)
			}
		}
		if ttl := c.PTTL(ctx, ba.probeKey).Val(); ttl <= 0 || ttl > probeTTL {
			t.Errorf("expected the claim to expire within %v, PTTL %v", probeTTL, ttl)
		}
		if n := a.logs.FilterMessageSnippet("malformed").Len(); n != 1 {
			t.Errorf("expected the claim without expiry logged once, got %d lines", n)
		}
		if m != nil {
			m.FastForward(probeTTL + time.Second)
			if ok, err := ba.ClaimProbe(); !ok || err != nil {
				t.Errorf("expected the claim taken once its bound passed, got %v %v", ok, err)
			}
		}
	})
}

// An operator's reset acts fleet-wide even at an instance that had not
// learned what the fleet holds (a notification it missed): the reset
// replaces the fleet's circuit, and an instance that learned it closes.
func TestResetActsFleetWide(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		b := newInstance(t, url, time.Hour, 0, 0)
		p := newInstance(t, url, 20*time.Millisecond, 0, 0)
		waitSubscribed(t, url, 2)
		key := b.store.bindings[DeploymentID(testIdentity)].stateKey
		now := time.Now()
		open := fmt.Sprintf(`{"at":%d,"until":%d,"reason":"rate_limited","failures":1}`,
			now.UnixMilli(), now.Add(30*time.Second).UnixMilli())
		opt, _ := redis.ParseURL(url)
		c := redis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		if err := c.HSet(ctx, key, partCircuit, open, partCircuit+"_at", now.UnixMilli(),
			partCircuit+"_exp", now.Add(30*time.Second).UnixMilli()).Err(); err != nil {
			t.Fatal(err)
		}
		eventually(t, 2*time.Second, "p to learn the fleet's circuit", func() bool {
			at, _ := p.state.AvailableAt(time.Now(), 0)
			return at.Sub(now) > 25*time.Second
		})
		time.Sleep(5 * time.Millisecond)
		b.state.Reset(time.Now())
		eventually(t, 2*time.Second, "p to learn b's reset", func() bool {
			at, _ := p.state.AvailableAt(time.Now(), 0)
			return !at.After(time.Now())
		})
	})
}

// Stamps and expiries that are not numbers in a deployment's state hash
// are replaced by the next write, not taken as an outage.
func TestMalformedStateStampsAreReplaced(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		waitSubscribed(t, url, 2)
		key := a.store.bindings[DeploymentID(testIdentity)].stateKey
		opt, _ := redis.ParseURL(url)
		c := redis.NewClient(opt)
		defer c.Close()
		ctx := context.Background()
		if err := c.HSet(ctx, key, partCircuit, "{", partCircuit+"_at", "soon", partCircuit+"_exp", "never",
			partDrain+"_exp", "later").Err(); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		a.state.Observe(now, rateLimited(30*time.Second), capacity.DefaultPolicy)
		eventually(t, 2*time.Second, "b to learn a's 429", func() bool {
			at, _ := b.state.AvailableAt(time.Now(), 0)
			return at.Sub(now) > 25*time.Second
		})
		if n := a.obs.count(a.obs.errors); n != 0 {
			t.Errorf("expected no failed Redis operation, got %d", n)
		}
		if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 31*time.Second {
			t.Errorf("expected the state to expire with the 30 s reset, PTTL %v", ttl)
		}
	})
}

// Hostile values in a shared window's key (a count or a reset that is no
// number, a reset a year ahead, an instance's mark that is no time, a key
// of another type) are not the fleet's count: the spend script replaces
// them with the instance's own window and starts the attempt, never
// failing (which took the store for unreachable: each instance alone).
func TestMalformedSharedWindowsAreReplaced(t *testing.T) {
	ahead := time.Now().Add(365 * 24 * time.Hour).UnixMilli()
	hostile := map[string]func(ctx context.Context, c *redis.Client, key string) error{
		"count not a number": func(ctx context.Context, c *redis.Client, key string) error {
			return c.HSet(ctx, key, "r_left", "many", "r_reset", "soon").Err()
		},
		"reset a year ahead": func(ctx context.Context, c *redis.Client, key string) error {
			return c.HSet(ctx, key, "r_left", 0, "r_reset", ahead).Err()
		},
		"mark not a time": func(ctx context.Context, c *redis.Client, key string) error {
			return c.HSet(ctx, key, "o:ghost", "yesterday").Err()
		},
		"wrong type": func(ctx context.Context, c *redis.Client, key string) error {
			return c.Set(ctx, key, "not a hash", 0).Err()
		},
	}
	for name, write := range hostile {
		t.Run(name, func(t *testing.T) {
			backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
				a := newInstance(t, url, time.Hour, 0, 0)
				ba := a.store.bindings[DeploymentID(testIdentity)]
				opt, _ := redis.ParseURL(url)
				c := redis.NewClient(opt)
				defer c.Close()
				ctx := context.Background()
				if err := write(ctx, c, ba.budgetKey); err != nil {
					t.Fatal(err)
				}
				w := capacity.BudgetWindow{Limit: 10, Remaining: 10, Reset: time.Now().Add(10 * time.Second), Span: 10 * time.Second, N: 1}
				wait, left, err := ba.Spend(capacity.Budget{Requests: w, Tokens: capacity.BudgetWindow{Limit: -1}})
				if err != nil || wait != 0 {
					t.Fatalf("expected the attempt started on the instance's window, got wait %v, %v", wait, err)
				}
				if left.Requests.Remaining != 9 || left.Requests.Reset.After(time.Now().Add(11*time.Second)) {
					t.Errorf("expected 9 left of the instance's window, resetting within 10 s, got %+v", left.Requests)
				}
				if n := a.obs.count(a.obs.fallbacks); n != 0 {
					t.Errorf("expected no fallback to local state, got %d", n)
				}
			})
		})
	}
}
