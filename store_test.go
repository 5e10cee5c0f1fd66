package llmrouter

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/goleak"

	"github.com/llmrouter/caddy-llm-router/internal/capacity"
	"github.com/llmrouter/caddy-llm-router/provider"
)

func TestStoreCaddyfile(t *testing.T) {
	const rest = `
	provider p {
		type openai
		api_key none
		base_url http://127.0.0.1:1/v1
	}
	model m {
		deployment p x
	}
}`
	for _, tc := range []struct {
		name, store, want string
		expect            *StoreConfig
	}{
		{"memory", "store memory", "", &StoreConfig{Type: "memory"}},
		{"redis", "store redis redis://localhost:6379/0", "", &StoreConfig{Type: "redis", URL: "redis://localhost:6379/0"}},
		{"redis options", "store redis redis://h:1 {\n key_prefix x:\n timeout 20ms\n poll_interval 2s\n }", "",
			&StoreConfig{Type: "redis", URL: "redis://h:1", KeyPrefix: "x:", Timeout: 20e6, PollInterval: 2e9}},
		{"unknown store", "store etcd http://h", "unknown store", nil},
		{"redis without url", "store redis", "needs a URL", nil},
		{"memory with options", "store memory {\n timeout 1s\n }", "takes no options", nil},
		{"memory with argument", "store memory x", "wrong argument count", nil},
		{"unknown option", "store redis redis://h:1 {\n colour red\n }", "unknown subdirective colour in store", nil},
		{"duplicate option", "store redis redis://h:1 {\n timeout 1s\n timeout 2s\n }", "duplicate subdirective timeout", nil},
		{"negative timeout", "store redis redis://h:1 {\n timeout -1s\n }", "must not be negative", nil},
		{"duplicate store", "store memory\n store memory", "duplicate subdirective store", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_router {\n " + tc.store + "\n" + rest))
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("expected an error containing %q, got %v", tc.want, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *h.Store != *tc.expect {
				t.Errorf("expected %+v, got %+v", *tc.expect, *h.Store)
			}
		})
	}
}

// A reload binds the kept capacity states to the new config's store before
// the old config's Cleanup closes its own; a reload to `store memory` leaves
// them working alone; no goroutine of a store outlives its config.
func TestStoreProvisionAndReload(t *testing.T) {
	m := miniredis.RunT(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t.Setenv("LLM_ROUTER_TEST_KEY", "sk-from-env")
	t.Setenv("LLM_ROUTER_TEST_REDIS", "redis://"+m.Addr())
	withStore := func(store string) string {
		return strings.Replace(jsonConfig, `"models"`, `"store": `+store+`, "models"`, 1)
	}
	redisStore := `{"type": "redis", "url": "{env.LLM_ROUTER_TEST_REDIS}", "poll_interval": 20000000}`

	first := handlerFromJSON(t, withStore(redisStore))
	if err := first.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	st := first.groups["fast"].Deployments[0].State
	second := handlerFromJSON(t, withStore(redisStore))
	if err := second.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	if first.store == nil || second.store != first.store {
		t.Fatal("expected the reload to keep the store (one connection, from the pool)")
	}
	_ = first.Cleanup()
	if second.groups["fast"].Deployments[0].State != st {
		t.Fatal("expected the state kept across the reload")
	}

	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 30 * time.Second
	st.Observe(time.Now(), rl, capacity.DefaultPolicy)
	waitForKeys(t, m, "the 429 shared through the new config's store")
	for _, k := range m.Keys() {
		if strings.Contains(k, "sk-") || strings.Contains(k, "127.0.0.1") || strings.Contains(k, "m1") {
			t.Errorf("key %q shows the deployment's identity", k)
		}
	}

	third := handlerFromJSON(t, withStore(`{"type": "memory"}`))
	if err := third.Provision(newCaddyContext(t)); err != nil {
		t.Fatal(err)
	}
	_ = second.Cleanup()
	m.Close()
	if at, _ := st.AvailableAt(time.Now(), 0); at.Before(time.Now().Add(25 * time.Second)) {
		t.Error("expected the state to keep its cooldown under store memory")
	}
	_ = third.Cleanup()
}

// A deployment that leaves the config and comes back is shared through the
// store again, with its new state: the store let the old one go.
func TestStoreDeploymentLeavesAndReturns(t *testing.T) {
	m := miniredis.RunT(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	t.Setenv("LLM_ROUTER_TEST_KEY", "sk-from-env")
	t.Setenv("LLM_ROUTER_TEST_REDIS", "redis://"+m.Addr())
	withStore := func(config string) string {
		return strings.Replace(config, `"models"`,
			`"store": {"type": "redis", "url": "{env.LLM_ROUTER_TEST_REDIS}", "poll_interval": 20000000}, "models"`, 1)
	}
	withoutM1 := strings.Replace(jsonConfig, `{"provider": "a", "model": "m1"}, `, "", 1)
	provision := func(config string) *Handler {
		h := handlerFromJSON(t, withStore(config))
		if err := h.Provision(newCaddyContext(t)); err != nil {
			t.Fatal(err)
		}
		return h
	}
	a := provision(jsonConfig)
	gone := a.groups["fast"].Deployments[0].State
	b := provision(withoutM1)
	_ = a.Cleanup()
	c := provision(jsonConfig)
	_ = b.Cleanup()
	defer c.Cleanup()
	back := c.groups["fast"].Deployments[0].State
	if back == gone {
		t.Fatal("expected a new state for the deployment that came back")
	}
	rl := provider.NewObservation(provider.RateLimited)
	rl.RetryAfter = 30 * time.Second
	gone.Observe(time.Now(), rl, capacity.DefaultPolicy)
	time.Sleep(100 * time.Millisecond)
	if keys := sharedKeys(m); len(keys) != 0 {
		t.Fatalf("expected the state that left to share nothing, got keys %v", keys)
	}
	back.Observe(time.Now(), rl, capacity.DefaultPolicy)
	waitForKeys(t, m, "the 429 of the deployment that came back shared through the store")
}

// waitForKeys waits up to 2 s for m to hold a key, failing t with what was
// expected.
func waitForKeys(t *testing.T, m *miniredis.Miniredis, what string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for len(sharedKeys(m)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("expected " + what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sharedKeys returns m's keys but the stores' census marks
// (<prefix>instances: the store's own, no deployment's).
func sharedKeys(m *miniredis.Miniredis) []string {
	return slices.DeleteFunc(m.Keys(), func(k string) bool { return strings.HasSuffix(k, "instances") })
}

func TestStoreLoadErrors(t *testing.T) {
	t.Setenv("LLM_ROUTER_TEST_KEY", "sk-from-env")
	for _, tc := range []struct{ name, store, want string }{
		{"unknown type", `{"type": "etcd"}`, `unknown type "etcd"`},
		{"redis without url", `{"type": "redis"}`, "needs a url"},
		{"unset env", `{"type": "redis", "url": "{env.LLM_ROUTER_TEST_UNSET}"}`, "needs a url"},
		{"bad url", `{"type": "redis", "url": "http://h:1"}`, "redis url"},
		{"memory with url", `{"type": "memory", "url": "redis://h:1"}`, "needs type redis"},
		{"negative timeout", `{"type": "redis", "url": "redis://h:1", "timeout": -1}`, "must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := handlerFromJSON(t, strings.Replace(jsonConfig, `"models"`, `"store": `+tc.store+`, "models"`, 1))
			err := h.Provision(newCaddyContext(t))
			_ = h.Cleanup()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("expected an error containing %q, got %v", tc.want, err)
			}
		})
	}
}
