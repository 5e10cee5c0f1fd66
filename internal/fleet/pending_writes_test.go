package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

// A remaining count going down waits for the next paced write (a poll
// interval of an hour here); Close writes it before the store ends, so the
// fleet sees the count the instance learned last (9, the first write,
// before).
func TestPacedWriteFlushedOnClose(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a := newInstance(t, url, time.Hour, 0, 0)
		h := &evalHook{}
		a.store.client.AddHook(h)
		eventually(t, 5*time.Second, "the store up", a.store.Up)
		ok := provider.NewObservation(provider.OK)
		ok.Requests = provider.Window{Limit: 10, Remaining: 9, Reset: time.Minute}
		a.state.Observe(time.Now(), ok, capacity.DefaultPolicy)
		eventually(t, time.Second, "the first window written", func() bool { return h.evals.Load() >= 1 })
		time.Sleep(10 * time.Millisecond) // learned a millisecond later at least: the store keeps the newer part
		ok.Requests = provider.Window{Limit: 10, Remaining: 5, Reset: time.Minute}
		a.state.Observe(time.Now(), ok, capacity.DefaultPolicy) // a count going down: paced
		key := a.store.bindings[DeploymentID(testIdentity)].stateKey
		opt, _ := redis.ParseURL(url)
		c := redis.NewClient(opt)
		defer c.Close()
		a.store.Close()
		str, err := c.HGet(context.Background(), key, partRequests).Result()
		var sh capacity.Shared
		decodePart(&sh, partRequests, str)
		if err != nil || sh.Requests.Remaining != 5 {
			t.Errorf("expected the count learned last (5) written at Close, Redis has %d (%v)", sh.Requests.Remaining, err)
		}
	})
}

// A response's owner remembered while Redis is cut off is kept and
// written once Redis answers again (it was dropped: a continuation on
// another instance then found no owner).
func TestOwnerRememberedDuringOutageWrittenAfter(t *testing.T) {
	url := realRedisURL(t)
	opt, _ := redis.ParseURL(url)
	p := newCutProxy(t, opt.Addr)
	a := newInstance(t, "redis://"+p.l.Addr().String()+"/"+itoa(opt.DB), 50*time.Millisecond, 0, 0)
	eventually(t, 5*time.Second, "the store up", a.store.Up)
	p.setCut(true)
	eventually(t, 5*time.Second, "the store down", func() bool { return !a.store.Up() })
	a.store.RememberOwner("resp_out", testIdentity, "p/up", "", time.Hour)
	time.Sleep(200 * time.Millisecond) // the writer has run meanwhile
	p.setCut(false)
	eventually(t, 5*time.Second, "the store up again", a.store.Up)
	c := redis.NewClient(opt)
	defer c.Close()
	key := a.store.ownerKey("resp_out")
	eventually(t, 3*time.Second, "the owner written once Redis answers", func() bool {
		return c.Exists(context.Background(), key).Val() == 1
	})
}
