package fleet

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

const testIdentity = "openai|https://api.example.com/v1|0a1b2c3d4e5f|gpt-test"

// counter is an Observer that counts.
type counter struct {
	mu        sync.Mutex
	errors    map[string]int
	fallbacks map[string]int
	ups       []bool
}

func newCounter() *counter {
	return &counter{errors: map[string]int{}, fallbacks: map[string]int{}}
}

func (c *counter) Error(op string)    { c.mu.Lock(); c.errors[op]++; c.mu.Unlock() }
func (c *counter) Fallback(op string) { c.mu.Lock(); c.fallbacks[op]++; c.mu.Unlock() }
func (c *counter) Up(up bool)         { c.mu.Lock(); c.ups = append(c.ups, up); c.mu.Unlock() }

func (c *counter) count(m map[string]int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

type instance struct {
	store *Store
	state *capacity.State
	logs  *observer.ObservedLogs
	obs   *counter
}

// newInstance is one router instance: a store on url with one deployment
// (testIdentity) bound, declared rpm/tpm as given.
func newInstance(t *testing.T, url string, poll time.Duration, rpm, tpm int64) *instance {
	t.Helper()
	return newInstanceTimeout(t, url, poll, rpm, tpm, 200*time.Millisecond)
}

// newInstanceTimeout is newInstance with the store's Timeout.
func newInstanceTimeout(t *testing.T, url string, poll time.Duration, rpm, tpm int64, timeout time.Duration) *instance {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	in := &instance{state: capacity.NewState(), logs: logs, obs: newCounter()}
	in.state.Declare(rpm, tpm)
	s, err := New(Options{URL: url, KeyPrefix: keyPrefix(t), PollInterval: poll, Timeout: timeout,
		Logger: zap.New(core), Observer: in.obs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.Bind(testIdentity, in.state)
	in.store = s
	return in
}

// waitSubscribed waits until n stores listen to the notification channel.
func waitSubscribed(t *testing.T, url string, n int64) {
	t.Helper()
	opt, _ := redis.ParseURL(url)
	opt.Protocol = 2
	c := redis.NewClient(opt)
	defer c.Close()
	eventually(t, 5*time.Second, "the stores to subscribe", func() bool {
		m, err := c.PubSubNumSub(context.Background(), keyPrefix(t)+"events").Result()
		return err == nil && m[keyPrefix(t)+"events"] >= n
	})
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("expected %s within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// backends runs f against miniredis and a real Redis.
func backends(t *testing.T, f func(t *testing.T, url string, m *miniredis.Miniredis)) {
	t.Run("miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		f(t, "redis://"+m.Addr(), m)
	})
	t.Run("redis-server", func(t *testing.T) {
		f(t, realRedisURL(t), nil)
	})
}

// prefixes keeps each test's keys apart in a Redis shared with other tests
// (and other runs): nothing is ever flushed.
var prefixes sync.Map

func keyPrefix(t *testing.T) string {
	p, _ := prefixes.LoadOrStore(t, fmt.Sprintf("llm_router_test:%d:%s:", time.Now().UnixNano(), t.Name()))
	return p.(string)
}

func rateLimited(retry time.Duration) provider.Observation {
	o := provider.NewObservation(provider.RateLimited)
	o.RetryAfter = retry
	return o
}

// Two instances with a declared rpm of 3 start 3 attempts between them,
// not 3 each; the fleet's window frees a place a minute after its grant's
// use ended.
func TestReserveCountsTheFleet(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Minute, 3, 0), newInstance(t, url, time.Minute, 3, 0)
		now := time.Now()
		for i, in := range []*instance{a, b, a} {
			if !in.state.Acquire(now, 10) {
				t.Fatalf("attempt %d: expected a place in the fleet's window", i+1)
			}
			in.state.Release()
		}
		for _, in := range []*instance{a, b} {
			if in.state.Acquire(now, 10) {
				t.Fatal("expected the fleet's rpm 3 spent after 3 attempts")
			}
			at, why := in.state.AvailableAt(now, 10)
			if at.Sub(now) < 55*time.Second || why != provider.RateLimited {
				t.Errorf("expected the deployment rate-limited for about a minute, got %v (%s)", at.Sub(now), why)
			}
		}
		if m != nil {
			// A grant counts until a minute after its use can end.
			later := 61*time.Second + declaredUse
			m.SetTime(time.Now().Add(later))
			if !b.state.Acquire(now.Add(later), 10) {
				t.Error("expected a place again once the window moved on")
			}
		}
		if n := a.obs.count(a.obs.fallbacks) + b.obs.count(b.obs.fallbacks); n != 0 {
			t.Errorf("expected no local fallback, got %d", n)
		}
	})
}

// The fleet's tpm counts the tokens of every instance's attempts.
func TestReserveCountsTokens(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Minute, 0, 100), newInstance(t, url, time.Minute, 0, 100)
		now := time.Now()
		if !a.state.Acquire(now, 60) {
			t.Fatal("expected 60 of 100 tokens to fit")
		}
		if b.state.Acquire(now, 50) {
			t.Fatal("expected 60 + 50 tokens not to fit a tpm of 100")
		}
		if !a.state.Acquire(now, 40) {
			t.Fatal("expected 60 + 40 tokens to fit a tpm of 100")
		}
	})
}

// A 429 seen by one instance reaches the other by notification, well before
// any poll.
func TestCircuitReachesTheFleetAtOnce(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		waitSubscribed(t, url, 2)
		now := time.Now()
		a.state.Observe(now, rateLimited(30*time.Second), capacity.DefaultPolicy)
		eventually(t, 2*time.Second, "b to learn a's 429", func() bool {
			at, why := b.state.AvailableAt(time.Now(), 0)
			return at.Sub(now) > 25*time.Second && why == provider.RateLimited
		})
		if snap := b.state.Snapshot(time.Now()); snap.Circuit != capacity.Open || snap.OpenReason != provider.RateLimited {
			t.Errorf("expected b's circuit open for rate_limited, got %s %s", snap.Circuit, snap.OpenReason)
		}
		// A success at b closes the circuit everywhere: the newest wins.
		b.state.Observe(time.Now(), provider.NewObservation(provider.OK), capacity.DefaultPolicy)
		eventually(t, 2*time.Second, "a to learn that the circuit closed", func() bool {
			at, _ := a.state.AvailableAt(time.Now(), 0)
			return !at.After(time.Now())
		})
	})
}

// An operator's drain reaches the fleet at once, stays in the store for an
// instance that joins later, and is lifted everywhere by one enable.
func TestDrainReachesTheFleet(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		waitSubscribed(t, url, 2)
		a.state.Disable(time.Now(), true)
		eventually(t, 2*time.Second, "b to learn a's drain", func() bool { return b.state.Snapshot(time.Now()).Disabled })
		if m != nil {
			m.FastForward(time.Hour) // longer than any other part is kept
		}
		c := newInstance(t, url, 20*time.Millisecond, 0, 0)
		eventually(t, 2*time.Second, "a later instance to poll the drain", func() bool { return c.state.Snapshot(time.Now()).Disabled })
		b.state.Disable(time.Now(), false)
		eventually(t, 2*time.Second, "the enable to reach a and c", func() bool {
			return !a.state.Snapshot(time.Now()).Disabled && !c.state.Snapshot(time.Now()).Disabled
		})
		// A disable and an enable in the same instant (one keep-alive
		// connection, within a millisecond) reach the fleet in their order.
		now := time.Now()
		a.state.Disable(now, true)
		a.state.Disable(now, false)
		time.Sleep(100 * time.Millisecond) // both published; the poll merges them
		eventually(t, 2*time.Second, "the enable to win everywhere", func() bool {
			return !a.state.Snapshot(time.Now()).Disabled && !b.state.Snapshot(time.Now()).Disabled && !c.state.Snapshot(time.Now()).Disabled
		})
	})
}

// A window that runs out is notified at once; a remaining count that only
// goes down reaches others by polling.
func TestWindowsReachTheFleet(t *testing.T) {
	m := miniredis.RunT(t)
	url := "redis://" + m.Addr()
	a, b := newInstance(t, url, 50*time.Millisecond, 0, 0), newInstance(t, url, 50*time.Millisecond, 0, 0)
	ok := provider.NewObservation(provider.OK)
	ok.Requests = provider.Window{Limit: 100, Remaining: 40, Reset: 30 * time.Second}
	a.state.Observe(time.Now(), ok, capacity.DefaultPolicy)
	eventually(t, 2*time.Second, "b to poll a's remaining count", func() bool {
		snap := b.state.Snapshot(time.Now())
		return snap.RemainingRequests == 40 && snap.LimitRequests == 100
	})

	c, d := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
	waitSubscribed(t, url, 4)
	spent := provider.NewObservation(provider.OK)
	spent.Tokens = provider.Window{Limit: 1000, Remaining: 0, Reset: 20 * time.Second}
	now := time.Now()
	c.state.Observe(now, spent, capacity.DefaultPolicy)
	eventually(t, 2*time.Second, "d to learn that the token window ran out", func() bool {
		at, _ := d.state.AvailableAt(time.Now(), 10)
		return at.Sub(now) > 15*time.Second
	})
}

// Once a failing deployment's cooldown passes, one instance of the fleet
// probes it; the others wait for the verdict, which reaches them.
func TestHalfOpenProbeOncePerFleet(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Hour, 0, 0), newInstance(t, url, time.Hour, 0, 0)
		waitSubscribed(t, url, 2)
		p := capacity.Policy{BackoffBase: 30 * time.Millisecond, BackoffMax: 30 * time.Millisecond, Long: time.Hour}
		a.state.Observe(time.Now(), provider.NewObservation(provider.Server), p)
		eventually(t, 2*time.Second, "b to learn a's failure", func() bool {
			return b.state.Snapshot(time.Now()).ConsecutiveFailures == 1
		})
		time.Sleep(40 * time.Millisecond)
		now := time.Now()
		if c := b.state.Snapshot(now).Circuit; c != capacity.HalfOpen {
			t.Fatalf("expected b's circuit half-open after the backoff, got %s", c)
		}
		if !a.state.Acquire(now, 0) {
			t.Fatal("expected a to get the probe")
		}
		if b.state.Acquire(now, 0) {
			t.Fatal("expected b refused: a holds the fleet's probe")
		}
		if at, _ := b.state.AvailableAt(now, 0); !at.After(now) {
			t.Error("expected b to wait while a probes")
		}
		a.state.Observe(time.Now(), provider.NewObservation(provider.OK), p)
		a.state.Release()
		eventually(t, 2*time.Second, "b to learn the probe's success", func() bool {
			return b.state.Snapshot(time.Now()).Circuit == capacity.Closed
		})
		if at, _ := b.state.AvailableAt(time.Now(), 0); at.After(time.Now()) {
			t.Error("expected b free to use the deployment once the circuit closed")
		}
		opt, _ := redis.ParseURL(url)
		c := redis.NewClient(opt)
		defer c.Close()
		eventually(t, 2*time.Second, "the probe claim to be freed", func() bool {
			n, err := c.Exists(context.Background(), a.store.bindings[DeploymentID(testIdentity)].probeKey).Result()
			return err == nil && n == 0
		})
	})
}

// Redis down: every decision is local at once, the outage is logged once
// and counted; when Redis is back the instances resynchronize and share
// again.
func TestOutageFallsBackAndResynchronizes(t *testing.T) {
	m := miniredis.RunT(t)
	url := "redis://" + m.Addr()
	a, b := newInstance(t, url, 50*time.Millisecond, 1000, 0), newInstance(t, url, 50*time.Millisecond, 1000, 0)
	eventually(t, 2*time.Second, "both stores up", func() bool { return a.store.Up() && b.store.Up() })
	m.Close()
	for i := 0; i < 50; i++ {
		began := time.Now()
		if !a.state.Acquire(time.Now(), 10) {
			t.Fatal("expected a local decision while Redis is down")
		}
		a.state.Release()
		if took := time.Since(began); took > 300*time.Millisecond {
			t.Fatalf("expected Acquire bounded by the timeout, took %v", took)
		}
	}
	if a.obs.count(a.obs.fallbacks) == 0 || a.obs.count(a.obs.errors) == 0 {
		t.Errorf("expected the outage counted, got errors %v fallbacks %v", a.obs.errors, a.obs.fallbacks)
	}
	// What a learns meanwhile is shared once Redis is back.
	a.state.Observe(time.Now(), rateLimited(30*time.Second), capacity.DefaultPolicy)
	time.Sleep(200 * time.Millisecond)
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	m.FlushAll() // as a restarted Redis without persistence
	eventually(t, 5*time.Second, "both stores up again", func() bool { return a.store.Up() && b.store.Up() })
	eventually(t, 5*time.Second, "b to learn what a learned during the outage", func() bool {
		return b.state.Snapshot(time.Now()).Circuit == capacity.Open
	})
	for _, in := range []*instance{a, b} {
		if n := in.logs.FilterMessageSnippet("unreachable").Len(); n != 1 {
			t.Errorf("expected the outage logged once, got %d", n)
		}
		if n := in.logs.FilterMessageSnippet("reachable again").Len(); n != 1 {
			t.Errorf("expected the return logged once, got %d", n)
		}
	}
}

// A Redis that accepts connections and never answers holds no request
// longer than the timeout, and after the first, none at all.
func TestSlowRedisBoundedByTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	st := capacity.NewState()
	st.Declare(1000, 0)
	obs := newCounter()
	core, logs := observer.New(zapcore.InfoLevel)
	s, err := New(Options{URL: "redis://" + l.Addr().String(), Timeout: 30 * time.Millisecond, PollInterval: time.Hour,
		Logger: zap.New(core), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Bind(testIdentity, st)
	var slowest time.Duration
	for i := 0; i < 20; i++ {
		began := time.Now()
		if !st.Acquire(time.Now(), 1) {
			t.Fatal("expected a local decision when Redis does not answer")
		}
		st.Release()
		slowest = max(slowest, time.Since(began))
	}
	if slowest > 250*time.Millisecond {
		t.Errorf("expected no Acquire much longer than the 30ms timeout, slowest %v", slowest)
	}
	if obs.count(obs.fallbacks) != 20 {
		t.Errorf("expected 20 local fallbacks, got %v", obs.fallbacks)
	}
	if n := logs.FilterMessageSnippet("unreachable").Len(); n != 1 {
		t.Errorf("expected one log line, got %d", n)
	}
}

// A reload binds the states to the new config's store before the old one
// closes: sharing goes on through the new store; the old one's goroutines
// end. Closing the last store leaves a state that still works alone.
func TestReloadSwapsTheStore(t *testing.T) {
	m := miniredis.RunT(t)
	url := "redis://" + m.Addr()
	other := newInstance(t, url, time.Hour, 0, 0)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	st := capacity.NewState()
	st.Declare(5, 0)
	old, err := New(Options{URL: url, KeyPrefix: keyPrefix(t), PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	old.Bind(testIdentity, st)
	next, err := New(Options{URL: url, KeyPrefix: keyPrefix(t), PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	next.Bind(testIdentity, st)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	waitSubscribed(t, url, 2)
	st.Observe(time.Now(), rateLimited(30*time.Second), capacity.DefaultPolicy)
	eventually(t, 2*time.Second, "the other instance to learn the 429 through the new store", func() bool {
		return other.state.Snapshot(time.Now()).Circuit == capacity.Open
	})
	if err := next.Close(); err != nil {
		t.Fatal(err)
	}
	m.Close()
	later := time.Now().Add(31 * time.Second)
	if at, _ := st.AvailableAt(time.Now(), 1); !at.After(later.Add(-2 * time.Second)) {
		t.Error("expected the state to keep its cooldown once unbound")
	}
	if !st.Acquire(later, 1) {
		t.Error("expected the state to work alone once unbound")
	}
	st.Release()
}

// A new state bound to an identity takes the old one's place; an unbound
// state is let go. Only the bound state shares what it learns.
func TestBindReplacesAndUnbindLetsGo(t *testing.T) {
	m := miniredis.RunT(t)
	s, err := New(Options{URL: "redis://" + m.Addr(), KeyPrefix: keyPrefix(t), PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old, st := capacity.NewState(), capacity.NewState()
	s.Bind(testIdentity, old)
	s.Bind(testIdentity, st)
	s.Unbind(testIdentity, old) // no longer bound: leaves st alone
	old.Observe(time.Now(), rateLimited(30*time.Second), capacity.DefaultPolicy)
	time.Sleep(50 * time.Millisecond)
	census := s.prefix + "instances" // the store's own mark (census.go), no state's
	shared := func() []string {
		return slices.DeleteFunc(m.Keys(), func(k string) bool { return k == census })
	}
	if keys := shared(); len(keys) != 0 {
		t.Fatalf("expected the replaced state to share nothing, got %v", keys)
	}
	st.Observe(time.Now(), rateLimited(30*time.Second), capacity.DefaultPolicy)
	eventually(t, 2*time.Second, "the bound state's 429 in Redis", func() bool { return len(shared()) > 0 })
	s.Unbind(testIdentity, st)
	s.mu.Lock()
	n := len(s.bindings)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("expected no binding left, got %d", n)
	}
}

// Keys and values name deployments by a hash: no base URL, no key
// fingerprint, no model name.
func TestKeysHoldNoSecrets(t *testing.T) {
	m := miniredis.RunT(t)
	a := newInstance(t, "redis://"+m.Addr(), time.Hour, 10, 1000)
	a.state.Acquire(time.Now(), 10)
	a.state.Observe(time.Now(), rateLimited(30*time.Second), capacity.DefaultPolicy)
	a.state.Release()
	// Three keys of the deployment's state, the census' key of instances
	// not counted.
	eventually(t, 2*time.Second, "the state written", func() bool {
		n := 0
		for _, k := range m.Keys() {
			if !strings.HasSuffix(k, "instances") {
				n++
			}
		}
		return n >= 3
	})
	for _, k := range m.Keys() {
		for _, secret := range []string{"example.com", "0a1b2c3d4e5f", "gpt-test", "openai"} {
			if strings.Contains(k, secret) {
				t.Errorf("key %q shows %q", k, secret)
			}
		}
		if m.Type(k) == "hash" {
			fields, _ := m.HKeys(k)
			for _, f := range fields {
				if v := m.HGet(k, f); strings.Contains(v, "example.com") || strings.Contains(v, "0a1b2c3d4e5f") {
					t.Errorf("%s %s holds %q", k, f, v)
				}
			}
		}
	}
}

// The state's TTL ends with its last reset: nothing outlives it.
func TestStateExpiresWithItsReset(t *testing.T) {
	m := miniredis.RunT(t)
	a := newInstance(t, "redis://"+m.Addr(), time.Hour, 0, 0)
	a.state.Observe(time.Now(), rateLimited(30*time.Second), capacity.DefaultPolicy)
	key := a.store.bindings[DeploymentID(testIdentity)].stateKey
	eventually(t, 2*time.Second, "the state written", func() bool { return m.Exists(key) })
	if ttl := m.TTL(key); ttl < 25*time.Second || ttl > 31*time.Second {
		t.Errorf("expected the state to expire with the 30 s reset, TTL %v", ttl)
	}
}

func TestDecodeMessageIgnoresGarbage(t *testing.T) {
	for _, payload := range []string{"", "x", "a\nb", "a\nb\nc\t{", "a\nb\nc\t{\"at\":1,\"reason\":\"nope\"}", "a\nb\nz\t{}"} {
		_, _, sh, _ := decodeMessage(payload)
		if !sh.Circuit.At.IsZero() || !sh.Requests.At.IsZero() || !sh.Tokens.At.IsZero() {
			t.Errorf("%q: expected nothing decoded, got %+v", payload, sh)
		}
	}
	_, _, sh, ok := decodeMessage("o\nid\nc\t{\"at\":1700000000000,\"until\":1700000030000,\"reason\":\"rate_limited\",\"failures\":1}")
	if !ok || sh.Circuit.Reason != provider.RateLimited || sh.Circuit.OpenUntil.Sub(sh.Circuit.At) != 30*time.Second {
		t.Errorf("expected a 30 s rate-limit circuit, got %+v", sh.Circuit)
	}
}

// A store that never reached Redis stops its goroutines too.
func TestCloseStopsEverything(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for i := 0; i < 3; i++ {
		s, err := New(Options{URL: "redis://127.0.0.1:1", PollInterval: 10 * time.Millisecond, Timeout: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		st := capacity.NewState()
		s.Bind(testIdentity, st)
		time.Sleep(30 * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "http://h:1", "redis://h:1/notadb"} {
		if _, err := New(Options{URL: u}); err == nil {
			t.Errorf("%q: expected an error", u)
		}
	}
}

// Two instances that both learned a window of 10 requests spend one budget
// between them: 10 attempts in all, not 10 each; the rest wait for the
// reset, after which the window is full again, for the whole fleet.
func TestBudgetIsSpentOncePerFleet(t *testing.T) {
	backends(t, func(t *testing.T, url string, m *miniredis.Miniredis) {
		a, b := newInstance(t, url, time.Minute, 0, 0), newInstance(t, url, time.Minute, 0, 0)
		now := time.Now()
		ok := provider.NewObservation(provider.OK)
		ok.Requests = provider.Window{Limit: 10, Remaining: 10, Reset: 3 * time.Second}
		for _, in := range []*instance{a, b} {
			in.state.Observe(now, ok, capacity.DefaultPolicy)
		}
		took := 0
		for i := range 20 {
			in := []*instance{a, b}[i%2]
			if in.state.Acquire(now, 10) {
				took++
				in.state.Release()
			}
		}
		if took != 10 {
			t.Fatalf("expected 10 attempts from the fleet's budget of 10, got %d", took)
		}
		for _, in := range []*instance{a, b} {
			at, why := in.state.AvailableAt(now, 10)
			if at.Sub(now) < 2*time.Second || why != provider.RateLimited {
				t.Errorf("expected the deployment spent until the reset, got %v (%s)", at.Sub(now), why)
			}
			if r := in.state.Snapshot(now).RemainingRequests; r != 0 {
				t.Errorf("expected each instance to see the fleet's budget (0 left), got %d", r)
			}
		}
		if m != nil {
			return // miniredis' TIME does not follow SetTime inside scripts
		}
		later := now.Add(3*time.Second + capacity.ResetMargin + 100*time.Millisecond)
		time.Sleep(time.Until(later))
		took = 0
		for i := range 20 {
			in := []*instance{a, b}[i%2]
			if in.state.Acquire(later, 10) {
				took++
				in.state.Release()
			}
		}
		if took != 10 {
			t.Errorf("after the reset: expected the fleet's window full again (10), got %d", took)
		}
	})
}
