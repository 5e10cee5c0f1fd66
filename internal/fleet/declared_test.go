package fleet

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
)

// Two instances under a declared rpm of 100,000 and tpm of 10,000,000, at
// 400 attempts a second each: places are granted now and then, not asked
// for each attempt (at most 0.1 Redis commands per attempt).
func TestDeclaredLeasesKeepRedisOffTheRequestPath(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		var hooks []*countHook
		var bs []*binding
		for range 2 {
			in := newInstance(t, url, time.Second, 0, 0)
			h := &countHook{}
			in.store.client.AddHook(h)
			hooks, bs = append(hooks, h), append(bs, in.store.bindings[DeploymentID(testIdentity)])
			eventually(t, 5*time.Second, "the store up", in.store.Up)
		}
		before := hooks[0].n.Load() + hooks[1].n.Load()
		const n = 800
		started := 0
		for i := range n {
			if wait, err := bs[i%2].Reserve(100_000, 10_000_000, 50); err == nil && wait == 0 {
				started++
			}
			time.Sleep(1250 * time.Microsecond)
		}
		cmds := hooks[0].n.Load() + hooks[1].n.Load() - before
		t.Logf("%d Redis commands for %d attempts (%.3f per attempt)", cmds, n, float64(cmds)/n)
		if started != n {
			t.Errorf("expected all %d attempts started under rpm 100000, got %d", n, started)
		}
		if per := float64(cmds) / n; per > 0.1 {
			t.Errorf("expected at most 0.1 Redis commands per attempt, got %.3f (%d for %d)", per, cmds, n)
		}
	})
}

// Eight instances at once, each starting attempts as fast as it can under
// one declared rpm of 300: the grants never add up to more than the
// minute holds (at most 300 started in all), and what a grant did not use
// goes back once its use ends, so that the fleet starts all 300. (A real
// Redis only: miniredis runs one script at a time, slowly, and 8 stores'
// calls time out on it on a loaded machine.)
func TestDeclaredLeasesNeverExceedTheMinute(t *testing.T) {
	url := realRedisURL(t)
	{
		bs := patientBindings(t, url, 8)
		var started atomic.Int64
		var wg sync.WaitGroup
		stop := time.Now().Add(declaredUse + time.Second)
		for _, b := range bs {
			for range 4 {
				wg.Go(func() {
					for time.Now().Before(stop) {
						wait, err := b.Reserve(300, 0, 1)
						switch {
						case err != nil:
							t.Errorf("reserve: %v", err)
							return
						case wait == 0:
							started.Add(1)
						default: // as a State does: not asked again before the wait
							time.Sleep(min(wait, time.Until(stop)))
						}
						time.Sleep(2 * time.Millisecond)
					}
				})
			}
		}
		wg.Wait()
		if got := started.Load(); got != 300 {
			t.Errorf("expected exactly the minute's 300 started by the fleet, got %d", got)
		}
	}
}

// patientBindings binds testIdentity on n stores whose timeout a loaded
// machine does not reach (2 s): for tests of what the fleet grants, not of
// a slow Redis.
func patientBindings(t *testing.T, url string, n int) []*binding {
	t.Helper()
	var bs []*binding
	for range n {
		s, err := New(Options{URL: url, KeyPrefix: keyPrefix(t), PollInterval: time.Second, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		s.Bind(testIdentity, capacity.NewState())
		bs = append(bs, s.bindings[DeploymentID(testIdentity)])
		eventually(t, 5*time.Second, "the store up", s.Up)
	}
	return bs
}
