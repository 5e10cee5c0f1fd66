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
