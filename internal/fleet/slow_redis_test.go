package fleet

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// lateHook answers every command late: Redis runs it, and its reply
// arrives from least to most after it (uniformly), or not within the
// caller's deadline (a timeout, as a late reply on a real connection).
type lateHook struct{ least, most time.Duration }

func (h lateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h lateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		return h.late(ctx, cmd, err)
	}
}
func (h lateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			err = h.late(ctx, c, err)
		}
		return err
	}
}

func (h lateHook) late(ctx context.Context, cmd redis.Cmder, err error) error {
	d := h.least + rand.N(h.most-h.least+1)
	select {
	case <-time.After(d):
		return err
	case <-ctx.Done():
		cmd.SetErr(ctx.Err())
		return ctx.Err()
	}
}

// lateReplies are the late Redis of the late-Redis tests: every reply
// 0.8 to 1.2 timeouts after its call (some in time, some not), or 0.5 to
// 0.9 (all in time, all late).
var lateReplies = map[string]lateHook{
	"around timeout": {4 * stallTimeout / 5, 6 * stallTimeout / 5},
	"within timeout": {stallTimeout / 2, 9 * stallTimeout / 10},
}

// lateBinding is a deployment's binding on a real Redis whose replies h
// delays, with the store's timeout stallTimeout.
func lateBinding(t *testing.T, h lateHook) *binding {
	t.Helper()
	b := patientBindings(t, realRedisURL(t), 1)[0]
	b.s.timeout = stallTimeout
	b.s.client.AddHook(h)
	return b
}

// decided calls call, trying again after each wait it tells (as a State
// does), until it tells none or fails (decided on local state), within
// 3 s; it adds the time spent in it to at.
func decided(call func() (time.Duration, error), at *time.Duration) bool {
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		start := time.Now()
		wait, err := call()
		*at += time.Since(start)

		if err != nil || wait == 0 {
			return true
		}
		time.Sleep(wait)
	}
	return false
}

// A Redis that answers every call late, about the store's timeout (each
// reply 0.8 to 1.2 timeouts after its call, or 0.5 to 0.9: some calls
// answer within it, others not, and the store takes it for load: it
// stays up): 16 requests at once, each trying again after the wait it is
// told (as a State does) until its budget (a stated window) and its
// declared rpm are decided, each waits on Redis one timeout and slack at
// most in all for its attempt's decisions (1.5 timeouts); then it spends
// from its slice or places (renewed in the background) or waits in its
// queue, not on Redis. Each try waited up to a timeout on Redis before,
// and the attempt tried again: 100-120 ms for some requests.
func TestALateRedisHoldsNoRequestPastTimeout(t *testing.T) {
	for name, h := range lateReplies {
		t.Run(name, func(t *testing.T) {
			b := lateBinding(t, h)
			bu := capacity.Budget{Requests: statedWindow(1000, 30*time.Second), Tokens: capacity.BudgetWindow{Limit: -1}}
			spend := func() (time.Duration, error) { wait, _, err := b.Spend(bu); return wait, err }
			reserve := func() (time.Duration, error) { return b.Reserve(100_000, 0, 0) }
			atStore := make([]time.Duration, 32)
			var wg sync.WaitGroup
			for i := range atStore {
				wg.Go(func() {
					// Each decision as a State asks it: the budget, then the declared rpm.
					for _, call := range []func() (time.Duration, error){spend, reserve} {
						if !decided(call, &atStore[i]) {
							t.Errorf("request %d: not decided within 3 s", i)
						}
					}
				})
			}
			wg.Wait()
			t.Logf("longest time at the store for one request: %v (timeout %v)", slices.Max(atStore), stallTimeout)
			for i, d := range atStore {
				if d > stallTimeout+35*time.Millisecond {
					t.Errorf("request %d waited %v on Redis in all for its attempt (timeout %v)", i, d, stallTimeout)
				}
			}
		})
	}
}
